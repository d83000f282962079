"""Pinned traffic (`tandem.router.scheduling.pinned`): a long new prompt is not placed on the engine
whose recent requests only its prefix cache could serve. Pure: plain candidates and decisions, and
one story through the `tandem` policy's scheduler with a hand-moved clock."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import generate_latest
from tests.router.harness import FakeClock, built_routing, router_config
from tests.router.scheduling_builders import A, B, C, D, candidate, request, snapshot, stats

from tandem.router.scheduling import ProfileScheduler, SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.pinned import PinnedTraffic
from tandem.router.scheduling.plugins import Candidate, Cycle, Scored
from tandem.router.scheduling.runner import Decision
from tandem.router.scheduling.scorers import ANCHOR_BLOCK_SIZE, ANCHOR_BLOCKS, PrefixScorer, rendezvous_weight
from tandem.router.types import Endpoint


def new_prompt(tokens: int, *, group: int = 1) -> Cycle:
    view = request(range(group * 100_000, group * 100_000 + tokens))
    return Cycle(pool="decode", profile="prompt", request=view, prompt_tokens=tokens, slo_ttft_s=1.0)


def decided(chosen: Endpoint, matched: dict[Endpoint, int], *, prompt_tokens: int = 1000) -> Decision:
    """A decision that chose `chosen` among candidates holding `matched` tokens of the prompt."""
    scored = [Scored(candidate=candidate(e, matched=m), total=0.0, scores={}) for e, m in matched.items()]
    best = next(s for s in scored if s.candidate.url == chosen.url)
    cycle = Cycle(
        pool="decode", profile="prompt", request=request(), prompt_tokens=prompt_tokens, slo_ttft_s=1.0
    )
    return Decision(
        cycle=cycle, chosen=best, reason="test", offered=len(scored), scored=scored, durations_s={}
    )


def urls(candidates: Sequence[Candidate]) -> list[str]:
    return [c.url.split("//")[1].split(":")[0] for c in candidates]


def test_a_decision_is_pinned_where_every_other_engine_would_compute_much_of_the_prompt() -> None:
    pinned = PinnedTraffic(threshold=0.3, weight=0.5)
    pinned.picked(decided(A, {A: 900, B: 0, C: 0}))  # only A holds it: pinned to A
    assert pinned.shares["decode"] == {A.url: 0.5, B.url: 0.0, C.url: 0.0}
    pinned.picked(decided(B, {A: 900, B: 900, C: 0}))  # A holds it too: B is not the only way
    assert pinned.shares["decode"] == {A.url: 0.25, B.url: 0.0, C.url: 0.0}
    pinned.picked(decided(C, {A: 750, B: 0, C: 900}))  # A would compute only a quarter: not pinned
    assert pinned.shares["decode"][C.url] == 0.0
    pinned.picked(decided(C, {A: 0, B: 0, C: 0}))  # a new prompt: once placed, only C holds it
    assert pinned.shares["decode"][C.url] == 0.5 and pinned.shares["decode"][A.url] == pytest.approx(0.0625)
    pinned.picked(decided(C, {C: 1000}))  # no other candidate: nothing to compare
    assert pinned.shares["decode"][C.url] == 0.5
    with pytest.raises(ValueError, match="weight and threshold"):
        PinnedTraffic(threshold=0.3, weight=0.0)


def test_an_engine_a_decision_did_not_score_decays_as_the_others() -> None:
    """In a pool above the shortlist size, or behind the slow-start filter, a decision scores some
    engines only: the others' shares still decay with every decision of the pool."""
    pinned = PinnedTraffic(threshold=0.3, weight=0.5)
    pinned.picked(decided(A, {A: 900, B: 0}))
    for _ in range(3):
        pinned.picked(decided(B, {B: 900, C: 900}))  # A is not among the candidates
    assert pinned.shares["decode"][A.url] == pytest.approx(0.5 * 0.5**3)


def test_a_long_new_prompt_keeps_only_the_least_pinned_engines_and_a_short_one_all() -> None:
    pinned = PinnedTraffic(threshold=0.3)
    everyone = [candidate(A), candidate(B), candidate(C)]  # 10,000 tokens/s each
    assert pinned.keep(new_prompt(5000), everyone) == everyone, "no decision seen: nothing changes"
    for _ in range(10):
        pinned.picked(decided(A, {A: 900, B: 0, C: 0}))
    assert pinned.shares["decode"][A.url] == pytest.approx(1 - 0.95**10)  # the docstring's 0.40
    assert urls(pinned.keep(new_prompt(5000), everyone)) == ["10.0.0.2", "10.0.0.3"]  # 0.5 s each
    assert pinned.keep(new_prompt(400), everyone) == everyone, "40 ms of prefill blocks nobody long"
    cached = [candidate(A), candidate(B, matched=4800), candidate(C)]  # B computes 20 ms of it
    assert pinned.keep(new_prompt(5000), cached) == cached
    assert urls(pinned.keep(new_prompt(5000), [candidate(A)])) == ["10.0.0.1"], "never none"
    busy = [candidate(A, queued=100), candidate(B, queued=3000), candidate(C, queued=100)]
    assert pinned.keep(new_prompt(5000), busy) == busy, "every engine has prompts to compute first"
    one_idle = [candidate(A, queued=0), candidate(B, queued=3000), candidate(C, queued=100)]
    assert urls(pinned.keep(new_prompt(5000), one_idle)) == ["10.0.0.2", "10.0.0.3"]


