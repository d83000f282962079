"""Adapter placement (`tandem.router.scheduling.adapterplace`): the load bound and the allowed engines
as tables, the residency record, the filter over candidates, and the `tandem` policy placing
adapter requests with it (a cold adapter stays home, a hot one spreads within the bound).

Real: the pure functions, the filter, the profiles and the scheduling state over plain data
(`tests.router.scheduling_builders`). Nothing is faked but the scheduling state's clock; engine
loads are the `in_flight` counts of hand-built snapshots, raised by the test as requests are
placed (no request finishes).
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from prometheus_client import CollectorRegistry
from tests.router.harness import FakeClock
from tests.router.scheduling_builders import A, B, C, D, candidate, host, snapshot
from tests.router.test_gateway_lora import lora_config

from tandem.core.routerconfig import RouterConfig
from tandem.router.compose.routing import build_routing
from tandem.router.config import resolve
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.scheduling import ProfileScheduler, Scheduler, SchedulerDeps, scheduler_for
from tandem.router.scheduling.adapterload import Residency
from tandem.router.scheduling.adapterplace import (
    COPY_SLACK,
    MIN_BOUND,
    AdapterPlacement,
    allowed_engines,
    load_bound,
)
from tandem.router.scheduling.plugins import Cycle, Scored
from tandem.router.scheduling.runner import Decision
from tandem.router.scheduling.scorers import AdapterAffinityScorer, home_ranks
from tandem.router.scheduling.state import SchedulingState
from tandem.router.settings import RouterSettings
from tandem.router.types import AdapterLoad, Endpoint, EngineStats, RequestView, Route
from tandem.router.workers.bus import SoloBus

URLS = [e.url for e in (A, B, C, D)]


def order(adapter: str, urls: list[str] = URLS) -> list[str]:
    ranks = home_ranks(adapter, urls)
    return sorted(urls, key=ranks.__getitem__)


def view(adapter: str | None, request_id: str = "r") -> RequestView:
    return RequestView(request_id=request_id, route=Route.COMPLETIONS, lora_name=adapter)


def cycle_for(adapter: str | None) -> Cycle:
    return Cycle(pool="decode", profile="prompt", request=view(adapter), prompt_tokens=100, slo_ttft_s=1.0)


# -- the bound and the allowed engines ------------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "epsilon", "floor", "expected"),
    [
        pytest.param([0, 0, 0, 0], 0.25, 2, 2, id="an-idle-pool-takes-the-floor"),
        pytest.param([3, 1, 0, 0], 0.25, 1, 2, id="ceil(1.25*5/4)=2"),
        pytest.param([3, 1, 0, 0], 0.25, 3, 3, id="the-floor-above-it"),
        pytest.param([8, 8, 8, 8], 0.25, 2, 11, id="ceil(1.25*33/4)=11"),
        pytest.param([10, 10, 0, 0], 0.0, 1, 6, id="no-slack:ceil(21/4)=6"),
        pytest.param([4, 4, 4, 4], 1.0, 2, 9, id="twice-the-mean:ceil(2*17/4)=9"),
        pytest.param([2, 2, 2, 2], 0.5, 1, 4, id="exact:1.5*9/4=3.375->4"),
        pytest.param([1, 1, 0, 1], 0.0, 1, 1, id="exact:4/4=1"),
    ],
)
def test_the_bound_is_the_mean_load_with_the_new_request_times_one_plus_epsilon(
    loads: list[float], epsilon: float, floor: int, expected: int
) -> None:
    assert load_bound(loads, epsilon=epsilon, floor=floor) == expected


def test_the_default_bound_is_at_least_the_floor() -> None:
    assert load_bound([0, 0, 0, 0]) == MIN_BOUND == 3


@pytest.mark.parametrize(
    ("loads", "holders", "expected"),
    [
        pytest.param({"a": 0, "b": 0, "c": 0}, set(), ["a"], id="an-idle-pool-loads-at-the-first"),
        pytest.param({"a": 1, "b": 0, "c": 0}, set(), ["b"], id="a-load-goes-to-the-least-busy"),
        pytest.param({"a": 1, "b": 1, "c": 0}, set(), ["c"], id="the-least-busy-wherever-in-the-order"),
        pytest.param({"a": 2, "b": 5, "c": 0}, set(), ["c"], id="skips-every-engine-at-or-over"),
        pytest.param({"a": 1, "b": 0, "c": 1}, {"c"}, ["c"], id="a-holder-under-the-bound-wins-over-idle"),
        pytest.param({"a": 1, "b": 0, "c": 0}, {"a", "c"}, ["a", "c"], id="every-holder-under-it"),
        pytest.param({"a": 1, "b": 1, "c": 2}, {"c"}, ["a"], id="a-holder-at-the-bound-does-not"),
        pytest.param({"a": 2, "b": 2, "c": 2}, set(), [], id="nothing-under-the-bound"),
    ],
)
def test_an_adapter_goes_to_its_holders_under_the_bound_else_its_load_to_the_least_busy(
    loads: dict[str, float], holders: set[str], expected: list[str]
) -> None:
    assert allowed_engines(["a", "b", "c"], loads, holders, bound=2) == expected


@pytest.mark.parametrize(
    ("loads", "loading", "lately", "expected"),
    [
        pytest.param({"a": 0, "b": 1, "c": 2}, {}, {}, ["a"], id="nothing-loading:the-least-busy-now"),
        pytest.param({"a": 0, "b": 1, "c": 2}, {"a": 1}, {}, ["b"], id="a-load-in-flight-counts-twice"),
        pytest.param({"a": 0, "b": 2, "c": 2}, {"a": 1}, {}, ["a"], id="twice-ties-to-the-order"),
        pytest.param({"a": 0, "b": 1, "c": 1}, {}, {"a": 3.0, "b": 1.0}, ["c"], id="busy-lately-passed-by"),
        pytest.param({"a": 0, "b": 1, "c": 1}, {}, {"a": 0.5}, ["a"], id="quiet-lately-still-least"),
    ],
)
def test_a_load_goes_where_requests_now_and_lately_and_loads_in_flight_stall_least(
    loads: dict[str, float], loading: dict[str, int], lately: dict[str, float], expected: list[str]
) -> None:
    assert allowed_engines(["a", "b", "c"], loads, set(), bound=3, loading=loading, lately=lately) == expected


# -- residency ------------------------------------------------------------------------------------


def test_residency_is_an_lru_per_engine_of_its_capacity() -> None:
    held = Residency()
    for adapter in ("x", "y", "z"):
        held.record("e1", adapter, capacity=2)
    assert held.adapters("e1") == ["y", "z"]
    held.record("e1", "y", capacity=2)  # used again: most recent
    held.record("e1", "w", capacity=2)  # evicts z, the least recent
    assert held.adapters("e1") == ["y", "w"]
    assert held.holds("e1", "w") and not held.holds("e1", "z") and not held.holds("e2", "w")


def test_residency_forgets_the_least_recent_engine_beyond_its_limit() -> None:
    held = Residency(max_engines=2)
    held.record("e1", "x", capacity=4)
    held.record("e2", "x", capacity=4)
    held.record("e1", "y", capacity=4)
    held.record("e3", "x", capacity=4)
    assert (held.adapters("e1"), held.adapters("e2"), held.adapters("e3")) == (["x", "y"], [], ["x"])


# -- the filter -----------------------------------------------------------------------------------


def test_a_base_model_request_keeps_every_candidate() -> None:
    candidates = [candidate(e, load=i) for i, e in enumerate((A, B, C, D))]
    assert AdapterPlacement().filter(cycle_for(None), candidates) == candidates


def test_an_adapter_request_keeps_only_its_holder_while_the_holder_is_under_the_bound() -> None:
    """The holder at 1, the others idle: the bound is 2, so the holder (not the least loaded) is the
    only engine left; a load-only policy would take an idle one and load the adapter there."""
    holder = order("sql")[2]
    placement = AdapterPlacement()
    placement.residency.record(holder, "sql", capacity=4)
    candidates = [candidate(e, load=1.0 if e.url == holder else 0.0) for e in (A, B, C, D)]
    assert [c.url for c in placement.filter(cycle_for("sql"), candidates)] == [holder]


def test_an_adapter_held_nowhere_is_loaded_on_the_least_busy_engine() -> None:
    """Its first engine busy, another idle: the load goes where it stalls fewest requests."""
    first, second, third, fourth = order("sql")
    loads = {first: 2.0, second: 1.0, third: 0.0, fourth: 1.0}
    candidates = [candidate(e, load=loads[e.url]) for e in (A, B, C, D)]
    assert [c.url for c in AdapterPlacement().filter(cycle_for("sql"), candidates)] == [third]


def test_a_load_avoids_an_engine_busy_lately_in_the_instant_it_is_idle() -> None:
    """A hot adapter's engine busy over the last decisions (4 requests while the others hold 1), then
    idle for an instant between two of its requests: a cold adapter's load goes to a quiet engine,
    not to the one the burst will fill again while the load stalls its step. Without the past
    decisions (a fresh placement) the instant decides, and the load lands on the burst's engine."""
    burst, quiet = order("cold")[0], order("cold")[1]
    busy = [candidate(e, load=4.0 if e.url == burst else 1.0) for e in (A, B, C, D)]
    now = [candidate(e, load=0.0 if e.url == burst else 1.0) for e in (A, B, C, D)]
    placement = AdapterPlacement()
    for _ in range(20):  # base-model decisions: they feed the engines' load lately too
        assert placement.filter(cycle_for(None), busy) == busy
    assert [c.url for c in AdapterPlacement().filter(cycle_for("cold"), now)] == [burst]
    assert [c.url for c in placement.filter(cycle_for("cold"), now)] == [quiet]


