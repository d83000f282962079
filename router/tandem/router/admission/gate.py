"""The admission gate: every generation request waits here for a unit of decode capacity.

`AdmissionGate.admit(request)` returns a `Grant` once the request may be dispatched, or raises
`Overloaded` (429). The rules (saturation, capacity, deadlines, early rejection, Retry-After) are the
pure functions of `tandem.router.admission.policy`; the order among waiting requests is the fair
queue's (`VTCQueue`, or `FCFSQueue` as a baseline). The gate itself only keeps the books:

- `admit`: with capacity free and nobody waiting, the request goes at once (its tenant's counter is
  charged as if it had been queued and popped; no prediction is made: the engines have room, and a
  gateway that rejects what its engines could start now would only lose requests). Otherwise: reject
  early when the predictor says the TTFT objective is already out of reach; queue the request (the
  tenant's counter is lifted if it just became backlogged); `pump`; then wait until the request is
  granted, its deadline passes (429 `deadline`), or the client leaves (ticket withdrawn, nothing
  charged). A request that cannot be dispatched at once while `max_queue` others wait → 429
  `queue_full`. With no decode endpoint in rotation at all, a new request is not queued: it goes on
  at once and the dispatcher answers 503 as before.
- `pump`: while some capacity is free (`admitted < capacity()`), pop the next request in fair order
  (which charges `input_weight × prompt tokens` to its tenant) and grant it. It runs when a request
  arrives, when a grant is released (an upstream request ended, so capacity freed), and every
  `poll_s` while requests wait (capacity can also return without an event: an endpoint back from
  cool-down, a new endpoint discovered).
- `Grant.charge_output(n)` charges generated tokens as they stream; `Grant.settle(usage)` corrects
  both charges with the engine's usage; `Grant.release()` (idempotent) frees the capacity.

Single-threaded: everything runs on the router's event loop. Times come from the injected clock;
waiting itself uses the loop's timers, capped at `poll_s` per wait, so a fake clock is noticed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tandem.router.admission.fairness.vtc import QueueFull, Ticket, VTCQueue
from tandem.router.admission.metrics import AdmissionMetrics
from tandem.router.admission.policy import (
    DrainMeter,
    TTFTPredictor,
    queue_deadline,
    retry_after_seconds,
    slo_out_of_reach,
)
from tandem.router.errors import Overloaded
from tandem.router.scheduling.base import Routable
from tandem.router.types import SLO, EndpointSnapshot, Usage

_MESSAGES = {
    "queue_full": "the router's queue is full ({queued} requests waiting); retry later",
    "deadline": "no engine could start the request within {budget:g}s (its time to first token "
    "objective or the router's queue limit); retry later",
    "slo": "the predicted time to first token ({predicted:.3g}s) exceeds the {left:.3g}s left to the "
    "request's objective on every engine; retry later",
}


class Admittable(Routable, Protocol):
    """A request as admission reads it: a `Routable` with its tenant and priority band."""

    @property
    def tenant(self) -> str: ...

    @property
    def priority(self) -> int: ...


@dataclass(eq=False)
class Waiter:
    """A request waiting in the queue (the fair queue's item)."""

    request: Admittable
    slo: SLO
    arrived: float
    deadline: float
    future: asyncio.Future[Grant]
    ticket: Ticket[Waiter] | None = field(default=None)


#: Streamed tokens counted in `tandem_router_tenant_served_tokens_total` at least this often.
SERVED_BATCH = 32


class Grant:
    """An admitted request's hold on one unit of decode capacity, and its tenant's charges.

    Streamed output is charged to the tenant's counter token by token (the fair queue's order must
    see it at once); the served-tokens metric is told in batches of `SERVED_BATCH`, and the rest
    when the grant is settled or released (it runs per streamed chunk, and metrics cost more)."""

    __slots__ = (
        "_charged",
        "_gate",
        "_released",
        "_unreported",
        "completion_tokens",
        "prompt_tokens",
        "queued_s",
        "tenant",
    )

    def __init__(self, gate: AdmissionGate, *, tenant: str, prompt_tokens: int, charged: bool) -> None:
        self.tenant = tenant
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.queued_s = 0.0  # clock seconds spent waiting in the queue
        self._gate = gate
        self._charged = charged
        self._released = False
        self._unreported = 0

    def charge_output(self, tokens: int) -> None:
        """Charge `tokens` generated tokens (as they stream back)."""
        if tokens > 0:
            self.completion_tokens += tokens
            self._gate.queue.charge_output(self.tenant, tokens)
            self._unreported += tokens
            if self._unreported >= SERVED_BATCH:
                self._report()

    def _report(self) -> None:
        if self._unreported:
            self._gate.count_served(self.tenant, completion=self._unreported)
            self._unreported = 0

    def settle(self, usage: Usage | None) -> None:
        """Correct the charges with the engine's usage (prompt estimate, streamed token count)."""
        if usage is None:
            return
        self._report()
        if usage.prompt_tokens is not None and self._charged:
            delta, self.prompt_tokens = usage.prompt_tokens - self.prompt_tokens, usage.prompt_tokens
            self._gate.charge(self.tenant, prompt=delta)
        if usage.completion_tokens is not None:
            delta = usage.completion_tokens - self.completion_tokens
            self.completion_tokens = usage.completion_tokens
            self._gate.charge(self.tenant, completion=delta)

    def release(self) -> None:
        """The request is over (answered, failed or abandoned); idempotent."""
        if not self._released:
            self._released = True
            self._report()
            self._gate.released()


class AdmissionGate:
    """See the module docstring. `capacity()`: how many admitted requests the decode pool holds now
    (`policy.pool_capacity`), None when no decode endpoint is in rotation. `candidates()`: the decode
    endpoints the predictor judges."""

    def __init__(
        self,
        *,
        queue: VTCQueue[Waiter],
        max_queue: int,
        capacity: Callable[[], int | None],
        candidates: Callable[[], Sequence[EndpointSnapshot]],
        predictor: TTFTPredictor,
        metrics: AdmissionMetrics,
        clock: Callable[[], float],
        max_queue_wait_s: float,
        poll_s: float = 0.25,
    ) -> None:
        self.queue = queue
        self.max_queue = max_queue
        self._capacity = capacity
        self._candidates = candidates
        self._predictor = predictor
        self._metrics = metrics
        self._clock = clock
        self._max_wait = max_queue_wait_s
        self._poll_s = poll_s
        self._drain = DrainMeter()
        self.admitted = 0

    def capacity(self) -> int | None:
        return self._capacity()

    async def admit(self, request: Admittable) -> Grant:
        """Wait for dispatch capacity; raises `Overloaded` (429). Cancelling the caller withdraws
        the request without charging it."""
        now = self._clock()
        slo = request.slo
        self._metrics.seen(request.tenant)
        capacity = self._capacity()
        if capacity is None:
            self.admitted += 1
            return Grant(self, tenant=request.tenant, prompt_tokens=0, charged=False)
        if not len(self.queue) and self.admitted < capacity:
            return self._pass_through(request, now=now)  # room now, nobody ahead: no wait, no verdict
        predicted = self._predictor.predicted_ttft(request, self._candidates())
        if slo_out_of_reach(predicted, time_left_s=slo.ttft_s):
            raise self._overloaded("slo", predicted=predicted, left=slo.ttft_s)
        waiter = Waiter(
            request=request,
            slo=slo,
            arrived=now,
            deadline=queue_deadline(arrived=now, ttft_slo_s=slo.ttft_s, max_queue_wait_s=self._max_wait),
            future=asyncio.get_running_loop().create_future(),
        )
        try:
            waiter.ticket = self.queue.push(
                waiter,
                tenant=request.tenant,
                prompt_tokens=request.prompt_length(),
                priority=request.priority,
            )
        except QueueFull:
            raise self._overloaded("queue_full", queued=len(self.queue)) from None
        self.pump()
        if not waiter.future.done() and len(self.queue) > self.max_queue:
            self._reject(waiter, self._overloaded("queue_full", queued=len(self.queue) - 1))
        return await self._wait(waiter)

    def pump(self) -> None:
        """Grant waiting requests in fair order while capacity is free (module docstring)."""
        now = self._clock()
        while (ticket := self.queue.peek()) is not None:
            waiter = ticket.item
            if now >= waiter.deadline:
                self._reject(waiter, self._overloaded("deadline", budget=waiter.deadline - waiter.arrived))
                continue
            if self.admitted >= (self._capacity() or 0):
                return
            left = waiter.arrived + waiter.slo.ttft_s - now
            predicted = self._predictor.predicted_ttft(waiter.request, self._candidates())
            if slo_out_of_reach(predicted, time_left_s=left):
                self._reject(waiter, self._overloaded("slo", predicted=predicted, left=left))
                continue
            self.queue.pop()
            self._grant(waiter, now=now)

    def charge(self, tenant: str, *, prompt: int = 0, completion: int = 0) -> None:
        """Charge a tenant's counter and count its served tokens (corrections may be negative)."""
        if prompt:
            self.queue.charge_input(tenant, prompt)
        if completion:
            self.queue.charge_output(tenant, completion)
        self._metrics.served(tenant, prompt=prompt, completion=completion)

    def count_served(self, tenant: str, *, completion: int) -> None:
        """Count output tokens already charged to the counter (a `Grant`'s batched report)."""
        self._metrics.served(tenant, completion=completion)

    def released(self) -> None:
        self.admitted -= 1
        self.pump()

    def _grant(self, waiter: Waiter, *, now: float) -> None:
        request = waiter.request
        prompt_tokens = request.prompt_length()
        self.admitted += 1
        self._drain.record(now)
        self._metrics.served(request.tenant, prompt=prompt_tokens)
        self._metrics.waited(now - waiter.arrived, outcome="dispatched")
        grant = Grant(self, tenant=request.tenant, prompt_tokens=prompt_tokens, charged=True)
        grant.queued_s = now - waiter.arrived
        waiter.future.set_result(grant)

    def _pass_through(self, request: Admittable, *, now: float) -> Grant:
        prompt_tokens = request.prompt_length()
        self.queue.pass_through(tenant=request.tenant, prompt_tokens=prompt_tokens)
        self.admitted += 1
        self._drain.record(now)
        self._metrics.served(request.tenant, prompt=prompt_tokens)
        self._metrics.waited(0.0, outcome="dispatched")
        return Grant(self, tenant=request.tenant, prompt_tokens=prompt_tokens, charged=True)

    def _reject(self, waiter: Waiter, error: Overloaded) -> None:
        if waiter.ticket is not None:
            self.queue.cancel(waiter.ticket)
        self._metrics.waited(self._clock() - waiter.arrived, outcome="rejected")
        waiter.future.set_exception(error)

    def _overloaded(self, reason: str, **facts: float | int | None) -> Overloaded:
        self._metrics.rejected(reason)
        retry = retry_after_seconds(queued=len(self.queue), drain_per_s=self._drain.rate(self._clock()))
        return Overloaded(_MESSAGES[reason].format(**facts), reason=reason, retry_after_s=retry)

    async def _wait(self, waiter: Waiter) -> Grant:
        future = waiter.future
        try:
            while not future.done():
                left = waiter.deadline - self._clock()
                if left <= 0:
                    self.pump()  # rejects it if still waiting at the head; else reject it here
                    if not future.done():
                        budget = waiter.deadline - waiter.arrived
                        self._reject(waiter, self._overloaded("deadline", budget=budget))
                    break
                await asyncio.wait({future}, timeout=min(left, self._poll_s))
                if not future.done():
                    self.pump()
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        return future.result()

    def _abandon(self, waiter: Waiter) -> None:
        """The caller is gone (client disconnected): withdraw it, or free what it was granted."""
        future = waiter.future
        if not future.done():
            if waiter.ticket is not None:
                self.queue.cancel(waiter.ticket)
            self._metrics.waited(self._clock() - waiter.arrived, outcome="cancelled")
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            future.result().release()
