"""Filters: which candidates are worth scoring at all.

`ImbalanceGuard` is the load-balance guard of cache-aware routers (SGLang's cache-aware policy,
Preble's 1.5× rebalancing threshold). Prefix affinity alone would keep sending a hot prefix to the
endpoint that caches it until that endpoint drowns; the guard takes such an endpoint out of the
cycle while the imbalance lasts, so the request goes (and its prefix gets cached) elsewhere.

`SlowStart` is Envoy's slow start for new hosts, at its simplest: an engine that has not answered yet
gets one new prompt at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.scheduling.scorers import DEFAULT_THRESHOLD

#: SGLang's `balance_abs_threshold` and `balance_rel_threshold` defaults.
DEFAULT_ABS_THRESHOLD = 64.0
DEFAULT_REL_THRESHOLD = 1.5


@dataclass(frozen=True, slots=True, kw_only=True)
class ImbalanceGuard:
    """Drops every candidate that is overloaded relative to the least-loaded one:

        overloaded(p)  iff  L_p − L_min > abs_threshold  and  L_p > rel_threshold · L_min

    with `L = Candidate.load`. This is SGLang's pool-level imbalance test (max vs min) applied to each
    candidate, so the pool is imbalanced exactly when the most loaded candidate is dropped; the least
    loaded is never dropped. Example, thresholds 4 and 1.5: loads A 9, B 3, C 5 → A is dropped
    (9 − 3 > 4 and 9 > 4.5), C stays (5 − 3 ≤ 4); with B at 0 instead, C goes too (5 > 4, 5 > 0).
    """

    abs_threshold: float = DEFAULT_ABS_THRESHOLD
    rel_threshold: float = DEFAULT_REL_THRESHOLD
    name: str = "imbalance-guard"

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        if len(candidates) < 2:
            return candidates
        lowest = min(c.load for c in candidates)
        return [c for c in candidates if not self.overloaded(c.load, lowest=lowest)]

    def overloaded(self, load: float, *, lowest: float) -> bool:
        return load - lowest > self.abs_threshold and load > self.rel_threshold * lowest


@dataclass(frozen=True, slots=True)
class SlowStart:
    """Drops every candidate that is `warming`: it has not answered yet (`SchedulingState.warming`)
    and already computes a prompt. Until its first answer nothing is known of its speed (it is
    predicted at its pool's mean), and a new engine's first answers are its slowest: on the
    2026-11-27 steps a prefill engine that had just joined took 0.75 s for its first prompt against
    0.2 s after, while the pool's model, the prefix scorer and the load scorer all sent it the next
    ones, which then waited 1.6 s behind it. A prompt whose prefix it holds (at least `threshold` of
    it, the cache threshold) may still follow: what it adds there is short, and elsewhere it would be
    computed again. If every candidate is dropped (a pool that has just started) the runner ignores
    the filter."""

    threshold: float = DEFAULT_THRESHOLD
    name: str = "slow-start"

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        follows = self.threshold * cycle.prompt_tokens
        return [
            c for c in candidates if not c.warming or (c.matched_tokens > 0 and c.matched_tokens >= follows)
        ]