def test_the_load_lately_forgets_engines_that_left_the_pool() -> None:
    placement = AdapterPlacement()
    for i in range(20):
        gone = [candidate(e) for e in (A, B)] + [candidate(Endpoint("decode", f"http://10.0.9.{i}:8000"))]
        placement.filter(cycle_for(None), gone)
    placement.filter(cycle_for(None), [candidate(e) for e in (A, B, C, D)])
    assert len(placement.lately["decode"]) <= 2 * 4 + 8
    assert {A.url, B.url, C.url, D.url} <= set(placement.lately["decode"])


def test_the_load_lately_is_kept_per_pool() -> None:
    """The filter serves both profiles: a prefill pool of one engine does not prune the decode
    pool's twenty (a pruning against the calling pool's size would)."""
    placement = AdapterPlacement()
    many = [candidate(Endpoint("decode", f"http://10.0.8.{i}:8000")) for i in range(20)]
    placement.filter(cycle_for(None), many)
    prefill = Cycle(pool="prefill", profile="prompt", request=view(None), prompt_tokens=100, slo_ttft_s=1.0)
    for _ in range(3):
        placement.filter(prefill, [candidate(Endpoint("prefill", "http://10.0.7.1:8000"))])
    assert len(placement.lately["decode"]) == 20 and list(placement.lately["prefill"]) == [
        "http://10.0.7.1:8000"
    ]


