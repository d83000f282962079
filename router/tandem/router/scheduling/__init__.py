"""Scheduling policies: pure, synchronous choices over a snapshot of endpoint state.

The router calls `Scheduler.pick` once per attempt; filtering out endpoints out of rotation or
already tried is the caller's job (`EndpointRegistry.candidates`). `scheduler_for` maps the spec's
`router.policy` to a fresh policy instance. The next step adds filter → weighted scorers → picker
behind the same Protocol.

Imports nothing from the web or I/O stack (no fastapi, httpx, redis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from tandem.router.errors import ConfigurationError
from tandem.router.scheduling.base import Scheduler
from tandem.router.scheduling.round_robin import RoundRobin

#: `spec.router.policy` → policy factory (one instance per gateway process; policies keep state).
POLICIES: Mapping[str, Callable[[], Scheduler]] = MappingProxyType({"round-robin": RoundRobin})


def scheduler_for(policy: str) -> Scheduler:
    """A new scheduler for `policy`; raises `ConfigurationError` naming the known policies."""
    factory = POLICIES.get(policy)
    if factory is None:
        known = ", ".join(sorted(POLICIES))
        raise ConfigurationError(f"routing policy {policy!r} is not implemented (known: {known})")
    return factory()


__all__ = ["POLICIES", "RoundRobin", "Scheduler", "scheduler_for"]
