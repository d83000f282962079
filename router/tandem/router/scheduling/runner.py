"""The profile runner: filters → weighted scorers → picker, with the cross-cutting work plugins skip.

The runner (not the plugins) clamps each score into [0, 1], multiplies it by the scorer's weight,
sums, times every plugin with the injected timer, logs the cycle at debug level, and names the
decision's reason. A filter that would leave nothing is ignored for that cycle (fail open), because
an unbalanced pick is better than no pick.

Reasons (`tandem_router_schedule_decisions_total{reason}`):

| reason | when |
|---|---|
| `only-candidate` | one candidate came in |
| `imbalance-guard` (a filter's name) | a filter removed candidates |
| `prefix`, `load`, `kv`, `ttft`, `lora-affinity` | its weighted lead over the runner-up was the largest |
| `new-prefix` | as `prefix`, but the winner caches no more of the prompt than the runner-up |
| `tie-break` | equal totals; the picker's tie-break chose |

Example: weights prefix 3, load 2; A scores (prefix 0.96, load 0.0), B (0.0, 1.0) → totals A 2.88,
B 2.0; A's leads over B are prefix 3·0.96 = 2.88 and load −2 → reason `prefix`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tandem.router.scheduling.plugins import Candidate, Cycle, Filter, Picker, Scored, Scorer
from tandem.router.types import Endpoint

log = logging.getLogger("tandem.router.scheduling")


@dataclass(frozen=True, slots=True, kw_only=True)
class Weighted:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The outcome of one cycle. `scored`: the candidates that survived the filters, best first.
    `durations_s`: timer seconds per plugin name (filters, scorers, picker)."""

    cycle: Cycle
    chosen: Scored
    reason: str
    offered: int
    scored: Sequence[Scored]
    durations_s: Mapping[str, float]

    @property
    def endpoint(self) -> Endpoint:
        return self.chosen.candidate.endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerProfile:
    """One named composition of plugins (weights of 0 are left out by whoever builds it)."""

    name: str
    filters: Sequence[Filter]
    scorers: Sequence[Weighted]
    picker: Picker

    def run(self, cycle: Cycle, candidates: Sequence[Candidate], *, timer: Callable[[], float]) -> Decision:
        """Choose among `candidates` (non-empty). Raises ValueError when empty."""
        if not candidates:
            raise ValueError(f"no candidates to pick from in pool {cycle.pool!r}")
        durations: dict[str, float] = {}
        kept, filtered_by = self._filter(cycle, candidates, timer=timer, durations=durations)
        scored = self._score(cycle, kept, timer=timer, durations=durations)
        started = timer()
        chosen = self.picker.pick(scored)
        durations[self.picker.name] = timer() - started
        ranked = sorted(scored, key=lambda s: -s.total)
        reason = "only-candidate" if len(candidates) == 1 else filtered_by or self._reason(chosen, ranked)
        decision = Decision(
            cycle=cycle,
            chosen=chosen,
            reason=reason,
            offered=len(candidates),
            scored=ranked,
            durations_s=durations,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("scheduled", extra=_log_fields(decision))
        return decision

    def _filter(
        self,
        cycle: Cycle,
        candidates: Sequence[Candidate],
        *,
        timer: Callable[[], float],
        durations: dict[str, float],
    ) -> tuple[Sequence[Candidate], str | None]:
        kept, filtered_by = candidates, None
        for plugin in self.filters:
            started = timer()
            narrowed = plugin.filter(cycle, kept)
            durations[plugin.name] = timer() - started
            if not narrowed:
                log.debug("filter left nothing; ignored", extra={"filter": plugin.name})
                continue
            if len(narrowed) < len(kept):
                filtered_by = filtered_by or plugin.name
            kept = narrowed
        return kept, filtered_by

    def _score(
        self,
        cycle: Cycle,
        candidates: Sequence[Candidate],
        *,
        timer: Callable[[], float],
        durations: dict[str, float],
    ) -> list[Scored]:
        per_scorer: list[tuple[str, float, Mapping[str, float]]] = []
        for weighted in self.scorers:
            started = timer()
            name = weighted.scorer.name
            per_scorer.append((name, weighted.weight, weighted.scorer.score(cycle, candidates)))
            durations[name] = timer() - started
        scored: list[Scored] = []
        for candidate in candidates:
            url, total, scores = candidate.url, 0.0, {}
            for name, weight, values in per_scorer:
                value = values.get(url, 0.0)
                value = value if 0.0 < value <= 1.0 else (1.0 if value > 1.0 else 0.0)  # clamp; NaN → 0
                scores[name] = value
                total += weight * value
            scored.append(Scored(candidate=candidate, total=total, scores=scores))
        return scored

    def _reason(self, chosen: Scored, ranked: Sequence[Scored]) -> str:
        runner_up = next((s for s in ranked if s is not chosen), None)
        if runner_up is None:
            return "only-candidate"
        leads = {
            w.scorer.name: w.weight * (chosen.scores[w.scorer.name] - runner_up.scores[w.scorer.name])
            for w in self.scorers
        }
        if not leads or max(leads.values()) <= 0 or chosen.total - runner_up.total <= 0:
            return "tie-break"
        reason = max(leads, key=lambda name: leads[name])
        if reason == "prefix" and chosen.candidate.matched_tokens <= runner_up.candidate.matched_tokens:
            return "new-prefix"
        return reason


def _log_fields(decision: Decision) -> dict[str, object]:
    cycle = decision.cycle
    return {
        "request_id": cycle.request.request_id,
        "pool": cycle.pool,
        "profile": cycle.profile,
        "endpoint": decision.endpoint.name,
        "reason": decision.reason,
        "scores": {
            s.candidate.endpoint.name: {
                "total": round(s.total, 4),
                **{k: round(v, 4) for k, v in s.scores.items()},
            }
            for s in decision.scored
        },
    }
