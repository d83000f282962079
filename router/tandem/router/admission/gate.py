"""The admission gate: every generation request waits here for a unit of decode capacity.

`AdmissionGate.admit(request)` returns a `Grant` once the request may be dispatched, or raises
`Overloaded` (429). The rules (capacity, budgets, honest early rejection, Retry-After) are the pure
functions of `tandem.router.admission.policy`; the order among waiting requests, what is ahead of a
new one and whom a full queue pushes out are the fair queue's (`VTCQueue`, or `FCFSQueue` as a
baseline). The gate itself only keeps the books:

- `admit`: with capacity free and nobody waiting, the request goes at once (its tenant's counter is
  charged as if it had been queued and popped; no prediction is made: the engines have room, and a
  gateway that rejects what its engines could start now would only lose requests). Otherwise it must
  wait, and is refused at once (429 `deadline`, or `slo` when the predicted engine time tips it) only
  if the wait ahead of it at the measured drain rate cannot fit its budget (its own `x-slo-ttft-ms`
  deadline, capped by `max_queue_wait`); a full queue (`max_queue` waiting) pushes out the newest
  request of a tenant over its share of the queue (429 `pushed_out` to that one) or refuses the
  newcomer (429 `queue_full`). Then it waits until granted, until its budget runs out (429
  `deadline`), or until the client leaves (the disconnect cancels the caller: the ticket is withdrawn
  at once, nothing charged). With no decode endpoint in rotation at all, a new request is not
  queued: it goes on at once and the dispatcher answers 503 as before. (A decode pool with no
  member at all, scaled to zero, is met before the gate: the `Hold` stage holds the request until
  the pool's first engine is listed, `tandem.router.admission.coldstart`; so this 503 is for members
  all out of rotation after failures, or for holding turned off, `maxHeldRequests: 0`.)
- `pump`: while some capacity is free (`admitted < capacity()`), pop the next request in fair order
  (which charges `input_weight × prompt tokens` to its tenant) and grant it; a request whose budget
  has passed, or whose own deadline the predicted engine time no longer fits, is refused instead.
  It runs when a request arrives, when a grant is released (an upstream request ended, so capacity
  freed), and every `poll_s` while requests wait (capacity can also return without an event: an
  endpoint back from cool-down, a new endpoint discovered). Every change of the backlog ticks the
  `DrainMeter` (dispatches per second of backlog), and every capacity given back the `HoldMeter`
  (how long a grant held it); the measured rate, raised to the pool's own `capacity / mean hold`
  (`policy.drain_estimate`), prices the wait and `Retry-After`.
- **Pre-emption** (`preemption` on): a request that must wait, its tenant's only one waiting and
  within its share of the running slots, may take the slot of a running stream of a tenant a whole
  slot over its share (`tandem.router.admission.preemption` says when and whose): the stream's
  grant gives up its capacity to the newcomer, which is granted at once,
  and the stream is stopped through `Grant.preempt` (set by the relay while it can be continued).
  Its continuation waits in `resume`: at the front of its tenant's requests, no prompt charged, never
  refused for a full queue. With `swap`, the newcomer's grant names the decode engine of the stream
  it stopped (`Grant.stopped_on`, `tandem.router.pd.disagg`, "The swap").
- **Prefill ahead** (`ahead`: a limit read at each pump; `tandem.router.pd.ahead`): with no capacity
  free, the next requests in fair order with work to do before their grant (`admit(on_ahead=)`: a
  prefill elsewhere) leave the queue up to the limit, charged as at a grant, and are granted before
  it when capacity frees. A pre-empting one is taken from them; one its client leaves keeps its charge.
- `Grant.charge_output(n)` charges generated tokens as they stream; `Grant.settle(usage)` corrects
  both charges with the engine's usage; `Grant.release()` (idempotent) frees the capacity.

Single-threaded: everything runs on the router's event loop. Times come from the injected clock;
waiting uses the loop's timers: one per waiter for its deadline, and one gate-wide poll every
`poll_s` while anyone waits (so a fake clock is noticed, and capacity that returns without an event).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

from tandem.router.admission.fairness.vtc import QueueFull, VTCQueue
from tandem.router.admission.grant import Grant
from tandem.router.admission.metrics import AdmissionMetrics
from tandem.router.admission.policy import (
    REFUSALS,
    DrainMeter,
    HoldMeter,
    TTFTPredictor,
    drain_estimate,
    expected_wait,
    pool_drain_rate,
    queue_budget,
    retry_after_seconds,
    wait_out_of_reach,
)
from tandem.router.admission.preemption import victim
from tandem.router.admission.waiter import Admittable, Resumed, Waiter
from tandem.router.errors import Overloaded
from tandem.router.types import EndpointSnapshot

__all__ = ["AdmissionGate", "Admittable", "Waiter"]


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
        preemption: bool = False,
        swap: bool = False,
        ahead: Callable[[int], int] | None = None,
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
        self._hold = HoldMeter()
        self.admitted = 0
        self.preemption = preemption
        #: A pre-empting grant names the engine of the stream it stopped (`Grant.stopped_on`).
        self.swap = swap
        self.running: set[Grant] = set()  # granted and holding their capacity (not handed over)
        #: How many requests may be taken ahead at a capacity ("Prefill ahead"; None: none).
        self._ahead = ahead
        self._ready: dict[Waiter, None] = {}  # taken ahead, in fair order, waiting for a slot
        self._waiting: set[Waiter] = set()
        self._poll_handle: asyncio.TimerHandle | None = None

    def capacity(self) -> int | None:
        return self._capacity()

    @property
    def ready(self) -> int:
        """Requests taken out of the queue ahead of capacity, waiting for a slot ("Prefill ahead")."""
        return len(self._ready)

    async def admit(self, request: Admittable, *, on_ahead: Callable[[], None] | None = None) -> Grant:
        """Wait for dispatch capacity; raises `Overloaded` (429). Cancelling the caller withdraws
        the request without charging it (but for one taken ahead: its prompt was charged then).
        `on_ahead`: called if the request is taken ahead of capacity ("Prefill ahead")."""
        now = self._clock()
        self._metrics.seen(request.tenant)
        capacity = self._capacity()
        if capacity is None:  # members all out of rotation (or none, holding off): the dispatcher's 503
            self.admitted += 1
            return Grant(self, tenant=request.tenant, prompt_tokens=0, charged=False)
        if self.admitted < capacity:
            if not len(self.queue) and not self._ready:
                return self._pass_through(request, now=now)  # room now, nobody ahead: no wait, no verdict
            self.pump()  # capacity came back without an event: serve those ahead first
        tenant, priority = request.tenant, request.priority
        ahead = self.queue.ahead(tenant=tenant, priority=priority) + len(self._ready)
        budget = queue_budget(deadline_s=request.deadline_s, max_queue_wait_s=self._max_wait)
        drain = self._drain_rate(now, capacity)
        wait = expected_wait(ahead=ahead, drain_per_s=drain)
        predicted = (
            self._predictor.predicted_ttft(request, self._candidates())
            if request.deadline_s is not None
            else None
        )
        if wait_out_of_reach(wait, predicted, budget_s=budget):
            reason = "deadline" if wait is not None and wait > budget else "slo"
            raise self._overloaded(
                reason,
                ahead=ahead,
                wait=wait or 0.0,
                predicted=predicted or 0.0,
                budget=budget,
                drain=drain,
            )
        if len(self.queue) >= self.max_queue:
            victim = self.queue.displaceable(tenant=tenant, priority=priority)
            if victim is None:
                raise self._overloaded("queue_full", ahead=len(self.queue), queued=len(self.queue))
            pushed = victim.item
            self._reject(
                pushed, self._overloaded("pushed_out", ahead=len(self.queue), queued=len(self.queue))
            )
        try:
            waiter = self._enqueue(
                request, now=now, budget=budget, prompt_tokens=request.prompt_size(), on_ahead=on_ahead
            )
        except QueueFull:
            raise self._overloaded("queue_full", ahead=len(self.queue), queued=len(self.queue)) from None
        if self.preemption and not waiter.future.done():
            self._preempt_for(waiter)
        try:
            return await self._wait(waiter)
        finally:
            del waiter  # a refusal's traceback holds this frame (`_wait`)

    async def resume(self, *, tenant: str, priority: int, prompt_tokens: int | None = None) -> Grant:
        """Capacity for a request that already had its turn: a pre-empted stream's continuation
        (`preemption`), or a request recalled from an engine's queue (`prompt_tokens`: what its
        first grant charged for its prompt). It waits at the front of its tenant's requests, its
        prompt is not charged again (a continuation's grant charges no prompt at all; a recalled
        one's corrects the first charge with the engine's usage), and it is never refused: not for a
        full queue, not for waiting long (its tenant's turn comes; the client may leave). A recalled
        request may pre-empt as a newcomer may (`preemption`); a continuation never does, or streams
        would take slots from each other by turns."""
        now = self._clock()
        request = Resumed(tenant=tenant, priority=priority)
        capacity = self._capacity()
        if capacity is None:  # none in rotation: the dispatcher's 503 ends the stream
            self.admitted += 1
            grant = Grant(self, tenant=tenant, prompt_tokens=0, charged=False, priority=priority)
        elif self.admitted < capacity and not len(self.queue) and not self._ready:
            grant = self._pass_through(request, now=now)
        else:
            waiter = self._enqueue(request, now=now, budget=math.inf, prompt_tokens=0, front=True)
            if self.preemption and prompt_tokens is not None and not waiter.future.done():
                self._preempt_for(
                    waiter
                )  # recalled: it may take a slot as a newcomer may (not a continuation)
            try:
                grant = await self._wait(waiter)
            finally:
                del waiter  # see `admit`
        grant.recharge(prompt_tokens)
        return grant

    def _enqueue(
        self,
        request: Admittable,
        *,
        now: float,
        budget: float,
        prompt_tokens: int,
        front: bool = False,
        on_ahead: Callable[[], None] | None = None,
    ) -> Waiter:
        """Queue `request` (raises `QueueFull`, never for `front`) and serve what capacity allows."""
        waiter = Waiter(
            request=request,
            arrived=now,
            deadline=now + budget,
            future=asyncio.get_running_loop().create_future(),
            on_ahead=on_ahead,
        )
        waiter.ticket = self.queue.push(
            waiter, tenant=request.tenant, prompt_tokens=prompt_tokens, priority=request.priority, front=front
        )
        self._drain.tick(now, waiting=True)
        self.pump()
        return waiter

    def _preempt_for(self, waiter: Waiter) -> None:
        """Serve `waiter` at once in a slot taken from a running stream, when the rule of
        `tandem.router.admission.preemption` names one."""
        request = waiter.request
        chosen = victim(
            self.running,
            tenant=request.tenant,
            priority=request.priority,
            capacity=self._capacity() or 0,
            weight=self.queue.weight,
            waiting=self._tenant_waiting,
        )
        ready = waiter in self._ready
        if chosen is None or (waiter.ticket is None and not ready):
            return
        stop = chosen.give_up()
        self.admitted -= 1  # its unit of capacity goes to the waiter
        if ready:
            del self._ready[waiter]  # taken ahead: charged then
        elif waiter.ticket is not None:
            self.queue.take(waiter.ticket)
        self._grant(waiter, now=self._clock())
        granted = waiter.future.result()
        granted.preempting, granted.stopped_on = True, chosen.at if self.swap else None
        self._metrics.preempted(chosen.tenant)
        if stop is not None:
            stop()

    def pump(self) -> None:
        """Grant waiting requests in fair order while capacity is free, those taken ahead first;
        with none free, take requests ahead (module docstring)."""
        now = self._clock()
        capacity = self._capacity() or 0
        dispatched = 0
        while self._ready and self.admitted < capacity:
            waiter = next(iter(self._ready))
            del self._ready[waiter]
            self._grant(waiter, now=now)
            dispatched += 1
        while (ticket := self.queue.peek()) is not None:
            waiter = ticket.item
            if now >= waiter.deadline:
                self._reject(waiter, self._late(waiter))
                continue
            if self.admitted >= capacity:
                self._take_ahead(now, capacity)
                break
            if waiter.request.deadline_s is not None and self._predicted_late(waiter, now=now):
                continue
            self.queue.pop()
            self._grant(waiter, now=now)
            dispatched += 1
        self._drain.tick(now, waiting=self._backlogged, dispatched=dispatched)

    def _take_ahead(self, now: float, capacity: int) -> None:
        """With no capacity free: the next requests in fair order that have something to do before
        their grant (`Waiter.on_ahead`) leave the queue for `_ready`, up to the limit, charged as
        they would be at their grant; a request without it stops the taking (order is kept)."""
        limit = self._ahead(capacity) if self._ahead is not None else 0
        while len(self._ready) < limit and (ticket := self.queue.peek()) is not None:
            waiter = ticket.item
            if waiter.on_ahead is None or now >= waiter.deadline:
                return
            if waiter.request.deadline_s is not None and self._predicted_late(waiter, now=now):
                continue
            self.queue.pop()
            waiter.ticket = None
            self._ready[waiter] = None
            waiter.on_ahead()

    def _tenant_waiting(self, tenant: str) -> int:
        """A tenant's requests waiting: in the queue, and taken ahead."""
        return self.queue.waiting(tenant) + sum(w.request.tenant == tenant for w in self._ready)

    @property
    def _backlogged(self) -> bool:
        return bool(len(self.queue) or self._ready)

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

    def released(self, granted_at: float | None = None) -> None:
        """A unit of capacity came back (`granted_at`: when its grant took it, None for one that
        took none): count how long it was held, and serve the queue."""
        self.admitted -= 1
        if granted_at is not None:
            now = self._clock()
            self._hold.observe(now, now - granted_at)
        self.pump()

    def drain_readings(self) -> dict[str, float | None]:
        """The drain rate's readings now (the gauge `tandem_router_queue_drain_per_second`)."""
        measured, pool = self._readings(self._clock(), self._capacity())
        return {"measured": measured, "pool": pool, "priced": drain_estimate(measured, pool)}

    def _drain_rate(self, now: float, capacity: int | None) -> float | None:
        """The rate the queue is priced at: measured, raised to the pool's own (`drain_estimate`)."""
        return drain_estimate(*self._readings(now, capacity))

    def _readings(self, now: float, capacity: int | None) -> tuple[float | None, float | None]:
        """The measured drain rate and the pool's own (Little's law), each None while unknown."""
        pool = pool_drain_rate(capacity=capacity, mean_hold_s=self._hold.mean(now))
        return self._drain.rate(now), pool

    def _grant(self, waiter: Waiter, *, now: float) -> None:
        grant = self._take(waiter.request, now=now, waited_s=now - waiter.arrived)
        waiter.future.set_result(grant)

    def _pass_through(self, request: Admittable, *, now: float) -> Grant:
        self.queue.pass_through(tenant=request.tenant, prompt_tokens=request.prompt_size())
        return self._take(request, now=now, waited_s=0.0)

    def _take(self, request: Admittable, *, now: float, waited_s: float) -> Grant:
        """A unit of capacity for `request` from now on: counted, its prompt served, held."""
        prompt_tokens = request.prompt_size()
        self.admitted += 1
        self._metrics.served(request.tenant, prompt=prompt_tokens)
        self._metrics.waited(waited_s, outcome="dispatched")
        grant = Grant(
            self,
            tenant=request.tenant,
            prompt_tokens=prompt_tokens,
            charged=True,
            priority=request.priority,
            granted_at=now,
        )
        grant.queued_s = waited_s
        self.running.add(grant)
        return grant

    def _reject(self, waiter: Waiter, error: Overloaded) -> None:
        if waiter.ticket is not None:
            self.queue.cancel(waiter.ticket)
        self._ready.pop(waiter, None)
        self._drain.tick(self._clock(), waiting=self._backlogged)
        self._metrics.waited(self._clock() - waiter.arrived, outcome="rejected")
        waiter.future.set_exception(error)

    def _predicted_late(self, waiter: Waiter, *, now: float) -> bool:
        """At dispatch, a request with a deadline of its own whose predicted time to first token no
        longer fits what is left of it is refused rather than sent to answer late."""
        left = waiter.deadline - now
        predicted = self._predictor.predicted_ttft(waiter.request, self._candidates())
        if not wait_out_of_reach(None, predicted, budget_s=left):
            return False
        budget = waiter.deadline - waiter.arrived
        refusal = self._overloaded(
            "slo", ahead=0, wait=now - waiter.arrived, predicted=predicted or 0.0, budget=budget
        )
        self._reject(waiter, refusal)
        return True

    def _late(self, waiter: Waiter) -> Overloaded:
        return self._overloaded(
            "deadline",
            ahead=0,
            wait=self._clock() - waiter.arrived,
            predicted=0.0,
            budget=waiter.deadline - waiter.arrived,
            message="late",
        )

    def _overloaded(
        self,
        reason: str,
        *,
        ahead: int,
        message: str | None = None,
        drain: float | None = None,
        **facts: float | int,
    ) -> Overloaded:
        """A 429 counted under `reason`, worded by `REFUSALS[message or reason]` from `facts`;
        `Retry-After` from `drain`, the priced rate the caller already has (else read now)."""
        self._metrics.rejected(reason)
        if drain is None:
            drain = self._drain_rate(self._clock(), self._capacity())
        retry = retry_after_seconds(ahead=ahead, drain_per_s=drain)
        text = REFUSALS[message or reason].format(ahead=ahead, drain=drain or 0.0, **facts)
        return Overloaded(text, reason=reason, retry_after_s=retry)

    async def _wait(self, waiter: Waiter) -> Grant:
        """Wait for the waiter's outcome: a grant from `pump`, a rejection, its deadline (a timer of
        its own), or the caller's cancellation. No per-waiter polling: one gate-wide `_poll` pumps
        and checks deadlines every `poll_s` while anyone waits (a flood holds hundreds of waiters,
        and each waking up four times a second cost more CPU than the requests it was waiting for)."""
        future = waiter.future
        loop = asyncio.get_running_loop()
        left = waiter.deadline - self._clock()
        timer = loop.call_later(max(0.0, left), self._expire, waiter) if math.isfinite(left) else None
        self._waiting.add(waiter)
        if self._poll_handle is None:
            self._poll_handle = loop.call_later(self._poll_s, self._poll)
        try:
            await asyncio.wait({future})  # never cancels `future` itself when the caller is cancelled
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._waiting.discard(waiter)
            waiter.ticket = None  # out of the queue; the ticket refers back to the waiter
        try:
            return future.result()
        finally:
            # A refusal raised here holds this frame and the caller's in its traceback, and the future
            # holds the refusal: with the waiter left in them, each refused request's objects would be
            # a reference cycle that only the cyclic collector frees (docs/soak.md).
            del future, waiter

    def _expire(self, waiter: Waiter) -> None:
        """A waiter's deadline passed: serve those ahead first, then refuse it if it still waits.
        With an injected clock behind the loop's, nothing yet: `_poll` notices it later."""
        if waiter.future.done() or self._clock() < waiter.deadline:
            return
        self.pump()  # rejects it if it is at the head; otherwise it is rejected here
        if not waiter.future.done():
            self._reject(waiter, self._late(waiter))

    def _poll(self) -> None:
        """Every `poll_s` while requests wait: refuse those past their deadline, then pump
        (capacity can return without an event)."""
        self._poll_handle = None
        if not self._waiting:
            return
        now = self._clock()
        self.pump()  # serves what it can and refuses the head if it is past its deadline
        for waiter in [w for w in self._waiting if not w.future.done() and now >= w.deadline]:
            self._reject(waiter, self._late(waiter))
        if self._waiting:
            self._poll_handle = asyncio.get_running_loop().call_later(self._poll_s, self._poll)

    def _abandon(self, waiter: Waiter) -> None:
        """The caller is gone (client disconnected): withdraw it, or free what it was granted."""
        future = waiter.future
        if not future.done():
            if waiter.ticket is not None:
                self.queue.cancel(waiter.ticket)
            self._ready.pop(waiter, None)
            self._drain.tick(self._clock(), waiting=self._backlogged)
            self._metrics.waited(self._clock() - waiter.arrived, outcome="cancelled")
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            future.result().release()