def home_of(cycle: Cycle, engines: Sequence[Endpoint]) -> Endpoint:
    anchor = cycle.request.block_keys(ANCHOR_BLOCK_SIZE)[ANCHOR_BLOCKS - 1]
    return max(engines, key=lambda e: rendezvous_weight(anchor, e.url))


def test_the_prefix_scorer_sends_a_long_new_prompt_home_unless_its_home_serves_pinned_traffic() -> None:
    engines = (A, B, C, D)
    group = next(g for g in range(1, 100) if home_of(new_prompt(5000, group=g), engines) == A)
    long_prompt, short_prompt = new_prompt(5000, group=group), new_prompt(400, group=group)
    assert home_of(short_prompt, engines) == A  # the anchor is the first 128 tokens: the same home
    equal = [candidate(e) for e in engines]
    pinned = PinnedTraffic(threshold=0.3)
    scorer = PrefixScorer(pinned=pinned)

    def best(cycle: Cycle) -> str:
        scores = scorer.score(cycle, equal)
        return max(scores, key=scores.__getitem__)

    assert best(long_prompt) == A.url, "no pinned traffic: its home"
    for _ in range(10):
        scorer.picked(decided(A, {A: 900, B: 0, C: 0, D: 0}))  # the scheduler's PostPick hook
    assert best(long_prompt) != A.url
    assert best(short_prompt) == A.url


def tandem(state: SchedulingState) -> ProfileScheduler:
    scheduler = scheduler_for("tandem", SchedulerDeps(state=state))
    assert isinstance(scheduler, ProfileScheduler)
    return scheduler


def test_the_tandem_policy_keeps_a_new_system_prompt_off_the_engine_a_hot_one_is_pinned_to() -> None:
    """Warm engines, one hot system prompt answered one request at a time on its engine; then a
    new 1,000-token system prompt whose home is that engine goes to another (at the prior's 8,192
    tokens/s its prefill is 0.12 s, which the hot prompt's requests would wait for)."""
    state = SchedulingState(clock=FakeClock())
    scheduler = tandem(state)
    snaps = [snapshot(e, engine=stats(served=100, started=1.0)) for e in (A, B, C, D)]

    def serve(tokens: range, rid: str) -> Endpoint:
        view = request(tokens, request_id=rid)
        chosen = scheduler.decide("decode", view, snaps).endpoint
        ticket = state.started(chosen, view)
        state.answered(ticket, status=200, streamed=False)
        state.finished(ticket)
        return chosen

    hot = serve(range(1000), "hot-0")
    assert all(serve(range(1000 + q), f"hot-{q}") == hot for q in range(1, 20)), "its prefix holds it"
    group = next(g for g in range(1, 100) if home_of(new_prompt(1000, group=g), (A, B, C, D)) == hot)
    assert serve(range(group * 100_000, group * 100_000 + 1000), "new") != hot


@pytest.mark.parametrize("policy", ["tandem", "round-robin"])
async def test_the_gateway_exports_each_engines_pinned_share_under_the_tandem_policy(policy: str) -> None:
    """`/metrics` shows `tandem_router_endpoint_pinned_share` per pool and engine once the `tandem`
    policy has decided (other policies keep none); an engine that left discovery is forgotten."""
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    built = await built_routing(router_config(decode=urls, spec={"router": {"policy": policy}}), urls)
    routing = built.routing
    assert (routing.state.pinned is not None) is (policy == "tandem")
    view = request(range(1000), request_id="r1")
    chosen = routing.scheduler.pick("decode", view, built.registry.snapshots("decode"))
    routing.state.started(chosen, view)
    page = generate_latest(built.prometheus).decode()
    name = chosen.url.split("//")[1]
    assert (f'tandem_router_endpoint_pinned_share{{endpoint="{name}",pool="decode"}} 0.05' in page) is (
        policy == "tandem"
    ), "a new prompt's placement is pinned where it went"
    if routing.state.pinned is not None:
        routing.state.forget([u for u in urls if u != chosen.url])
        assert chosen.url not in routing.state.pinned.shares["decode"]
