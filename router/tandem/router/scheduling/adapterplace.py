"""Adapter placement: an adapter's requests go where it is held, within a load bound; a load goes to
the least busy engine.

An engine serving many LoRA adapters over few slots pays a load (a disk read into its CPU tier, a copy
into a GPU slot: about 70 ms of stalled steps for a rank-8 adapter in the simulator's time model)
whenever a request's adapter is not resident, and the whole step waits for it: every request in the
engine's batch is stalled with the one that needs the adapter. Spreading an adapter's requests by load
alone loads every adapter on every engine. So (after consistent hashing with bounded loads, Mirrokni,
Thorup, Zadimoghaddam, SODA 2018):

    bound   = max(MIN_BOUND, ceil((1 + ε) · (ΣL + 1) / n))       L: `Candidate.load`, n candidates
    holding = the engines holding the adapter with L < bound
    allowed = holding                                              when there is one
            = {the engine under the bound with the least L + L̄ + 2λ}
                                                                   else (ties: the adapter's
                                                                   rendezvous order, `scorers.home_ranks`)
    L̄       = the engine's load lately: L averaged over the gateway's recent decisions
    λ       = loads in flight on the engine (`adapterload.AdapterLoads`): the new one waits behind
              them, and every request there waits for both

"Holding": the engine runs or queues the adapter now (`vllm:lora_requests_info`), or this gateway
sent it the adapter recently (`Residency`, an LRU per engine the size of its CPU tier). Example,
ε = 0.5, loads A 4, B 2, C 0, D 1 (ΣL = 7), the adapter held on B and A: bound = max(3, ceil(1.5 ·
8/4)) = 3; B (2 < 3) holds it → allowed {B}; with B at 3 instead, no holder is under the bound and
the load goes to C, the least busy (on a tie, the first of the adapter's order).

So an adapter stays where it is held (a load of MIN_BOUND − 1 more requests there does not move it:
hysteresis against load storms, since sharing a batch costs a fraction of a step and a move costs a
load), a hot adapter widens engine by engine as its demand fills them past the bound, and no engine
ever takes a request above the bound: in a burst the largest queue stays within (1 + ε) × the pool's
mean (plus rounding). A load, which is certain once no holder has room, goes where it stalls the
fewest requests and waits behind the fewest other loads: the least busy engine, not a hot adapter's
busy engines, and not one already loading (two loads in one engine's step take twice as long).
"Least busy" counts the engine's load lately (L̄, an exponential average over the last
`1 / LATELY_WEIGHT` decisions) beside its load now: a stall hits the requests an engine will get
while it lasts, not only those it holds, and an engine that a hot adapter's burst feeds is busy
on average even in the instant between two of its requests. Without L̄ (docs/benchmarks.md §8, a
burst of 16 req/s on one adapter over 8 req/s of 200 cold ones) a cold adapter's load landed on
a burst engine in such an instant about twice a second, and each stalled the burst's requests in
that engine's step by 50–90 ms. A load in flight counts twice (2λ): the new load's request waits
for it, and every request on the engine then waits for two loads instead of one; counted once, the
quiet engines took the cold loads two at a time and the other requests in the burst's window paid
(their p99 1.13× round robin's, against 0.87× with 2λ, the burst's own p99 the same). On
the docs/benchmarks.md §8 request sequences, replayed with 4-entry LRUs per engine and 0.35 s
requests, the least busy engine halves the requests in flight on an engine when it loads (374 → 167
per 1,000 requests) against a load at the adapter's first engine under the bound, with as many loads
(416 → 405). On an idle pool every load goes to the adapter's first engine (the rendezvous order
breaks the tie): gateway replicas agree where an adapter lives. Some engine is always under the
bound (the least loaded one is at most the mean), so the filter never empties the cycle.
Base-model requests pass unchanged.

**A copy ahead of the requests.** When the gateway can load adapters itself (vLLM's runtime API,
`adapterload.AdapterLoads.copier`), an adapter that outgrows its holders does not spread by a
request's load: the request still goes to a holder, up to `COPY_SLACK` requests over the bound, and
the engine the load would have gone to gets a copy of the adapter, loaded in the background. When the
copy is done that engine holds the adapter and takes its requests at no load. So in a hot adapter's
burst only its first request waits for a load, where spreading by requests made one request wait per
engine it spread to (and every request in that engine's step). With no holder within the slack (or
a copy of the adapter already loading and the holders full), the request loads it as before.
Example, bound 3, `sql` held on A (load 3), B at 1 and C at 0 hold it not: without a copier the
request goes to C and loads `sql` there; with one it goes to A (3 < 3 + 2) and C gets a copy; the
next request finds C holding `sql`.

`AdapterPlacement` is the filter (name `adapter-placement`) and keeps the residency record; the
scheduler tells it every decision (`picked`, the `PostPick` hook). Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from tandem.router.scheduling.adapterload import AdapterLoads, Residency, holds
from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.scheduling.runner import Decision
from tandem.router.scheduling.scorers import home_ranks

#: The bound's slack over the mean load (ε). On docs/benchmarks.md §8's workload (one run each, loads
#: per 1,000 requests): ε 0.25 and floor 2: 863 to 912; ε 0.25, floor 3: 840; ε 1, floor 2: 847;
#: ε 0.5, floor 3: 810 (round robin 1182). Below 1 so a burst's largest queue stays under twice the
#: pool's mean (the issue's target).
DEFAULT_EPSILON = 0.5
#: The least bound: an engine holding an adapter takes up to three requests before the adapter
#: spreads. A move costs a load (≥ 70 ms of stalled steps); another request in the batch costs a
#: fraction of a step.
MIN_BOUND = 3
#: Requests a holder may take over the bound while a copy of its adapter loads on another engine
#: (module docstring): a load takes about 70 ms, in which a burst of 16 req/s brings one or two.
COPY_SLACK = 2
#: The weight of the newest decision in an engine's load lately (L̄): it averages over about the last
#: 20 decisions (a second of a burst at 20 req/s, a few seconds of a quieter pool).
LATELY_WEIGHT = 0.05
#: Adapters remembered per engine until its `max_lora` is read (vLLM's `--max-cpu-loras` defaults
#: to `--max-loras`; Tandem's bench and most deployments run 4).
DEFAULT_RESIDENT = 4


def load_bound(loads: Sequence[float], *, epsilon: float = DEFAULT_EPSILON, floor: int = MIN_BOUND) -> int:
    """The most requests an engine may hold before an adapter's request passes it by:
    `max(floor, ceil((1 + ε) · (ΣL + 1) / n))`, the new request counted in.

    >>> load_bound([4, 2, 0, 0]), load_bound([8, 8, 8, 8]), load_bound([])
    (3, 13, 3)"""
    if not loads:
        return floor
    return max(floor, math.ceil((1.0 + epsilon) * (sum(loads) + 1.0) / len(loads) - 1e-9))


def allowed_engines(
    order: Sequence[str],
    loads: Mapping[str, float],
    holders: Collection[str],
    *,
    bound: float,
    loading: Mapping[str, int] | None = None,
    lately: Mapping[str, float] | None = None,
) -> list[str]:
    """The engines an adapter's request may go to (module docstring): the engines in `holders` under
    `bound`; when there is none, the engine under it where a load stalls least: the fewest requests
    in flight now and lately (`lately`, L̄) plus twice the loads in flight (`loading`: the new load
    waits behind each, and so does every request there), ties to the first in `order` (the
    adapter's rendezvous order). In `order`'s order; empty only if no engine is under the bound.

    >>> allowed_engines(["b", "a", "d", "c"], {"a": 3, "b": 1, "c": 0, "d": 0}, {"b", "d"}, bound=2)
    ['b', 'd']
    >>> allowed_engines(["b", "a", "d", "c"], {"a": 3, "b": 1, "c": 0, "d": 0}, {"a"}, bound=2)
    ['d']
    >>> allowed_engines(["b", "a", "d", "c"], {"a": 3, "b": 1, "c": 1, "d": 1}, set(), bound=2,
    ...                 loading={"b": 1, "d": 1})
    ['c']
    >>> allowed_engines(["a", "b", "d", "c"], {"a": 0, "b": 1, "c": 2, "d": 2}, set(), bound=3,
    ...                 loading={"a": 1})
    ['b']
    >>> allowed_engines(["b", "a", "d", "c"], {"a": 3, "b": 1, "c": 0, "d": 0}, set(), bound=2,
    ...                 lately={"c": 2.5, "d": 0.5})
    ['d']"""
    held = [url for url in order if url in holders and loads[url] < bound]
    if held:
        return held
    under = [url for url in order if loads[url] < bound]
    if not under:
        return []
    waits, past = loading or {}, lately or {}
    return [min(under, key=lambda url: loads[url] + past.get(url, 0.0) + 2 * waits.get(url, 0))]  # first tie


class AdapterPlacement:
    """The placement filter (module docstring) and its residency record.

    `epsilon`, `floor`: the bound's slack and least value (`load_bound`); `default_capacity`: the
    adapters remembered per engine while its `max_lora` is unknown (`capacity`: always this many,
    e.g. the service's `maxCpuLoras`, when given); `loads`: where the placements that load an
    adapter are marked and the residency record kept (`adapterload`: the scheduling state prices
    those loads into the predicted TTFT; a placement of its own when not given); `lately_weight`:
    the newest decision's weight in each engine's load lately (L̄, `LATELY_WEIGHT`)."""

    name = "adapter-placement"

    def __init__(
        self,
        *,
        epsilon: float = DEFAULT_EPSILON,
        floor: int = MIN_BOUND,
        default_capacity: int = DEFAULT_RESIDENT,
        capacity: int | None = None,
        loads: AdapterLoads | None = None,
        lately_weight: float = LATELY_WEIGHT,
    ) -> None:
        if epsilon < 0 or floor < 1 or default_capacity < 1 or (capacity is not None and capacity < 1):
            raise ValueError("epsilon must be >= 0, floor, default_capacity and capacity >= 1")
        if not 0.0 < lately_weight <= 1.0:
            raise ValueError("lately_weight must be in (0, 1]")
        self.epsilon = epsilon
        self.floor = floor
        self.default_capacity = default_capacity
        self.capacity = capacity
        self.loads = loads or AdapterLoads()
        self.lately_weight = lately_weight
        self.lately: dict[str, dict[str, float]] = {}  # pool → engine URL → its load lately

    @property
    def residency(self) -> Residency:
        return self.loads.residency

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        lately = self._observe(cycle.pool, candidates)
        adapter = cycle.request.lora_name
        if adapter is None or len(candidates) < 2:
            return candidates
        urls = [c.url for c in candidates]
        loads = {c.url: c.load for c in candidates}
        holders = {c.url for c in candidates if holds(self.residency, c.snapshot, adapter)}
        bound = load_bound(list(loads.values()), epsilon=self.epsilon, floor=self.floor)
        order: Sequence[str] = urls  # the holders under the bound are the answer: order is moot
        loading: dict[str, int] = {}
        if not any(loads[url] < bound for url in holders):  # a load: its tie-break and waits
            ranks = home_ranks(adapter, urls)
            order = sorted(urls, key=ranks.__getitem__)
            loading = {url: self.loads.in_flight(url) for url in urls}
            roomy = {url for url in holders if loads[url] < bound + COPY_SLACK}
            if roomy and self._copying(
                adapter, candidates, order, loads, bound=bound, loading=loading, lately=lately
            ):
                return [c for c in candidates if c.url in roomy]
        allowed = set(allowed_engines(order, loads, holders, bound=bound, loading=loading, lately=lately))
        return [c for c in candidates if c.url in allowed]

    def _observe(self, pool: str, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Folds every candidate's load into its load lately in `pool` (every request's decision,
        base-model ones too: they feed the engines as well) and returns the pool's record; engines
        gone from the pool are forgotten."""
        weight = self.lately_weight
        lately = self.lately.setdefault(pool, {})
        for c in candidates:
            past = lately.get(c.url)
            lately[c.url] = c.load if past is None else past + weight * (c.load - past)
        if len(lately) > 2 * len(candidates) + 8:
            present = {c.url for c in candidates}
            lately = self.lately[pool] = {url: value for url, value in lately.items() if url in present}
        return lately

    def _copying(
        self,
        adapter: str,
        candidates: Sequence[Candidate],
        order: Sequence[str],
        loads: Mapping[str, float],
        *,
        bound: int,
        loading: Mapping[str, int],
        lately: Mapping[str, float],
    ) -> bool:
        """Whether a copy of `adapter` is loading onto another engine: one already in flight, or
        one started now onto the engine its request would have loaded it on (module docstring)."""
        if self.loads.copier is None:
            return False
        if adapter in self.loads.copying:
            return True
        target = allowed_engines(order, loads, (), bound=bound, loading=loading, lately=lately)
        onto = [c for c in candidates if c.url in target]
        return bool(onto) and self.loads.copy(onto[0].url, adapter, capacity=self._capacity(onto[0]))

    def picked(self, decision: Decision, /) -> None:
        """Records the chosen engine as holding the request's adapter, and marks the placement as a
        load when it did not hold it (the `PostPick` hook)."""
        adapter = decision.cycle.request.lora_name
        if adapter is None:
            return
        chosen = decision.chosen.candidate
        loads = not holds(self.residency, chosen.snapshot, adapter)
        for evicted in self.residency.record(chosen.url, adapter, capacity=self._capacity(chosen)):
            self.loads.unmark(chosen.url, evicted)
        if loads:
            self.loads.mark(chosen.url, adapter)

    def _capacity(self, candidate: Candidate) -> int:
        if self.capacity is not None:
            return self.capacity
        engine = candidate.snapshot.engine
        load = None if engine is None else engine.stats.adapters
        if load is None or load.max_loras is None:
            return self.default_capacity
        return load.max_loras