def test_the_load_lately_weight_must_be_a_fraction() -> None:
    for weight in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="lately_weight"):
            AdapterPlacement(lately_weight=weight)


def test_an_engine_running_the_adapter_now_counts_as_holding_it() -> None:
    third = order("sql")[2]
    running = EngineStats(
        running=1,
        waiting=0,
        kv_usage=0.0,
        block_size=16,
        num_gpu_blocks=1000,
        adapters=AdapterLoad(running=frozenset({"sql"}), waiting=frozenset({"sql"}), max_loras=4),
    )
    snaps = [snapshot(e, engine=running if e.url == third else None) for e in (A, B, C, D)]
    candidates = [candidate(e)._replace(snapshot=s) for e, s in zip((A, B, C, D), snaps, strict=True)]
    kept = AdapterPlacement().filter(cycle_for("sql"), candidates)
    assert [c.url for c in kept] == [third]  # held there, not at its first engine


def test_the_affinity_scorer_scores_an_engine_the_gateway_sent_the_adapter_to_as_running() -> None:
    held = Residency()
    held.record(B.url, "sql", capacity=4)
    scored = AdapterAffinityScorer(residency=held).score(cycle_for("sql"), [candidate(A), candidate(B)])
    assert scored[B.url] == 1.0
    assert scored[A.url] < 1.0


