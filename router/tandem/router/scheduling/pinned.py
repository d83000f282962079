"""Pinned traffic: how much of each engine's recent traffic only its prefix cache could serve, so that
a long new prompt goes where its prefill blocks the least of it.

A prompt cached nowhere is computed from scratch wherever it goes. A long one (thousands of tokens)
fills its engine's steps for its whole prefill, a tenth of a second or more, and every request that
arrives there meanwhile waits for it. A request whose prefix is cached only on that engine cannot go
elsewhere without computing its prefix again, which takes as long: it waits. On the shared-prefix
workload F64 (docs/benchmarks.md), warm, 3 of the 8 slowest requests of each run had waited so,
behind a new 5,000-token system prompt placed (by its rendezvous home, `scorers.PrefixScorer`) on the
engine that served the most traffic pinned to its cache. Placing that prompt on any other engine
was as fast for it and cost no hit: it is cached nowhere.

So the gateway keeps, per pool, each engine's share of its recent decisions that were pinned there,
the decision that places a new prompt included: once placed, only that engine holds it, and its next
requests are pinned there. (Counted only from the requests that found their prefix, the shares would
lag the placements: at a cold start with many new prompts at once, the engine without hits yet would
take every new prompt until its own hits came back.)

    pinned_e  ← (1 − w) · pinned_e + w · [the decision chose e, and every other candidate would
                                          compute at least θ·n of the prompt]     (w = `WEIGHT`)
    long      = every candidate would compute at least `LONG_PREFILL_S` of the prompt:
                (n − matched_c) / R_c ≥ LONG_PREFILL_S        (R_c: its learned prefill rate)
    idle      = some candidate has no prompt work queued (`Candidate.queued_tokens` = 0)
    keep(C)   = {c ∈ C : pinned_c ≤ min pinned over C + `SLACK`}   when long and idle, else C

Only when some engine would start the prompt at once: then the requests pinned to it would have
started at once too, and the prompt's prefill is what they wait for. When every engine already has
prompts queued, requests wait for those anyway, and a new prompt goes by queue and load as before.

`PrefixScorer` applies `keep` to the candidates a new prompt may call home, before the rendezvous
order picks one of them; a short prompt (a step of a few milliseconds blocks nobody) and a cached one
are placed as before. With no decisions seen (a gateway that has just started) every share is 0 and
nothing changes, so gateway replicas still agree on new prompts' homes until their own traffic
tells them otherwise. Example, w = 0.05, four engines: ten decisions in a row pinned to A give A
1 − 0.95¹⁰ = 0.40 and the others 0; a 5,000-token new prompt at 32,000 tokens/s (0.16 s ≥ 0.05 s)
may then go to B, C or D, not A (0.40 > 0 + 0.1); a 500-token one (16 ms) anywhere.

Pure: no I/O, no clock; the scheduler tells it every decision (`picked`, the `PostPick` hook).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from tandem.router.scheduling.plugins import Candidate, Cycle

if TYPE_CHECKING:
    from tandem.router.scheduling.runner import Decision

#: The newest decision's weight in each engine's pinned share: about the last 20 decisions (half a
#: second of a pool at 40 req/s), the requests a prefill of a tenth of a second or more will meet.
WEIGHT = 0.05
#: A new prompt whose prefill is shorter than this on every candidate blocks nobody long enough to
#: matter (a step of a few milliseconds): it is placed as before.
LONG_PREFILL_S = 0.05
#: Pinned shares within this of the least count as the least (shares are fractions of decisions).
SLACK = 0.1


class PinnedTraffic:
    """The pinned shares per pool and engine (module docstring). `threshold`: θ, the share of the
    prompt every other candidate would compute for a decision to be pinned where it went (the prefix
    scorer's cache threshold)."""

    def __init__(
        self,
        *,
        threshold: float,
        weight: float = WEIGHT,
        long_prefill_s: float = LONG_PREFILL_S,
        slack: float = SLACK,
    ) -> None:
        if not 0.0 < weight <= 1.0 or not 0.0 < threshold <= 1.0:
            raise ValueError("weight and threshold must be in (0, 1]")
        if long_prefill_s < 0 or slack < 0:
            raise ValueError("long_prefill_s and slack must be >= 0")
        self.threshold = threshold
        self.weight = weight
        self.long_prefill_s = long_prefill_s
        self.slack = slack
        self._decisions: dict[str, int] = {}  # pool → decisions counted
        # pool → engine URL → (its share just after decision `at`, at): decayed when read, so an
        # engine a decision did not score (not shortlisted, filtered out) decays as the others do
        self._marks: dict[str, dict[str, tuple[float, int]]] = {}

    @property
    def shares(self) -> dict[str, dict[str, float]]:
        """Each pool's engines' pinned shares now (the engines some decision has scored)."""
        return {pool: {url: self._share(pool, url) for url in marks} for pool, marks in self._marks.items()}

    def _share(self, pool: str, url: str) -> float:
        share, at = self._marks[pool].get(url, (0.0, 0))
        return share * (1.0 - self.weight) ** (self._decisions[pool] - at) if share else 0.0

    def keep(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        """The candidates a new prompt may call home (module docstring's `keep`); never empty
        when `candidates` is not."""
        pool = cycle.pool
        if pool not in self._marks or len(candidates) < 2:
            return candidates
        n = cycle.prompt_tokens
        if any((n - c.matched_tokens) < self.long_prefill_s * c.tokens_per_second for c in candidates):
            return candidates
        if min(c.queued_tokens for c in candidates) > 0:  # every engine has prompts to compute first
            return candidates
        shares = {c.url: self._share(pool, c.url) for c in candidates}
        least = min(shares.values())
        return [c for c in candidates if shares[c.url] <= least + self.slack]

    def forget(self, keep: Collection[str]) -> None:
        """Drop the shares of engine URLs not in `keep` (they left discovery)."""
        for marks in self._marks.values():
            for url in [u for u in marks if u not in keep]:
                del marks[url]

    def picked(self, decision: Decision, /) -> None:
        """Count one decision: every share of its pool decays by (1 − w), the chosen engine's gains
        w when the decision was pinned there (module docstring); a decision with one candidate
        compares nothing and is not counted."""
        chosen = decision.chosen.candidate
        others = [s.candidate.matched_tokens for s in decision.scored if s.candidate.url != chosen.url]
        if not others:
            return
        pool, n = decision.cycle.pool, decision.cycle.prompt_tokens
        marks = self._marks.setdefault(pool, {})
        count = self._decisions[pool] = self._decisions.get(pool, 0) + 1
        for scored in decision.scored:
            marks.setdefault(scored.candidate.url, (0.0, count))
        if n > 0 and n - max(others) >= self.threshold * n:  # pinned where it went
            marks[chosen.url] = (self._share(pool, chosen.url) + self.weight, count)
