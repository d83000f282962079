"""The profile runner and the policies as stories over plain snapshots.

Pure: no servers, no clock but a hand-moved `FakeClock` and a counting timer. Requests carry token
ids directly; in-flight counts are set on the snapshots the way the registry would report them.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from tests.router.harness import FakeClock
from tests.router.scheduling_builders import A, B, C, D, candidate, cycle, host, request, snapshot, stats

from tandem.core.spec import ScoringWeights
from tandem.router.scheduling import ProfileScheduler, SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.picker import MaxScorePicker
from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.scheduling.runner import Decision, SchedulerProfile, Weighted
from tandem.router.scheduling.scorers import LoadScorer, PrefixScorer
from tandem.router.types import Endpoint, EndpointSnapshot, RequestView


class Fixed:
    """A scorer returning fixed scores (out-of-range ones included, to see the runner clamp)."""

    def __init__(self, name: str, scores: Mapping[Endpoint, float]) -> None:
        self.name = name
        self._scores = scores

    def score(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Mapping[str, float]:
        return {c.url: self._scores.get(c.endpoint, 0.0) for c in candidates}


class DropAll:
    name = "drop-all"

    def filter(self, cycle: Cycle, candidates: Sequence[Candidate], /) -> Sequence[Candidate]:
        return []


class Ticking:
    """A timer that advances 1 ms per call."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def profile(
    *scorers: tuple[str, Mapping[Endpoint, float], float], filters: Sequence[object] = ()
) -> SchedulerProfile:
    weighted = [Weighted(scorer=Fixed(name, scores), weight=w) for name, scores, w in scorers]
    return SchedulerProfile(name="p", filters=list(filters), scorers=weighted, picker=MaxScorePicker())  # type: ignore[arg-type]


def run(p: SchedulerProfile, candidates: Sequence[Candidate]) -> Decision:
    return p.run(cycle(), candidates, timer=Ticking())


def test_the_runner_clamps_weighs_and_sums() -> None:
    p = profile(("prefix", {A: 1.7, B: 0.5}, 3.0), ("load", {A: -2.0, B: 1.0}, 2.0))
    decision = run(p, [candidate(A), candidate(B)])
    totals = {host(s.candidate.endpoint): (s.total, dict(s.scores)) for s in decision.scored}
    assert totals == {
        "10.0.0.1": (3.0, {"prefix": 1.0, "load": 0.0}),
        "10.0.0.2": (3.5, {"prefix": 0.5, "load": 1.0}),
    }
    assert decision.endpoint == B
    assert decision.reason == "load"


def test_the_runner_times_every_plugin() -> None:
    p = profile(("prefix", {A: 1.0}, 3.0), filters=[ImbalanceGuard()])
    decision = run(p, [candidate(A), candidate(B)])
    assert set(decision.durations_s) == {"imbalance-guard", "prefix", "max-score"}
    assert all(seconds == pytest.approx(0.001) for seconds in decision.durations_s.values())


@pytest.mark.parametrize(
    ("candidates", "scores", "reason"),
    [
        pytest.param([candidate(A)], {A: 1.0}, "only-candidate", id="only-candidate"),
        pytest.param([candidate(A, matched=960), candidate(B)], {A: 1.0}, "prefix", id="prefix"),
        pytest.param([candidate(A), candidate(B, matched=10)], {A: 1.0}, "new-prefix", id="new-prefix"),
        pytest.param([candidate(A), candidate(B)], {}, "tie-break", id="tie-break"),
    ],
)
def test_the_runner_names_the_deciding_reason(
    candidates: list[Candidate], scores: dict[Endpoint, float], reason: str
) -> None:
    assert run(profile(("prefix", scores, 3.0)), candidates).reason == reason


def test_a_filter_that_removes_candidates_is_the_reason() -> None:
    guard = ImbalanceGuard(abs_threshold=4, rel_threshold=1.5)
    decision = run(profile(("prefix", {A: 1.0}, 3.0), filters=[guard]), [candidate(A, load=10), candidate(B)])
    assert (decision.endpoint, decision.reason, decision.offered, len(decision.scored)) == (
        B,
        "imbalance-guard",
        2,
        1,
    )