# -- the policy -----------------------------------------------------------------------------------


def tandem_with_adapters() -> Scheduler:
    return scheduler_for("tandem", SchedulerDeps(state=SchedulingState(clock=FakeClock()), adapters=True))


def place(
    adapters: list[str], *, endpoints: tuple[Endpoint, ...] = (A, B, C, D), finish: bool
) -> tuple[list[Endpoint], list[int]]:
    """Places one request per name in `adapters` with the `tandem` policy; each raises its engine's
    in-flight count unless `finish` (then every request is over before the next). Returns the
    engines chosen and the largest in-flight count any engine had, after each placement."""
    scheduler = tandem_with_adapters()
    in_flight = Counter[str]()
    chosen: list[Endpoint] = []
    peaks: list[int] = []
    for i, adapter in enumerate(adapters):
        snaps = [snapshot(e, in_flight=in_flight[e.url]) for e in endpoints]
        endpoint = scheduler.pick("decode", view(adapter, request_id=str(i)), snaps)
        chosen.append(endpoint)
        if not finish:
            in_flight[endpoint.url] += 1
        peaks.append(max(in_flight.values(), default=0))
    return chosen, peaks


def test_each_adapters_repeated_requests_stay_on_its_home_engine() -> None:
    """40 adapters, 5 rounds of one request each, one at a time: every request of an adapter goes
    to the first engine of its rendezvous order, and the 40 adapters cover all four engines."""
    names = [f"a{i:03d}" for i in range(40)]
    chosen, _ = place(names * 5, finish=True)
    by_adapter: dict[str, set[str]] = {}
    for name, endpoint in zip(names * 5, chosen, strict=True):
        by_adapter.setdefault(name, set()).add(endpoint.url)
    assert by_adapter == {n: {order(n)[0]} for n in names}
    assert {u for homes in by_adapter.values() for u in homes} == set(URLS)


def test_an_adapter_stays_where_it_is_held_while_that_engine_is_busier_but_under_the_bound() -> None:
    """Placed once on an idle pool (its first engine), each later request finds that engine busier
    than every other (MIN_BOUND − 1 requests against none): it stays; at MIN_BOUND it is loaded on an
    idle one (the first of its order among them)."""
    scheduler = tandem_with_adapters()
    home, second = order("cold")[:2]
    assert (
        scheduler.pick("decode", view("cold", request_id="first"), [snapshot(e) for e in (A, B, C, D)]).url
        == home
    )
    for i in range(5):
        snaps = [snapshot(e, in_flight=MIN_BOUND - 1 if e.url == home else 0) for e in (A, B, C, D)]
        assert scheduler.pick("decode", view("cold", request_id=str(i)), snaps).url == home
    snaps = [snapshot(e, in_flight=MIN_BOUND if e.url == home else 0) for e in (A, B, C, D)]
    assert scheduler.pick("decode", view("cold", request_id="full"), snaps).url == second


def test_a_burst_of_one_adapter_spreads_in_its_rendezvous_order_within_the_bound() -> None:
    """32 requests of one adapter, none finishing: it fills its home to the bound, then the next
    engine in its order, and so on; no engine ever holds more than the bound of the loads it was
    placed against (ceil(1.5 · (ΣL + 1) / 4), at least MIN_BOUND), so at the end the largest share
    is at most ceil(1.5 · 32 / 4) = 12, 1.5 × the mean. Three engines hold 1.5 × 3 = 4.5 means, more
    than the burst's four: the last engine of its order stays free of it."""
    chosen, peaks = place(["hot"] * 32, finish=False)
    for placed, peak in enumerate(peaks):
        assert peak <= load_bound([placed / 4] * 4), (placed, peak)  # ΣL = placed, mean placed/4
    first, second = order("hot")[:2]
    assert [e.url for e in chosen[: MIN_BOUND + 1]] == [first] * MIN_BOUND + [second]
    counts = Counter(e.url for e in chosen)
    assert set(counts) == set(order("hot")[:3])
    assert max(counts.values()) <= 12


