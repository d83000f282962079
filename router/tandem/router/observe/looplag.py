"""The gateway's event-loop lag: how late the loop runs what is due.

A ticker task sleeps `interval_s` over and over and notes how late it wakes (the time the loop spent
on other work, or could not run at all because the process got no CPU). The lags go into
`tandem_router_event_loop_lag_seconds` (a histogram) and into a running total, from which
`lag_since(mark)` tells how much of a time window the loop lost.

What it is for: an upstream connect timeout is measured by a timer on this loop. When the loop
itself was stalled for much of the timeout (a starved process, a burst of new requests to parse),
the timer fires late relative to a connect that the kernel completed at once, so the timeout says
nothing about the engine. The dispatcher asks `lag_since` and does not count such a timeout against
the engine's rotation (see `tandem.router.upstream.dispatch`).

`LagTotal` is the pure part (times are passed in); `LoopLagMonitor` runs the ticker on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

from tandem.core.tasks import stop_task

#: Seconds between ticks: cheap (ten wake-ups a second) and fine enough to see stalls of 0.1 s.
TICK_S = 0.1
#: Seconds; from a busy loop (a few ms) to a starved process (seconds).
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class LagTotal:
    """The running total of lag over ticks (pure). `tick(due, now)` records a tick that was due at
    `due` and ran at `now`; `mark(now)` is the total so far, counting a tick that is overdue at
    `now` as lag up to `now` (so a stall still in progress is seen)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._due: float | None = None

    def expect(self, due: float) -> None:
        """The next tick is due at `due`."""
        self._due = due

    def tick(self, now: float) -> float:
        """The expected tick ran at `now`; returns its lag (seconds, >= 0)."""
        lag = max(0.0, now - self._due) if self._due is not None else 0.0
        self._due = None
        self.total_s += lag
        return lag

    def mark(self, now: float) -> float:
        overdue = max(0.0, now - self._due) if self._due is not None else 0.0
        return self.total_s + overdue


class LoopLagMonitor:
    """Runs the ticker on the running loop between `start()` and `stop()`; `mark()` and
    `lag_since(mark)` read the lag (0 before `start`, so an unstarted monitor blames nothing on
    the loop)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, interval_s: float = TICK_S) -> None:
        self._interval = interval_s
        self._total = LagTotal()
        self._task: asyncio.Task[None] | None = None
        self._now: Callable[[], float] | None = None
        self.histogram = Histogram(
            "tandem_router_event_loop_lag_seconds",
            "How late the gateway's event loop ran a timer due every 0.1 s (time lost to other "
            "work or to CPU starvation).",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._now = loop.time
        self._task = asyncio.create_task(self._run(), name="tandem-loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    def mark(self) -> float:
        """The lag total now; pass it to `lag_since` later."""
        return self._total.mark(self._now()) if self._now is not None else 0.0

    def lag_since(self, mark: float) -> float:
        """Seconds of lag since `mark` (from `mark()`)."""
        return max(0.0, self.mark() - mark)

    async def _run(self) -> None:
        now = asyncio.get_running_loop().time
        while True:
            self._total.expect(now() + self._interval)
            await asyncio.sleep(self._interval)
            self.histogram.observe(self._total.tick(now()))
