"""Simulated time. The engine loop reads and waits on a `Clock`; which one decides how simulated
seconds relate to wall seconds.

- `ScaledClock(s)`: simulated time runs `s` times faster than the wall clock (a 100 ms step sleeps
  100 / s ms); what `tandem sim --time-scale` uses.
- `VirtualClock`: time moves only when the engine sleeps, instantly; for deterministic tests and
  for simulating as fast as the CPU allows. Meant for a single sleeper (the engine loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class Clock(Protocol):
    """Simulated seconds: `now()` never decreases; `sleep(s)` returns once `s` simulated seconds passed."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class ScaledClock:
    """Simulated time = `time_scale` × wall seconds since construction."""

    def __init__(
        self,
        time_scale: float = 1.0,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.time_scale = time_scale
        self._monotonic = monotonic
        self._sleep = sleep
        self._origin = monotonic()

    def now(self) -> float:
        return (self._monotonic() - self._origin) * self.time_scale

    async def sleep(self, seconds: float) -> None:
        # Always yield, even for 0 s, so a loop that runs behind still lets others run.
        await self._sleep(max(0.0, seconds) / self.time_scale)


class VirtualClock:
    """Time that advances only through `sleep` (and `advance`), starting at `start` seconds."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
