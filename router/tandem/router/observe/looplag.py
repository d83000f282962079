"""The gateway's event-loop lag: how late the loop runs what is due.

A timer due every `interval_s` notes how late it runs (the time the loop spent on other work, or
could not run at all because the process got no CPU). The lags go into
`tandem_router_event_loop_lag_seconds` (a histogram) and into a running total, from which
`lag_since(mark)` tells how much of a time window the loop lost.

What it is for: an upstream connect timeout is measured by a timer on this loop. When the loop
itself was stalled for much of the timeout (a starved process, a burst of new requests to parse),
the timer fires late relative to a connect that the kernel completed at once, so the timeout says
nothing about the engine. The dispatcher asks `lag_since` and does not count such a timeout against
the engine's rotation (see `tandem.router.upstream.dispatch`); the TTFT predictor takes the same lag
out of what it learns.

An idle gateway ticks slowly. Each wake-up of an otherwise idle process costs the host CPU whatever
the callback does (about 0.2 ms on the 2-core machine of docs/router-performance.md, "An idle
gateway"), so the timer is due every `interval_s` only while `busy()` (requests are open to engines)
or a window was marked since the last tick, and every `idle_interval_s` otherwise. A `mark()` while
ticking slowly brings the next tick forward to `interval_s` from then, so every marked window is
watched at the fine interval from its start.

`LagTotal` is the pure part (times are passed in); `LoopLagMonitor` runs the timer on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram

#: Seconds between ticks while busy: fine enough to see stalls of 0.1 s.
TICK_S = 0.1
#: Seconds between ticks while idle: one wake-up a second keeps the histogram live.
IDLE_TICK_S = 1.0
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
    """Runs the timer on the running loop between `start()` and `stop()`; `mark()` and
    `lag_since(mark)` read the lag (0 before `start`, so an unstarted monitor blames nothing on
    the loop). `busy`: whether windows worth watching may be open (default: always)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        interval_s: float = TICK_S,
        idle_interval_s: float = IDLE_TICK_S,
        busy: Callable[[], bool] = lambda: True,
    ) -> None:
        self._interval = interval_s
        self._idle_interval = max(idle_interval_s, interval_s)
        self._busy = busy
        self._total = LagTotal()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._slow = False
        self._marked = False
        self.histogram = Histogram(
            "tandem_router_event_loop_lag_seconds",
            "How late the gateway's event loop ran a timer due every 0.1 s while requests are open "
            "(every 1 s while idle): time lost to other work or to CPU starvation.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule(self._interval)

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._loop = None

    @property
    def slow(self) -> bool:
        """Whether the timer is ticking at the idle interval now."""
        return self._slow

    def mark(self) -> float:
        """The lag total now; pass it to `lag_since` later."""
        if self._loop is None:
            return 0.0
        now = self._loop.time()
        total = self._total.mark(now)
        self._marked = True
        if self._slow:  # watch the window from its start: the next tick is `interval_s` from now
            self._total.tick(now)  # keeps what was overdue, if anything (already in `total`)
            self._reschedule(now + self._interval)
        return total

    def lag_since(self, mark: float) -> float:
        """Seconds of lag since `mark` (from `mark()`)."""
        return max(0.0, self.mark() - mark)

    def _schedule(self, delay: float) -> None:
        assert self._loop is not None
        self._reschedule(self._loop.time() + delay)

    def _reschedule(self, due: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._slow = due - self._loop.time() > self._interval
        self._total.expect(due)
        self._timer = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self.histogram.observe(self._total.tick(self._loop.time()))
        watch = self._marked or self._busy()
        self._marked = False
        self._schedule(self._interval if watch else self._idle_interval)