def test_the_placement_shared_by_both_profiles_learns_from_every_pick() -> None:
    """A decode pick after a prefill (`kv-loaded`) records the adapter too: the next prompt pick
    for that adapter may go there (a holder) as well as home."""
    scheduler = tandem_with_adapters()
    home, second = order("sql")[:2]
    busy = {home: MIN_BOUND}
    snaps = [snapshot(e, in_flight=busy.get(e.url, 0)) for e in (A, B, C, D)]
    prefilled = RequestView(request_id="1", lora_name="sql", kv_loaded=True)
    assert scheduler.pick("decode", prefilled, snaps).url == second  # home full: the next one
    snaps = [snapshot(e, in_flight={home: 1, second: 0}.get(e.url, 1)) for e in (A, B, C, D)]
    picks = {host(scheduler.pick("decode", view("sql", request_id=f"p{i}"), snaps)) for i in range(3)}
    assert picks == {host(Endpoint("decode", second))}  # both allowed; the idle holder wins


@pytest.mark.parametrize(
    ("lora", "expected"),
    [({"maxLoras": 2, "maxCpuLoras": 6}, 6), ({"maxLoras": 2}, 2)],
    ids=["max-cpu-loras", "defaults-to-max-loras"],
)
async def test_the_residency_record_is_the_declared_cpu_tier(lora: dict[str, int], expected: int) -> None:
    """`spec.engine.lora` sizes the gateway's record of what each engine holds (vLLM's
    `--max-cpu-loras`, default `--max-loras`), not the `max_lora` the engine reports (its GPU slots)."""
    document = lora_config(["http://127.0.0.1:1"]).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["engine"]["lora"] = lora
    config = resolve(RouterConfig.model_validate(document), RouterSettings())
    async with httpx.AsyncClient() as scrapes:
        routing = build_routing(
            config,
            registry=EndpointRegistry(failure_threshold=3, cooldown_seconds=1.0, clock=FakeClock()),
            prometheus=CollectorRegistry(),
            scrapes=scrapes,
            clock=FakeClock(),
            bus=SoloBus(),
        )
    assert isinstance(routing.scheduler, ProfileScheduler)
    placements = {
        f for p in routing.scheduler.profiles.values() for f in p.filters if isinstance(f, AdapterPlacement)
    }
    assert [p.capacity for p in placements] == [expected]
    # Through real decisions: an engine reporting max_lora 1 still keeps `expected` adapters.
    (placement,) = placements
    one_slot = EngineStats(
        running=0, waiting=0, kv_usage=0.0, block_size=16, num_gpu_blocks=1000,
        adapters=AdapterLoad(running=frozenset(), waiting=frozenset(), max_loras=1),
    )  # fmt: skip
    for i in range(expected + 3):
        routing.scheduler.decide("decode", view(f"a{i}", f"r{i}"), [snapshot(A, engine=one_slot)])
    assert placement.residency.adapters(A.url) == [f"a{i}" for i in range(3, expected + 3)]


# -- copies ahead of requests ---------------------------------------------------------------------