def test_a_filter_that_would_leave_nothing_is_ignored() -> None:
    decision = run(profile(("prefix", {B: 1.0}, 1.0), filters=[DropAll()]), [candidate(A), candidate(B)])
    assert decision.endpoint == B


def test_the_runner_refuses_no_candidates() -> None:
    with pytest.raises(ValueError, match="no candidates"):
        run(profile(), [])


# -- policies on the scheduling state ------------------------------------------------------------

PROMPT = tuple(range(1, 1001))  # 62 full blocks of 16 and 8 tokens


def prompt(group: int, question: int) -> tuple[int, ...]:
    """A 1,000-token shared prefix per group plus a 20-token question."""
    return tuple(group * 100_000 + t for t in PROMPT) + tuple(
        range(9_000_000 + question * 20, 9_000_020 + question * 20)
    )


def tandem(state: SchedulingState, **deps: object) -> ProfileScheduler:
    scheduler = scheduler_for("tandem", SchedulerDeps(state=state, **deps))  # type: ignore[arg-type]
    assert isinstance(scheduler, ProfileScheduler)
    return scheduler


def send(
    scheduler: ProfileScheduler,
    state: SchedulingState,
    tokens: tuple[int, ...],
    snaps: list[EndpointSnapshot],
    rid: str,
) -> Decision:
    """Pick, then tell the state the attempt started (as the dispatcher does)."""
    view = request(tokens, request_id=rid)
    decision = scheduler.decide("decode", view, snaps)
    state.started(decision.endpoint, view)
    return decision


def test_tandem_sends_a_shared_prefix_where_it_is_cached_and_new_ones_to_empty_caches() -> None:
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state)
    snaps = [snapshot(e, engine=stats()) for e in (A, B, C, D)]
    chosen = [send(scheduler, state, prompt(g, q), snaps, f"{g}-{q}") for g in range(4) for q in range(3)]
    by_group = [{host(d.endpoint) for d in chosen[g * 3 : g * 3 + 3]} for g in range(4)]
    assert all(len(hosts) == 1 for hosts in by_group)  # each group stays on one engine
    assert set().union(*by_group) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}  # one each
    # The first goes to its home among equal caches (`PrefixScorer`), the rest follow the prefix.
    assert [d.reason for d in chosen[:3]] == ["new-prefix", "prefix", "prefix"]
    # No endpoint has answered yet, so each one computing a prompt is warming: a group's first
    # question goes to one that is not (slow start), its next ones follow its prefix there.
    assert [chosen[i].reason for i in (3, 6, 9)] == ["slow-start"] * 3


def test_a_new_engines_empty_cache_does_not_draw_new_prompts_past_its_queue() -> None:
    """At a scale-up the new engine's cache is empty and the others' full of routed prefixes. A prompt
    cached nowhere goes by cache fill among the least loaded (within one request): to the new engine
    while it is among them, not once its queue is longer."""
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state)
    for g in range(40):  # A and B served many groups; C has just joined
        state.approximate.record((A if g % 2 else B).url, request(prompt(g, 0)))
    idle = [snapshot(e, engine=stats()) for e in (A, B, C)]
    first = request(prompt(100, 0), request_id="n0")
    assert host(scheduler.decide("decode", first, idle).endpoint) == "10.0.0.3"  # loads equal
    ticket = state.started(C, first)
    state.answered(ticket, status=200, streamed=True)  # C has answered: not warming
    busy = [snapshot(A, in_flight=1, engine=stats()), snapshot(B, in_flight=2, engine=stats())]
    decision = send(scheduler, state, prompt(101, 0), [*busy, snapshot(C, in_flight=3, engine=stats())], "n1")
    assert host(decision.endpoint) == "10.0.0.1"


