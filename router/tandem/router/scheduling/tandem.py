"""Tandem's scheduler: per pool and request, filters → weighted scorers → picker, composed from config.

`ProfileScheduler` implements the `Scheduler` Protocol with named `SchedulerProfile`s; the state
(`SchedulingState`) says which profile a cycle uses and computes the candidates. The policies of
`spec.router.policy` are profile sets:

| policy | profile `prompt` (the endpoint computes the prompt) | `kv-loaded` (decode after a prefill) |
|---|---|---|
| `tandem` | guard, slow start → prefix, load, kv, ttft (weighted) | guard, slow start → load, kv |
| `least-load` | load | load |
| `prefix` | SGLang's cache-aware rule (below) | load |

With LoRA adapters (`adapters`: the service has some), both profiles end with the placement filter
(`adapterplace.AdapterPlacement`: an adapter's request may go only to its home engine and the
engines holding it, within a load bound), and the `prompt` profile also scores adapter affinity
(`scorers.AdapterAffinityScorer`, weight `ADAPTER_WEIGHT`, 4) among them. The scheduler tells every
filter and scorer that has a `picked` method (`plugins.PostPick`) each decision it made with it. The
`prompt` profile's prefix scorer keeps the engines' pinned traffic that way (`pinned.PinnedTraffic`),
which a long new prompt avoids.

Which profile: the prefill pool always computes the prompt, so its prefix cache and queued prefill
work decide (`prompt`). A decode endpoint computes the prompt too when the request is not
disaggregated (or its prefill failed), so the same profile applies; after a successful prefill the
decode engine loads the prompt's KV from the pool (or the prefill engine), so its own cache and
prefill queue no longer matter and it is chosen by load and free KV (`kv-loaded`). Slow start applies
there too: a decode engine that has not answered yet (one the autoscaler has just added) takes one
prefilled request at a time until it does, whatever prefix it holds (`threshold=inf`), rather than
the queue of them its empty load would draw (`SchedulingState`'s `warming` for `kv-loaded`).

`prefix` (a baseline for `tandem bench --policy`, after SGLang's cache-aware policy): if the pool is
imbalanced (max − min load > abs and max > rel · min) take the least-loaded endpoint; else if the best
prefix match is above `cache_threshold` (0.3) of the prompt take the best-matching endpoint (ties:
least load); else the least-loaded one (the `sgl-model-gateway` variant).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tandem.core.spec import ScoringWeights
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.adapterplace import AdapterPlacement
from tandem.router.scheduling.base import Routable
from tandem.router.scheduling.filters import ImbalanceGuard, SlowStart
from tandem.router.scheduling.picker import MaxScorePicker
from tandem.router.scheduling.pinned import PinnedTraffic
from tandem.router.scheduling.plugins import Candidate, Cycle, PostPick, Scorer
from tandem.router.scheduling.runner import Decision, SchedulerProfile, Weighted
from tandem.router.scheduling.scorers import (
    ADAPTER_WEIGHT,
    DEFAULT_THRESHOLD,
    AdapterAffinityScorer,
    KVScorer,
    LoadScorer,
    PrefixScorer,
    TTFTScorer,
)
from tandem.router.scheduling.state import KV_LOADED, PROMPT, SchedulingState
from tandem.router.types import Endpoint, EndpointSnapshot, Pool

#: SGLang's `cache_threshold`: the prefix-match share above which cache affinity wins.
DEFAULT_CACHE_THRESHOLD = DEFAULT_THRESHOLD


class ProfileScheduler:
    """A `Scheduler` running one of `profiles` per cycle (the one `state.profile_for` names).
    `on_decision` receives every `Decision` (metrics, logs); `timer` times the plugins."""

    def __init__(
        self,
        *,
        state: SchedulingState,
        profiles: Mapping[str, SchedulerProfile],
        timer: Callable[[], float],
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        missing = {PROMPT, KV_LOADED} - set(profiles)
        if missing:
            raise ValueError(f"profiles missing: {sorted(missing)}")
        self.state = state
        self.profiles = dict(profiles)
        self._post_pick: dict[str, list[PostPick]] = {
            name: [h for h in (*p.filters, *(w.scorer for w in p.scorers)) if isinstance(h, PostPick)]
            for name, p in profiles.items()
        }
        self._timer = timer
        self._on_decision = on_decision

    def pick(self, pool: Pool, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> Endpoint:
        return self.decide(pool, request, candidates).endpoint

    def decide(self, pool: Pool, request: Routable, candidates: Sequence[EndpointSnapshot]) -> Decision:
        """`pick` with the whole decision (scores, reason, timings)."""
        profile = self.profiles[self.state.profile_for(pool, request)]
        cycle, scored = self.state.candidates(pool, request, candidates, profile=profile.name)
        decision = profile.run(cycle, scored, timer=self._timer)
        for hook in self._post_pick[profile.name]:
            hook.picked(decision)
        if self._on_decision is not None:
            self._on_decision(decision)
        return decision


def tandem_profiles(
    weights: ScoringWeights,
    *,
    guard: ImbalanceGuard,
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
    adapters: bool = False,
    adapter_capacity: int | None = None,
    adapter_loads: AdapterLoads | None = None,
    block_size: Callable[[str], int] | None = None,
    pinned: PinnedTraffic | None = None,
) -> dict[str, SchedulerProfile]:
    """The `tandem` policy's profiles (module docstring); scorers with weight 0 are left out.
    `adapters`: the service serves LoRA adapters (adds the placement filter, shared by both
    profiles, and the adapter scorer); `adapter_capacity`: adapters an engine keeps in its CPU tier
    (`maxCpuLoras`; None: its `max_lora` once read, 4 until then); `adapter_loads`: the scheduling
    state's record of adapter loads, which the placement marks (`adapterload`); `block_size`: each endpoint's
    block size in the router's index, for the keys that anchor a new prompt's home (`PrefixScorer`);
    `pinned`: the engines' pinned traffic the prefix scorer keeps (`pinned`; a record of its own when
    not given)."""
    picker = MaxScorePicker()
    placement = AdapterPlacement(capacity=adapter_capacity, loads=adapter_loads)
    pinned = pinned or PinnedTraffic(threshold=cache_threshold)
    prompt: list[tuple[Scorer, float]] = [
        (PrefixScorer(threshold=cache_threshold, block_size=block_size, pinned=pinned), weights.prefix),
        (LoadScorer(), weights.load),
        (KVScorer(), weights.kv),
        (TTFTScorer(), weights.ttft),
        (AdapterAffinityScorer(residency=placement.residency), ADAPTER_WEIGHT if adapters else 0.0),
    ]
    loaded: list[tuple[Scorer, float]] = [(LoadScorer(), weights.load), (KVScorer(), weights.kv)]
    profiles = {
        PROMPT: SchedulerProfile(
            name=PROMPT,
            filters=[guard, SlowStart(threshold=cache_threshold)],
            scorers=_weighted(prompt),
            picker=picker,
        ),
        KV_LOADED: SchedulerProfile(
            name=KV_LOADED,
            filters=[guard, SlowStart(threshold=math.inf)],
            scorers=_weighted(loaded),
            picker=picker,
        ),
    }
    if not adapters:
        return profiles
    return {name: replace(p, filters=[*p.filters, placement]) for name, p in profiles.items()}


def least_load_profiles() -> dict[str, SchedulerProfile]:
    """`least-load`: the least `Candidate.load`; ties take turns (the picker's tie-break)."""
    picker = MaxScorePicker()
    scorers = [Weighted(scorer=LoadScorer(), weight=1.0)]
    return {
        name: SchedulerProfile(name=name, filters=[], scorers=scorers, picker=picker)
        for name in (PROMPT, KV_LOADED)
    }


def cache_aware_profiles(*, guard: ImbalanceGuard, cache_threshold: float) -> dict[str, SchedulerProfile]:
    """`prefix`, SGLang's cache-aware rule as a profile: a pool-level imbalance filter, then a 0/1
    cache-hit score (weight 2) that outranks the load score (weight 1), so load only breaks ties."""
    picker = MaxScorePicker()
    load = Weighted(scorer=LoadScorer(), weight=1.0)
    hit = Weighted(scorer=CacheHitScorer(threshold=cache_threshold), weight=2.0)
    imbalance = PoolImbalance(guard=guard)
    return {
        PROMPT: SchedulerProfile(name=PROMPT, filters=[imbalance], scorers=[hit, load], picker=picker),
        KV_LOADED: SchedulerProfile(name=KV_LOADED, filters=[imbalance], scorers=[load], picker=picker),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheHitScorer:
    """1 for the candidates with the longest prefix match when it exceeds `threshold` of the prompt,
    else 0 for all. Example, threshold 0.3, n = 1000: matches A 960, B 960, C 0 → A 1, B 1, C 0;
    matches A 200 → all 0."""

    threshold: float
    name: str = "prefix"

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        best = max((c.matched_tokens for c in candidates), default=0)
        hit = cycle.prompt_tokens > 0 and best / cycle.prompt_tokens > self.threshold
        return {c.url: 1.0 if hit and c.matched_tokens == best else 0.0 for c in candidates}


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolImbalance:
    """SGLang's rule: when the most loaded candidate is overloaded against the least loaded one
    (`ImbalanceGuard.overloaded`), keep only the least-loaded candidates; else keep all."""

    guard: ImbalanceGuard
    name: str = "imbalance-guard"

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        if len(candidates) < 2:
            return candidates
        lowest = min(c.load for c in candidates)
        highest = max(c.load for c in candidates)
        if not self.guard.overloaded(highest, lowest=lowest):
            return candidates
        return [c for c in candidates if c.load == lowest]


def _weighted(pairs: Sequence[tuple[Scorer, float]]) -> list[Weighted]:
    return [Weighted(scorer=scorer, weight=weight) for scorer, weight in pairs if weight > 0]
