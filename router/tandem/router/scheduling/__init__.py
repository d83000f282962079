"""Scheduling policies: pure, synchronous choices over a snapshot of endpoint state.

The router calls `Scheduler.pick` once per attempt; filtering out endpoints out of rotation or
already tried is the caller's job (`EndpointRegistry.candidates`). The next step replaces
`RoundRobin` with filter → weighted scorers → picker behind the same Protocol.

Imports nothing from the web or I/O stack (no fastapi, httpx, redis).
"""

from tandem.router.scheduling.base import Scheduler
from tandem.router.scheduling.round_robin import RoundRobin

__all__ = ["RoundRobin", "Scheduler"]
