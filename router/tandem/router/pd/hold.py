"""Late binding of prefills: while every prefill engine already has a queue, a request waits in the
gateway, first come first served, and is sent when an engine's queue falls, or a new engine joins.

Without it a request is bound to a prefill engine when it arrives: during a burst the queue builds on
the engines there are, and when the autoscaler's new engines become ready they take only what arrives
after that, while the requests queued on the old ones wait where they were sent (on the 2026-11-25
step, requests that arrived half a second before the second engine was ready waited a further second
behind the first one's queue). Held in the gateway instead, they go to whichever engine frees first.

**Rule** (`PrefillHold.admit`): a prefill is sent at once when no request is held before it and some
prefill engine in rotation has at most `HOLD_SHARE` of the request's TTFT objective of work queued
ahead (`ahead(url)`: the router's own `c + Q / R` with nothing of its own, from
`tandem.router.scheduling.state`; infinite for an engine that has not answered yet and computes a
prompt: `SlowStart`); otherwise it joins the hold. The first held request is sent as soon
as that is true again: when a prefill ends, when the prefill pool's members change, or at the latest
on a `poll_s` tick (a missed wake-up costs a tick, never a request); the others wait for their turn.
Each request is held at most its TTFT objective, then sent anyway (by then it has missed it: holding
it longer only reorders the misses). A client that leaves is withdrawn at once.

Work-conserving: an engine is sent work while its queue is shorter than a quarter of the objective,
so it does not idle while requests are held, unless one prompt alone outlasts that (an engine with
nothing queued always takes the first held request). Example, objective 2 s: engines at 0.9 s and
0.7 s queued ahead → held; a prefill ends and one is at 0.45 s → the first held request is sent there.

The convertible-decoder check (`tandem.router.pd.disagg`) sees the held work: `held_tokens` spread
over the prefill engines adds to their predicted TTFT, so a hold that grows still turns requests
decode-only while a decode engine would be faster.

Metrics: `tandem_router_pd_prefill_held` (requests held now) and
`tandem_router_pd_prefill_hold_seconds` (how long each sent prefill was held; 0 when not held).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client import Gauge, Histogram

#: The most queued prefill work, as a share of a request's TTFT objective, that a prefill is sent behind.
HOLD_SHARE = 0.25
#: The first held request's fallback tick (seconds); wake-ups normally come first.
POLL_S = 0.05


@dataclass(slots=True, eq=False)
class _Waiter:
    tokens: int
    woken: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True, kw_only=True, eq=False)
class PrefillHold:
    """The hold (module docstring). `ahead(url)`: seconds of work queued on a prefill endpoint;
    `candidates()`: the prefill endpoints in rotation; `clock`: monotonic seconds."""

    ahead: Callable[[str], float]
    candidates: Callable[[], Sequence[str]]
    clock: Callable[[], float]
    held_gauge: Gauge | None = None
    hold_seconds: Histogram | None = None
    poll_s: float = POLL_S
    _waiting: deque[_Waiter] = field(default_factory=deque)
    _tokens: int = 0

    @property
    def held(self) -> int:
        """Requests held now."""
        return len(self._waiting)

    @property
    def held_tokens(self) -> int:
        """Prompt tokens of the requests held now (kept as they come and go: the convertible-decoder
        check reads it for every disaggregated request)."""
        return self._tokens

    def room(self, limit_s: float) -> bool:
        """Whether some prefill endpoint has at most `limit_s` queued ahead (or there is none: the
        prefill's own fallbacks decide then)."""
        urls = self.candidates()
        return not urls or min(self.ahead(url) for url in urls) <= limit_s

    async def admit(self, *, slo_ttft_s: float, tokens: int) -> float:
        """Wait for this request's turn and an engine with room (module docstring); returns the seconds
        held. Cancellation (the client left) withdraws the request."""
        limit = HOLD_SHARE * slo_ttft_s
        if not self._waiting and self.room(limit):
            self._observe(0.0)
            return 0.0
        waiter = _Waiter(tokens)
        self._waiting.append(waiter)
        self._tokens += tokens
        self._gauge()
        start = self.clock()
        deadline = start + slo_ttft_s
        try:
            while True:
                first = self._waiting[0] is waiter
                if first and self.room(limit):
                    break
                remaining = deadline - self.clock()
                if remaining <= 0:
                    break
                waiter.woken.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.poll_s, remaining) if first else remaining):
                        await waiter.woken.wait()
        finally:
            self._waiting.remove(waiter)
            self._tokens -= tokens
            self._gauge()
            self.wake()
        held = self.clock() - start
        self._observe(held)
        return held

    def wake(self) -> None:
        """Something changed (a prefill ended, the pool's members changed): the first held request
        looks again."""
        if self._waiting:
            self._waiting[0].woken.set()

    def _gauge(self) -> None:
        if self.held_gauge is not None:
            self.held_gauge.set(len(self._waiting))

    def _observe(self, seconds: float) -> None:
        if self.hold_seconds is not None:
            self.hold_seconds.observe(seconds)
