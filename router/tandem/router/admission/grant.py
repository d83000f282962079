"""A request's hold on a unit of decode capacity (`Grant`), as `AdmissionGate` hands it out.

The grant charges its tenant as output streams (`charge_output`), corrects both charges with the
engine's usage (`settle`), gives its unit to the next waiting request a few tokens before its end
(`hand_over`) or to a pre-empting request (`give_up`), and frees it once (`release`). Every unit
given back tells the gate when it was taken (`granted_at`), which the gate's `HoldMeter` averages
(`tandem.router.admission.policy`, the pool's drain rate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tandem.router.types import Usage

if TYPE_CHECKING:
    from tandem.router.admission.gate import AdmissionGate

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
        "_handed_over",
        "_released",
        "_unreported",
        "at",
        "completion_tokens",
        "granted_at",
        "preempt",
        "preempting",
        "priority",
        "prompt_tokens",
        "queued_s",
        "stopped_on",
        "tenant",
    )

    def __init__(
        self,
        gate: AdmissionGate,
        *,
        tenant: str,
        prompt_tokens: int,
        charged: bool,
        priority: int = 0,
        granted_at: float | None = None,
    ) -> None:
        self.tenant = tenant
        #: Clock time it took its unit of capacity (None: it took none, the dispatcher's 503 path).
        self.granted_at = granted_at
        self.priority = priority
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.queued_s = 0.0  # clock seconds spent waiting in the queue
        #: Set by the relay while its stream can be stopped and continued (`preemption`): stops it.
        self.preempt: Callable[[], None] | None = None
        #: It took its capacity from a pre-empted stream (`AdmissionGate`, pre-emption): where it is
        #: sent, other tenants' requests without an answer make room (`Recalls.make_room`).
        self.preempting = False
        #: The URL of the decode engine its stream runs on, while it may be stopped (the relay).
        self.at: str | None = None
        #: Pre-empting: the URL of the decode engine whose stream it stopped, where that stream's
        #: blocks are free now (`pipeline.stages.Pick` sends a disaggregated service's request there).
        self.stopped_on: str | None = None
        self._gate = gate
        self._charged = charged
        self._released = False
        self._handed_over = False
        self._unreported = 0

    @property
    def preemptible(self) -> bool:
        return self.preempt is not None and not self._released and not self._handed_over

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

    def hand_over(self) -> None:
        """The answer is a few tokens from its end: its unit of capacity goes to the next waiting
        request now (the charges still follow it until `release`); idempotent."""
        if not self._released and not self._handed_over:
            self._handed_over = True
            self._gate.running.discard(self)
            self._gate.released(self.granted_at)

    def recharge(self, prompt_tokens: int | None) -> None:
        """A grant for a request that already had its turn (`AdmissionGate.resume`): its prompt was
        charged by its first grant (`prompt_tokens`, which the engine's usage corrects), or, for a
        continuation (None), is not charged at all."""
        self.prompt_tokens = prompt_tokens or 0
        self._charged = prompt_tokens is not None

    def give_up(self) -> Callable[[], None] | None:
        """Pre-empted: its unit of capacity now belongs to another request (`release` frees nothing
        more); returns the callback that stops its stream."""
        stop, self.preempt = self.preempt, None
        self._handed_over = True
        self._gate.running.discard(self)
        return stop

    def release(self) -> None:
        """The request is over (answered, failed or abandoned); idempotent."""
        if not self._released:
            self._released = True
            self.preempt = None
            self._report()
            if not self._handed_over:
                self._gate.running.discard(self)
                self._gate.released(self.granted_at)