def test_slow_start_gives_an_engine_one_new_prompt_until_it_answers() -> None:
    """An engine that has not answered yet (its speed unknown, its first answers its slowest) gets one
    new prompt at a time; a prompt whose prefix it holds may follow; once it answers it takes its share."""
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state, weights=ScoringWeights(load=0, kv=0, ttft=0))  # prefix alone: C is emptiest
    for g in range(40):
        state.approximate.record((A if g % 2 else B).url, request(prompt(g, 0)))
    snaps = [snapshot(e, engine=stats()) for e in (A, B, C)]
    first = request(prompt(100, 0), request_id="n0")
    assert scheduler.decide("decode", first, snaps).endpoint == C
    ticket = state.started(C, first)
    assert state.ahead(C.url) == math.inf  # the hold sends nothing more there either
    assert state.estimate_ttft(C.url, request(prompt(104, 0))) == math.inf  # nor the conversion check
    second = scheduler.decide("decode", request(prompt(101, 0), request_id="n1"), snaps)
    assert second.endpoint != C and second.reason == "slow-start"
    follower = scheduler.decide("decode", request(prompt(100, 1), request_id="f1"), snaps)
    assert follower.endpoint == C  # its group's prefix is there
    state.answered(ticket, status=500, streamed=False)  # an error proves nothing
    retry = state.started(C, request(prompt(100, 0), request_id="n0-retry"))
    assert state.warming(C.url)
    # Any answer ends it, even one that tells nothing of its speed (not streamed, so no TTFT sample).
    state.answered(retry, status=200, streamed=False)
    third = state.started(C, request(prompt(103, 0), request_id="n3"))
    assert not state.warming(C.url) and state.ahead(C.url) < math.inf
    # A new prompt does not queue behind another one's prefill; once that has answered, C takes it.
    assert scheduler.decide("decode", request(prompt(102, 0), request_id="n2"), snaps).endpoint != C
    state.answered(third, status=200, streamed=True)
    assert scheduler.decide("decode", request(prompt(102, 0), request_id="n2"), snaps).endpoint == C


def test_an_engine_that_served_others_is_warm_to_a_gateway_that_has_just_started() -> None:
    """Warmth is read from the engine's own counters: an engine that finished requests for anyone
    (`served` > 0) is not new to a fresh gateway; one that restarted since (its start time changed) is
    new again, and its routed-prefix picture is emptied (its cache is)."""
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state, weights=ScoringWeights(load=0, kv=0, ttft=0))  # prefix alone: C is emptiest
    for g in range(40):
        state.approximate.record((A if g % 2 else B).url, request(prompt(g, 0)))
    warm = [snapshot(e, engine=stats(served=500, started=1000.0)) for e in (A, B, C)]
    first = request(prompt(100, 0), request_id="n0")
    assert scheduler.decide("decode", first, warm).endpoint == C
    state.started(C, first)
    assert not state.warming(C.url), "it served 500 requests before this gateway started"
    _, scored = state.candidates("decode", request(prompt(101, 0)), warm, profile="prompt")
    assert not any(c.warming for c in scored), "the slow-start filter has nothing to drop"
    # C restarts: a new start time, nothing served yet. New again, its picture emptied.
    state.approximate.record(C.url, request(prompt(7, 0)))
    restarted = [*warm[:2], snapshot(C, engine=stats(served=0, started=2000.0))]
    decision = scheduler.decide("decode", request(prompt(102, 0), request_id="n2"), restarted)
    assert state.warming(C.url) and decision.endpoint != C
    assert state.approximate.match([C.url], request(prompt(7, 0)))[C.url] == 0


def test_a_decode_engine_that_has_not_answered_takes_one_prefilled_request_at_a_time() -> None:
    """A decode engine just added to a warm pool (nothing served) looks emptiest to the load scorer,
    so every prefilled request would go to it at once; it gets one until it answers, then its share.
    The warm engines (served > 0) are never held back, even with requests open."""
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state, weights=ScoringWeights())

    def loaded(request_id: str) -> RequestView:
        return dataclasses.replace(request(prompt(5, 0), request_id=request_id), kv_loaded=True)

    def snaps(new_in_flight: int) -> list[EndpointSnapshot]:
        warm = [snapshot(e, in_flight=3, engine=stats(running=3, served=50, started=1.0)) for e in (A, B)]
        return [*warm, snapshot(C, in_flight=new_in_flight, engine=stats(served=0, started=2.0))]

    first = loaded("p0")
    assert state.profile_for("decode", first) == "kv-loaded"
    assert scheduler.decide("decode", first, snaps(0)).endpoint == C
    ticket = state.started(C, first)
    second = scheduler.decide("decode", loaded("p1"), snaps(1))
    assert second.endpoint != C and second.reason == "slow-start"
    state.answered(ticket, status=200, streamed=True)
    assert scheduler.decide("decode", loaded("p2"), snaps(1)).endpoint == C


