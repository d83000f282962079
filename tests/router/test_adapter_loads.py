"""An adapter load priced into the predicted TTFT (`tandem.router.scheduling.adapterload`): which
placements load, what they add to every candidate's prediction on that engine, how the load's cost is
learned apart from the prefill rate, and the gauges that show both.

Real: the `tandem` policy, its placement filter and the scheduling state over plain data
(`tests.router.scheduling_builders`); the dispatcher's calls (`started`, `answered`) are made by the
test with a hand-moved clock, as the gateway makes them around an attempt.
"""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from tests.router.harness import FakeClock, built_routing
from tests.router.scheduling_builders import A, B, C, D, snapshot, stats
from tests.router.test_gateway_lora import lora_config

from tandem.core.routerconfig import RouterConfig
from tandem.router.scheduling import ProfileScheduler, SchedulerDeps, scheduler_for
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.scorers import home_ranks
from tandem.router.scheduling.state import SchedulingState, Ticket
from tandem.router.types import AdapterLoad, Endpoint, EndpointSnapshot, EngineStats, RequestView, Route

SERVED = stats(served=100.0)
PRIOR_RATE = 8192.0
LOAD_S = 0.07


def view(adapter: str | None, request_id: str, tokens: int = 1000) -> RequestView:
    """A request of `tokens` prompt tokens that share no prefix with another request's."""
    start = 1 + sum(map(ord, request_id)) * 10_000
    prompt = tuple(range(start, start + tokens))
    return RequestView(
        request_id=request_id, route=Route.COMPLETIONS, lora_name=adapter, prompt_token_ids=prompt
    )


