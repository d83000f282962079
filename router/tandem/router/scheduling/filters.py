"""Filters: which candidates are worth scoring at all.

`ImbalanceGuard` is the load-balance guard of cache-aware routers (SGLang's cache-aware policy,
Preble's 1.5× rebalancing threshold). Prefix affinity alone would keep sending a hot prefix to the
endpoint that caches it until that endpoint drowns; the guard takes such an endpoint out of the
cycle while the imbalance lasts, so the request goes (and its prefix gets cached) elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.router.scheduling.plugins import Candidate, Cycle

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