def test_the_imbalance_guard_spreads_a_dominant_prefix() -> None:
    """32 concurrent requests of one prefix, none finishing: without the guard all stay on the
    endpoint that caches it (prefix 3 outweighs load 2 and kv 2); with it, the load spreads."""

    def story(guard: ImbalanceGuard) -> tuple[Counter[str], Counter[str]]:
        state = SchedulingState(clock=FakeClock())
        scheduler = tandem(state, guard=guard, weights=ScoringWeights(ttft=0))
        in_flight: Counter[Endpoint] = Counter()
        reasons: Counter[str] = Counter()
        for i in range(32):
            snaps = [snapshot(e, in_flight=in_flight[e], engine=stats()) for e in (A, B, C, D)]
            decision = send(scheduler, state, prompt(0, i), snaps, f"r{i}")
            in_flight[decision.endpoint] += 1
            reasons[decision.reason] += 1
        return Counter({host(e): n for e, n in in_flight.items()}), reasons

    unguarded, _ = story(ImbalanceGuard(abs_threshold=1e9))
    assert list(unguarded.values()) == [32]  # all on the prefix's home
    guarded, reasons = story(ImbalanceGuard(abs_threshold=4, rel_threshold=1.5))
    assert max(guarded.values()) - min(guarded.values()) <= 5
    assert len(guarded) == 4
    assert reasons["imbalance-guard"] > 0


def test_after_a_prefill_decode_is_chosen_by_load_and_free_kv_only() -> None:
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state)
    tokens = prompt(0, 0)
    prefill = Endpoint("prefill", "http://10.0.1.1:8000")
    state.approximate.record(A.url, request(tokens))  # A caches the prompt, but is busier and fuller
    snaps = [snapshot(A, in_flight=3, engine=stats(kv_usage=0.6)), snapshot(B, engine=stats(kv_usage=0.1))]
    view = request(tokens, request_id="pd")
    assert scheduler.decide("decode", view, snaps).endpoint == A  # decode computes the prompt: prefix wins
    ticket = state.started(prefill, view)
    state.answered(ticket, status=200, streamed=False)
    view.kv_loaded = True  # the P/D stage records a good prefill on the request
    decision = scheduler.decide("decode", view, snaps)
    assert (decision.endpoint, decision.cycle.profile) == (B, "kv-loaded")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("least-load", "10.0.0.2"), ("prefix", "10.0.0.1"), ("tandem", "10.0.0.1"), ("round-robin", "10.0.0.1")],
)
def test_each_policy_chooses_by_its_rule(policy: str, expected: str) -> None:
    """A caches the prompt and has 2 requests in flight; B is idle."""
    state = SchedulingState(clock=FakeClock())
    state.approximate.record(A.url, request(PROMPT))
    scheduler = scheduler_for(policy, SchedulerDeps(state=state))
    snaps = [snapshot(A, in_flight=2), snapshot(B)]
    assert host(scheduler.pick("decode", request(PROMPT), snaps)) == expected


def test_the_prefix_policy_goes_least_loaded_when_the_pool_is_imbalanced() -> None:
    state = SchedulingState(clock=FakeClock())
    state.approximate.record(A.url, request(PROMPT))
    deps = SchedulerDeps(state=state, guard=ImbalanceGuard(abs_threshold=4, rel_threshold=1.5))
    scheduler = scheduler_for("prefix", deps)
    snaps = [snapshot(A, in_flight=9), snapshot(B, in_flight=3), snapshot(C, in_flight=5)]
    assert scheduler.pick("decode", request(PROMPT), snaps) == B