class Gateway:
    """The `tandem` policy over engines A–D, with load pricing, and the dispatcher's calls."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.loads = AdapterLoads(prior_seconds=LOAD_S)
        self.state = SchedulingState(clock=self.clock, adapter_loads=self.loads)
        scheduler = scheduler_for("tandem", SchedulerDeps(state=self.state, adapters=True))
        assert isinstance(scheduler, ProfileScheduler)
        self.scheduler = scheduler
        self.in_flight = dict.fromkeys((e.url for e in (A, B, C, D)), 0)

    def predictions(self, request: RequestView) -> dict[str, float]:
        _, scored = self.state.candidates("decode", request, self.snapshots(), profile="prompt")
        return {c.url: c.predicted_ttft_s for c in scored}

    def send(self, request: RequestView) -> Ticket:
        endpoint = self.scheduler.pick("decode", request, self.snapshots())
        self.in_flight[endpoint.url] += 1
        ticket = self.state.started(endpoint, request)
        assert isinstance(ticket, Ticket)
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        self.state.answered(ticket, status=200, streamed=True)
        self.state.finished(ticket)
        self.in_flight[ticket.endpoint.url] -= 1

    def snapshots(self) -> list[EndpointSnapshot]:
        """Engines that have served before (not new: no slow start) and report no adapters."""
        return [snapshot(e, in_flight=self.in_flight[e.url], engine=SERVED) for e in (A, B, C, D)]


def prefill(tokens: float) -> float:
    return tokens / PRIOR_RATE


def test_the_first_placement_of_an_adapter_is_priced_with_its_load_and_the_next_with_the_load_ahead() -> None:
    """The first `sql` request may go anywhere and loads wherever it goes: every engine predicts
    prefill + ℓ. The second finds its home loading: there it waits for that load but loads nothing
    itself (prefill of both prompts + ℓ); elsewhere it would load (its prefill + ℓ)."""
    gw = Gateway()
    first = view("sql", "1")
    assert gw.predictions(first) == pytest.approx(dict.fromkeys(gw.in_flight, prefill(1000) + LOAD_S))
    ticket = gw.send(first)
    home = ticket.endpoint.url
    assert (ticket.adapter_load, ticket.loads_ahead) == (True, 0)
    assert ticket.predicted_ttft_s == pytest.approx(prefill(1000) + LOAD_S)
    assert gw.loads.in_flight(home) == 1

    second = view("sql", "2")
    expected = dict.fromkeys(gw.in_flight, prefill(1000) + LOAD_S)
    expected[home] = prefill(2000) + LOAD_S  # the first one's prompt and load are ahead of it
    assert gw.predictions(second) == pytest.approx(expected)
    again = gw.send(second)
    assert again.endpoint.url == home  # the adapter's home, and its holder
    assert (again.adapter_load, again.loads_ahead) == (False, 1)


def test_a_base_model_request_is_priced_with_the_loads_in_flight_on_each_engine() -> None:
    """A load stalls the engine's step, so a base-model request's first token there waits for it."""
    gw = Gateway()
    home = gw.send(view("sql", "1")).endpoint.url
    gw.in_flight[home] = 0  # the same load, no queue: only the load tells the engines apart
    base = gw.predictions(view(None, "b", tokens=10))
    assert base[home] == pytest.approx(prefill(1000 + 10) + LOAD_S)
    assert {url: p for url, p in base.items() if url != home} == pytest.approx(
        {url: prefill(10) for url in gw.in_flight if url != home}
    )


def test_a_loading_request_teaches_the_load_cost_and_not_the_prefill_rate() -> None:
    """Its first token after prefill + 30 ms: the load cost is learned as 30 ms (the first sample),
    the prefill model is untouched; a request of the held adapter after it teaches the rate."""
    gw = Gateway()
    ticket = gw.send(view("sql", "1"))
    home = ticket.endpoint.url
    gw.clock.advance(prefill(1000) + 0.03)
    gw.first_token(ticket)
    assert gw.loads.cost(home) == pytest.approx(0.03)
    assert gw.loads.in_flight(home) == 0
    assert gw.state.rates.observations(home) == 0
    assert gw.loads.cost(B.url if home != B.url else A.url) == pytest.approx(0.03)  # the pool's mean

    held = gw.send(view("sql", "2"))
    assert held.endpoint.url == home and not held.adapter_load
    gw.clock.advance(0.25)
    gw.first_token(held)
    assert gw.state.rates.observations(home) == 1
    assert gw.state.rates.rate(home) == pytest.approx(1000 / 0.25)
    assert gw.loads.observations(home) == 1


def test_a_request_behind_a_load_teaches_the_rate_without_the_stall() -> None:
    """A held adapter's request sent while another adapter's load is in flight on the same engine:
    its first token after 0.2 s counts as 0.2 − ℓ of prefill for the work ahead of it."""
    gw = Gateway()
    first = gw.send(view("sql", "1"))
    home = first.endpoint.url
    gw.clock.advance(prefill(1000) + LOAD_S)
    gw.first_token(first)  # the load cost learned as the prior
    loading = gw.send(view("sql", "2", tokens=500))
    assert loading.endpoint.url == home and not loading.adapter_load
    gw.loads.mark(home, "math")  # another adapter placed there, as the placement marks it
    other = gw.state.started(Endpoint("decode", home), view("math", "3", tokens=10))
    assert isinstance(other, Ticket) and other.adapter_load
    behind = gw.state.started(Endpoint("decode", home), view("sql", "4", tokens=300))
    assert isinstance(behind, Ticket) and (behind.adapter_load, behind.loads_ahead) == (False, 1)
    gw.clock.advance(0.2)
    gw.state.answered(behind, status=200, streamed=True)
    work = behind.queued_before + behind.uncached_tokens
    assert gw.state.rates.rate(home) == pytest.approx(work / (0.2 - LOAD_S))


def test_an_engine_running_the_adapter_for_another_gateway_needs_no_load() -> None:
    """Its `vllm:lora_requests_info` names the adapter: held, so nothing is added there."""
    loads = AdapterLoads(prior_seconds=LOAD_S)
    running = EngineStats(
        running=1, waiting=0, kv_usage=0.1, block_size=16, num_gpu_blocks=1000,
        adapters=AdapterLoad(running=frozenset({"sql"}), waiting=frozenset(), max_loras=4),
    )  # fmt: skip
    assert not loads.needs_load(snapshot(A, engine=running), "sql")
    assert loads.needs_load(snapshot(A, engine=running), "math")
    assert loads.needs_load(snapshot(B), "sql")
    assert not loads.needs_load(snapshot(B), None)


def test_a_placement_evicted_from_the_record_before_its_attempt_started_is_not_claimed() -> None:
    """One engine with a CPU tier of 4: `a0` placed, then four other adapters placed before `a0`'s
    attempt starts; the record forgot `a0` (its weights may be gone), so its mark goes too and the
    late attempt is not counted as a load in flight. The four others each claim theirs."""
    gw = Gateway()
    pick = [snapshot(A, engine=SERVED)]
    first = gw.scheduler.pick("decode", view("a0", "0"), pick)
    for i in range(1, 5):
        assert gw.scheduler.pick("decode", view(f"x{i}", str(i)), pick) == first
    assert not gw.loads.residency.holds(A.url, "a0")
    late = gw.state.started(first, view("a0", "0"))
    assert isinstance(late, Ticket) and not late.adapter_load
    claimed = [gw.state.started(first, view(f"x{i}", str(i))) for i in range(1, 5)]
    assert all(isinstance(t, Ticket) and t.adapter_load for t in claimed)
    assert gw.loads.in_flight(A.url) == 4


@pytest.mark.parametrize(("policy", "priced"), [("tandem", True), ("round-robin", False)])
async def test_the_gauges_show_each_engines_load_cost_and_loads_in_flight(policy: str, priced: bool) -> None:
    """`/metrics` of a service with adapters under the `tandem` policy shows the learned (here:
    prior) load cost and the loads in flight per engine; other policies price nothing."""
    document = lora_config(["http://127.0.0.1:1"]).model_dump(by_alias=True, exclude_none=True)
    document["spec"]["router"] = {**document["spec"].get("router", {}), "policy": policy}
    built = await built_routing(RouterConfig.model_validate(document), ["http://127.0.0.1:1"])
    assert (built.routing.state.adapter_loads is not None) is priced
    page = generate_latest(built.prometheus).decode()
    assert ('tandem_router_endpoint_adapter_load_seconds{endpoint="127.0.0.1:1"} 0.05' in page) is priced
    assert ('tandem_router_endpoint_adapter_loads_in_flight{endpoint="127.0.0.1:1"} 0.0' in page) is priced


def test_a_load_avoids_an_engine_already_loading_when_the_pools_requests_are_even() -> None:
    """Every engine with one request in flight, one of them also loading `sql`: a cold adapter whose
    first engine is that one is loaded on the next of its order, not stacked behind the other load."""
    gw = Gateway()
    loading = gw.send(view("sql", "1")).endpoint.url
    colds = [f"c{i}" for i in range(1000) if home_ranks(f"c{i}", list(gw.in_flight))[loading] == 0]
    cold, other = colds[:2]
    ranks = home_ranks(cold, list(gw.in_flight))
    second = min((u for u in gw.in_flight if u != loading), key=ranks.__getitem__)
    gw.in_flight.update(dict.fromkeys(gw.in_flight, 1))
    assert gw.scheduler.pick("decode", view(cold, "2"), gw.snapshots()).url == second
    gw.loads.settled(loading)  # its first token: another such adapter now goes to its first engine
    assert gw.scheduler.pick("decode", view(other, "3"), gw.snapshots()).url == loading


def test_a_load_taken_ahead_of_its_request_is_the_engines_load_and_holds_up_no_copy_elsewhere() -> None:
    """P/D's decode-side read (`take_load`, `tandem.router.pd.prefetch`): the placement's mark on
    the decode engine becomes a load in flight there, the request no longer loads; a hot copy of the
    same adapter onto another engine (the prefill pool's, say) may still start, one onto this engine
    may not; when the read ends the engine holds the adapter with the capacity it was recorded with."""
    loads, started = AdapterLoads(), list[tuple[str, ...]]()
    a, b = A.url, B.url

    def start(*asked: str) -> bool:
        started.append(asked)
        return True

    loads.residency.record(a, "sql", capacity=6)
    assert not loads.take_load(a, "sql", start=start), "no mark: no load"
    loads.mark(a, "sql")
    assert not loads.take_load(a, "sql", start=lambda *_: False), "refused: the request still loads it"
    assert loads.take_load(a, "sql", start=start)
    assert started == [(a, "sql")] and loads.in_flight(a) == 1 and loads.copying == {}
    assert loads.started(a, "sql") == (False, 1), "the request waits for the read, and is not a load"
    assert not loads.copy(a, "sql", capacity=6, start=lambda *_: True), "no second read onto A"
    assert loads.copy(b, "sql", capacity=6, start=lambda *_: True), "a copy onto another engine may start"
    for name in ("x", "y", "z", "w", "v"):
        loads.residency.record(a, name, capacity=6)
    loads.copy_done(a, "sql", ok=True)
    assert loads.in_flight(a) == 0 and loads.residency.holds(a, "sql")
    assert len(loads.residency.adapters(a)) == 6 and loads.residency.adapters(a)[-1] == "sql"
