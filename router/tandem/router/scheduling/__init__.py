"""Scheduling policies: pure, synchronous choices over a snapshot of endpoint state.

The router calls `Scheduler.pick` once per attempt; filtering out endpoints out of rotation or
already tried is the caller's job (`EndpointRegistry.candidates`). `scheduler_for` maps the spec's
`router.policy` to a fresh policy instance built on the router's `SchedulingState`:

- `tandem` (default): filters → weighted scorers (prefix, load, kv, ttft; lora-affinity with
  adapters) → picker (`tandem`);
- `prefix`: SGLang-like cache-aware routing; `least-load`; `round-robin` (baselines).

Module map: `plugins` (the Filter/Scorer/Picker boundary and its data), `scorers`, `filters`,
`picker`, `runner` (profiles: clamp, weigh, time, log, reason), `tandem` (policies as profile sets),
`state` (candidates, queued work, feedback from the dispatcher), `prefix` (the approximate index),
`ttft` (the predictor and learned rates).

Imports nothing from the web or I/O stack (no fastapi, httpx, redis).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tandem.core.spec import ScoringWeights
from tandem.router.errors import ConfigurationError
from tandem.router.scheduling.base import DispatchObserver, NoObserver, Routable, Scheduler
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.round_robin import RoundRobin
from tandem.router.scheduling.runner import Decision
from tandem.router.scheduling.state import SchedulingState
from tandem.router.scheduling.tandem import (
    DEFAULT_CACHE_THRESHOLD,
    ProfileScheduler,
    cache_aware_profiles,
    least_load_profiles,
    tandem_profiles,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerDeps:
    """What a policy is built from. `state` is shared with the dispatcher (its `DispatchObserver`)
    and the admission layer (its `TTFTPredictor`); `timer` times plugins (seconds)."""

    state: SchedulingState = field(default_factory=lambda: SchedulingState(clock=time.monotonic))
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    guard: ImbalanceGuard = field(default_factory=ImbalanceGuard)
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD
    #: The service serves LoRA adapters: the `tandem` policy scores adapter affinity too.
    adapters: bool = False
    #: Adapters an engine keeps in its CPU tier (`spec.engine.lora`'s `maxCpuLoras`, else `maxLoras`):
    #: the size of the gateway's residency record per engine; None: each engine's scraped `max_lora`.
    adapter_capacity: int | None = None
    timer: Callable[[], float] = time.perf_counter
    on_decision: Callable[[Decision], None] | None = None


def _tandem(deps: SchedulerDeps) -> Scheduler:
    profiles = tandem_profiles(
        deps.weights,
        guard=deps.guard,
        cache_threshold=deps.cache_threshold,
        adapters=deps.adapters,
        adapter_capacity=deps.adapter_capacity,
        adapter_loads=deps.state.adapter_loads,
        block_size=deps.state.approximate.block_size,
        pinned=deps.state.pinned,
    )
    return ProfileScheduler(
        state=deps.state, profiles=profiles, timer=deps.timer, on_decision=deps.on_decision
    )


def _prefix(deps: SchedulerDeps) -> Scheduler:
    profiles = cache_aware_profiles(guard=deps.guard, cache_threshold=deps.cache_threshold)
    return ProfileScheduler(
        state=deps.state, profiles=profiles, timer=deps.timer, on_decision=deps.on_decision
    )


def _least_load(deps: SchedulerDeps) -> Scheduler:
    profiles = least_load_profiles()
    return ProfileScheduler(
        state=deps.state, profiles=profiles, timer=deps.timer, on_decision=deps.on_decision
    )


def _round_robin(deps: SchedulerDeps) -> Scheduler:
    return RoundRobin()


#: `spec.router.policy` → policy factory (one instance per gateway process; policies keep state).
POLICIES: Mapping[str, Callable[[SchedulerDeps], Scheduler]] = MappingProxyType(
    {"tandem": _tandem, "prefix": _prefix, "least-load": _least_load, "round-robin": _round_robin}
)


def scheduler_for(policy: str, deps: SchedulerDeps | None = None) -> Scheduler:
    """A new scheduler for `policy`; raises `ConfigurationError` naming the known policies."""
    factory = POLICIES.get(policy)
    if factory is None:
        known = ", ".join(sorted(POLICIES))
        raise ConfigurationError(f"routing policy {policy!r} is not implemented (known: {known})")
    return factory(deps or SchedulerDeps())


__all__ = [
    "POLICIES",
    "DispatchObserver",
    "NoObserver",
    "ProfileScheduler",
    "RoundRobin",
    "Routable",
    "Scheduler",
    "SchedulerDeps",
    "SchedulingState",
    "scheduler_for",
]