def test_decisions_reach_the_hook() -> None:
    seen: list[Decision] = []
    state = SchedulingState(clock=FakeClock())
    scheduler = scheduler_for("tandem", SchedulerDeps(state=state, on_decision=seen.append))
    scheduler.pick("decode", request(PROMPT), [snapshot(A), snapshot(B)])
    assert [(d.cycle.pool, d.cycle.prompt_tokens, d.reason) for d in seen] == [("decode", 1000, "new-prefix")]


def test_the_prefix_scorer_blends_by_the_configured_threshold() -> None:
    low, high = PrefixScorer(threshold=0.05), PrefixScorer(threshold=0.5)
    candidates = [candidate(A, matched=100, fill=0.5), candidate(B, fill=0.2)]
    assert low.score(cycle(prompt_tokens=1000), candidates)[B.url] == 0.0
    assert high.score(cycle(prompt_tokens=1000), candidates)[B.url] == pytest.approx(0.8)


def test_load_is_the_larger_of_the_routers_count_and_the_engines() -> None:
    state = SchedulingState(clock=FakeClock())
    snaps = [
        snapshot(A, in_flight=2, engine=stats(running=5, waiting=3)),
        snapshot(B, in_flight=4, engine=stats(running=1, waiting=0)),
        snapshot(C, in_flight=1, engine=stats(running=9, waiting=9), stale=True),
    ]
    _, candidates = state.candidates("decode", request(PROMPT), snaps, profile="prompt")
    assert [(c.load, c.kv_usage) for c in candidates] == [(8.0, 0.0), (4.0, 0.0), (1.0, None)]
    assert LoadScorer().score(cycle(), candidates)[C.url] == 1.0


def test_a_large_pool_is_scored_on_a_shortlist_of_prefix_holders_the_least_busy_and_one_in_turn() -> None:
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state)
    pool = [Endpoint("decode", f"http://10.1.0.{i}:8000") for i in range(64)]
    snaps = [snapshot(e, in_flight=5 + i % 7) for i, e in enumerate(pool)]
    snaps[40] = snapshot(pool[40], in_flight=0)  # the least busy
    tokens = prompt(3, 0)
    for holder in (pool[10], pool[20]):
        state.approximate.record(holder.url, request(tokens))
    shortlist = state.shortlist(request(tokens), snaps, prompt_tokens=len(tokens))
    chosen = {s.endpoint for s in shortlist}
    assert {pool[10], pool[20], pool[40]} <= chosen and len(chosen) <= 2 + 3 + 1
    decision = scheduler.decide("decode", request(tokens), snaps)
    assert decision.endpoint in (pool[10], pool[20])  # the prompt's cache wins, as in a small pool
    assert decision.offered <= 6


def test_a_shortlist_keeps_the_least_busy_of_many_prefix_holders_and_of_the_pool() -> None:
    state = SchedulingState(clock=FakeClock())
    pool = [Endpoint("decode", f"http://10.1.0.{i}:8000") for i in range(64)]
    snaps = [snapshot(e, in_flight=50) for e in pool]
    holders = {10: 9, 20: 3, 30: 7, 40: 1, 50: 8, 60: 5}  # index → in flight
    for i, busy in holders.items():
        snaps[i] = snapshot(pool[i], in_flight=busy)
        state.approximate.record(pool[i].url, request(prompt(3, 0)))
    for i, busy in {5: 0, 6: 0, 7: 2, 8: 0}.items():  # the pool's least busy: ties keep pool order
        snaps[i] = snapshot(pool[i], in_flight=busy)
    shortlist = state.shortlist(request(prompt(3, 0)), snaps, prompt_tokens=len(prompt(3, 0)))
    kept = [s.endpoint for s in shortlist]
    # the 4 least busy holders (busiest first dropped), the 3 least busy of the pool, the next in turn
    assert kept == [pool[40], pool[20], pool[60], pool[30], pool[5], pool[6], pool[8], pool[1]]