class Copier:
    """Records the copies asked for; `refuse` makes it decline (a copier pausing after a failure)."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.asked: list[tuple[str, str]] = []
        self.refuse = refuse

    def __call__(self, url: str, adapter: str) -> bool:
        self.asked.append((url, adapter))
        return not self.refuse


def pick(placement: AdapterPlacement, adapter: str, loads: dict[str, float], rid: str) -> str:
    """The filter, then the pick of the least loaded engine it allowed (as the load scorer would),
    told back to the placement; returns the URL."""
    candidates = [candidate(e, load=loads[e.url]) for e in (A, B, C, D)]
    cycle = Cycle(
        pool="decode", profile="prompt", request=view(adapter, rid), prompt_tokens=100, slo_ttft_s=1.0
    )
    allowed = placement.filter(cycle, candidates)
    chosen = min(allowed, key=lambda c: c.load)
    scored = Scored(candidate=chosen, total=1.0, scores={})
    placement.picked(
        Decision(cycle=cycle, chosen=scored, reason="test", offered=4, scored=(scored,), durations_s={})
    )
    return chosen.url


def test_a_hot_adapter_is_copied_to_another_engine_while_its_requests_stay_with_its_holder() -> None:
    """`sql` held on its home at the bound: without a copier the next request loads it on the least
    busy engine; with one, that engine gets a copy and the request stays home (within COPY_SLACK);
    once the copy is done, that engine holds `sql` and takes the next request at no load."""
    home, second, third, fourth = order("sql")
    loads = {home: 3.0, second: 1.0, third: 0.0, fourth: 1.0}  # bound max(3, ceil(1.5·6/4)) = 3

    plain = AdapterPlacement()
    plain.residency.record(home, "sql", capacity=4)
    assert pick(plain, "sql", loads, "0") == third  # a load on the least busy engine

    copier = Copier()
    placement = AdapterPlacement()
    placement.loads.copier = copier
    placement.residency.record(home, "sql", capacity=4)
    assert pick(placement, "sql", loads, "1") == home
    assert copier.asked == [(third, "sql")] and placement.loads.copying == {"sql": third}
    assert placement.loads.in_flight(third) == 1  # the copy stalls its engine like any load
    assert not placement.residency.holds(third, "sql")

    loads[home] = 4.0  # still within the slack (4 < 3 + 2), and one copy of an adapter at a time
    assert pick(placement, "sql", loads, "2") == home
    assert copier.asked == [(third, "sql")]

    placement.loads.copy_done(third, "sql", ok=True)
    assert placement.residency.holds(third, "sql") and placement.loads.in_flight(third) == 0
    assert pick(placement, "sql", loads, "3") == third
    assert placement.loads.in_flight(third) == 0  # no load: it holds the adapter


def test_past_the_slack_or_without_a_copy_a_request_loads_the_adapter_itself() -> None:
    """The holder beyond bound + COPY_SLACK: the request loads the adapter on the least busy engine
    other than the one being copied to (that one waits behind the copy). A copier that declines (paused
    after a failure) or a failed copy leaves the adapter spreading by loads, as without one."""
    home, second, third, fourth = order("sql")
    copier = Copier()
    placement = AdapterPlacement()
    placement.loads.copier = copier
    placement.residency.record(home, "sql", capacity=4)
    loads = {home: 3.0, second: 1.0, third: 0.0, fourth: 1.0}
    assert pick(placement, "sql", loads, "1") == home  # the copy to `third` starts
    loads = {home: 6.0, second: 1.0, third: 1.0, fourth: 1.0}  # bound ceil(1.5·10/4) = 4
    assert loads[home] >= load_bound(list(loads.values())) + COPY_SLACK
    chosen = pick(placement, "sql", loads, "2")
    assert chosen != home and chosen != third  # loads where no copy is in flight
    assert copier.asked == [(third, "sql")]

    placement.loads.copy_done(third, "sql", ok=False)
    assert not placement.residency.holds(third, "sql") and placement.loads.copying == {}
    assert placement.loads.in_flight(third) == 0

    declining = AdapterPlacement()
    declining.loads.copier = Copier(refuse=True)
    declining.residency.record(home, "sql", capacity=4)
    loads = {home: 3.0, second: 1.0, third: 0.0, fourth: 1.0}
    assert pick(declining, "sql", loads, "3") == third  # no copy: the request loads it
    assert declining.loads.copying == {}


def test_an_adapter_held_nowhere_is_loaded_by_its_request_not_copied() -> None:
    """The first request of an adapter must load it somewhere: a copy would only delay it."""
    copier = Copier()
    placement = AdapterPlacement()
    placement.loads.copier = copier
    loads = {e.url: 0.0 for e in (A, B, C, D)}
    assert pick(placement, "sql", loads, "1") == order("sql")[0]
    assert copier.asked == []
