"""Adapter affinity: `vllm:lora_requests_info` read from an engine's page, the lora-affinity scorer as a
table, and the `tandem` policy placing an adapter's request with it.

Real: the parser over hand-written pages and over a `tandem sim` engine's own /metrics (with
`--enable-lora`, a `--lora-modules` adapter written to tmp_path, served by uvicorn on 127.0.0.1 and
read with httpx); the scorer, the profiles and the scheduling state over plain data
(`tests.router.scheduling_builders`). Nothing is faked but the clock of the scheduling state.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tests.router.harness import FakeClock
from tests.router.scheduling_builders import A, B, C, D, host, snapshot, stats
from tests.servers import run_uvicorn

from tandem.core.spec import ScoringWeights
from tandem.router.discovery.enginestats import NotEngineMetrics, parse_engine_metrics
from tandem.router.scheduling import SchedulerDeps, scheduler_for
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.plugins import Candidate, Cycle
from tandem.router.scheduling.scorers import ADAPTER_WEIGHT, HOME_BONUS, AdapterAffinityScorer, home_ranks
from tandem.router.scheduling.state import SchedulingState
from tandem.router.scheduling.tandem import tandem_profiles
from tandem.router.types import AdapterLoad, EndpointSnapshot, EngineStats, RequestView, Route
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

GAUGES = 'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0"} 0\n'


def info(running: str, waiting: str, max_lora: str, at: float) -> str:
    return (
        f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
        f'waiting_lora_adapters="{waiting}"}} {at}\n'
    )


# -- the metric ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        pytest.param("", None, id="no-series"),
        pytest.param(
            info("sql", "sql", "2", 1.7e9) + info("sql,chat", "sql,chat", "2", 1.8e9),
            AdapterLoad(running=frozenset({"sql", "chat"}), waiting=frozenset({"sql", "chat"}), max_loras=2),
            id="the-newest-series-wins",
        ),
        pytest.param(
            info("sql,chat", "", "4", 1.9e9) + info("math", "math", "4", 1.8e9),
            AdapterLoad(running=frozenset({"sql", "chat"}), waiting=frozenset(), max_loras=4),
            id="whatever-order-they-come-in",
        ),
        pytest.param(
            info("", "", "1", 1.7e9),
            AdapterLoad(running=frozenset(), waiting=frozenset(), max_loras=1),
            id="nothing-in-use",
        ),
        pytest.param(
            info("sql", "", "many", 1.7e9),
            AdapterLoad(running=frozenset({"sql"}), waiting=frozenset(), max_loras=None),
            id="a-max-that-is-no-number",
        ),
    ],
)
def test_the_adapters_in_use_are_the_newest_series_labels(series: str, expected: AdapterLoad | None) -> None:
    assert parse_engine_metrics(GAUGES + series).adapters == expected


def test_of_thousands_of_series_the_newest_is_read_wherever_it_is_and_in_any_form() -> None:
    """An engine that has served many adapters keeps a series per combination ever set: only the
    newest counts, found by value, whether written with a timestamp, blanks, or ties (the later)."""
    old = "".join(info(f"a{i % 97}", "", "4", 1.7e9 + i) for i in range(3000))
    newest = info("x,y", "y", "4", 1.8e9).replace(" 1800000000.0\n", "  1.8e9 17\n")  # a timestamp
    assert newest.endswith("}  1.8e9 17\n")
    tie = info("late", "", "4", 1.8e9)
    assert parse_engine_metrics(GAUGES + old + newest + old).adapters == AdapterLoad(
        running=frozenset({"x", "y"}), waiting=frozenset({"y"}), max_loras=4
    )
    assert parse_engine_metrics(GAUGES + newest + tie + old).adapters == AdapterLoad(
        running=frozenset({"late"}), waiting=frozenset(), max_loras=4
    )


@pytest.mark.parametrize("value", ["NaN", "+Inf", "soon", "1 2 3"])
def test_a_series_whose_value_is_no_finite_number_makes_the_page_unusable(value: str) -> None:
    """As for every sample read (`NotEngineMetrics`): a broken page, not a silently skipped line."""
    line = info("a", "", "4", 0).replace(" 0\n", f" {value}\n")
    with pytest.raises(NotEngineMetrics):
        parse_engine_metrics(GAUGES + info("b", "", "4", 1.7e9) + line)


def test_a_simulated_engines_page_names_the_adapter_it_ran(tmp_path: Path) -> None:
    adapter = tmp_path / "sql"
    adapter.mkdir()
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
    (adapter / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "tiny"}))
    settings = SimSettings.model_validate(
        {
            "profile": "tiny-cpu",
            "served_model_name": "qwen",
            "time_scale": 1,
            "enable_lora": True,
            "max_loras": 3,
            "lora_modules": [f"sql={adapter}"],
        }
    )
    with run_uvicorn(sim_app(settings, environ={})) as url, httpx.Client(base_url=url) as client:
        before = parse_engine_metrics(client.get("/metrics").text)
        body = {"model": "sql", "prompt": "hello", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()
            next(lines)  # the first chunk: the request runs
            during = parse_engine_metrics(client.get("/metrics").text)
            assert [line for line in lines if line][-1] == "data: [DONE]"
        after = parse_engine_metrics(client.get("/metrics").text)
    assert before.adapters is None  # no request yet: vLLM has not set the series
    assert during.adapters == AdapterLoad(running=frozenset({"sql"}), waiting=frozenset({"sql"}), max_loras=3)
    assert after.adapters == AdapterLoad(running=frozenset(), waiting=frozenset(), max_loras=3)


# -- the scorer ---------------------------------------------------------------------------------


def lora(running: str = "", waiting: str = "", max_loras: int | None = 2) -> EngineStats:
    load = AdapterLoad(
        running=frozenset(filter(None, running.split(","))),
        waiting=frozenset(filter(None, waiting.split(","))),
        max_loras=max_loras,
    )
    return EngineStats(running=0, waiting=0, kv_usage=0.0, block_size=16, num_gpu_blocks=1000, adapters=load)


def candidate(snap: EndpointSnapshot) -> Candidate:
    return Candidate(
        snapshot=snap,
        url=snap.endpoint.url,
        load=0.0,
        kv_usage=None,
        matched_tokens=0,
        cache_fill=0.0,
        queued_tokens=0,
        tokens_per_second=10_000.0,
        predicted_ttft_s=0.1,
    )


def view(adapter: str | None, tokens: tuple[int, ...] = (), request_id: str = "r") -> RequestView:
    return RequestView(
        request_id=request_id, route=Route.COMPLETIONS, prompt_token_ids=tokens, lora_name=adapter
    )


def scores(adapter: str | None, *snaps: EndpointSnapshot) -> list[float]:
    cycle = Cycle(pool="decode", profile="prompt", request=view(adapter), prompt_tokens=100, slo_ttft_s=1.0)
    scored = AdapterAffinityScorer().score(cycle, [candidate(s) for s in snaps])
    return [scored[s.endpoint.url] for s in snaps]


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(lora(running="sql,chat", waiting="sql,chat"), 1.0, id="running-it"),
        pytest.param(lora(running="chat"), 0.8, id="a-free-slot"),
        pytest.param(lora(running="chat", max_loras=None), 0.8, id="no-max-known"),
        pytest.param(stats(), 0.8, id="no-adapter-yet"),
        pytest.param(
            lora(waiting="sql,chat,math", running="chat,math", max_loras=3), 0.6, id="waiting-there"
        ),
        pytest.param(lora(running="chat,math"), 0.0, id="every-slot-taken"),
        pytest.param(lora(running="a,b", waiting="c", max_loras=3), 0.0, id="slots-counted-once-each"),
    ],
)
def test_an_adapters_request_prefers_its_adapter_then_a_free_slot(
    engine: EngineStats, expected: float
) -> None:
    # One candidate: it is the adapter's first home, which adds HOME_BONUS (capped at 1).
    assert scores("sql", snapshot(A, engine=engine)) == [pytest.approx(min(1.0, expected + HOME_BONUS))]


def test_an_unknown_or_stale_engine_is_neutral_and_the_base_model_has_no_preference() -> None:
    unknown, stale = snapshot(A), snapshot(B, engine=lora(running="sql"), stale=True)
    assert sorted(scores("sql", unknown, stale)) == [0.5, pytest.approx(0.5 + HOME_BONUS)]
    assert scores(None, snapshot(C, engine=lora(running="sql")), snapshot(D, engine=lora())) == [1.0, 1.0]


# -- the policy ---------------------------------------------------------------------------------


def test_the_tandem_policy_scores_adapter_affinity_only_for_a_service_with_adapters() -> None:
    guard = ImbalanceGuard()
    plain = tandem_profiles(ScoringWeights(), guard=guard)
    with_adapters = tandem_profiles(ScoringWeights(), guard=guard, adapters=True)
    assert "lora-affinity" not in {w.scorer.name for w in plain["prompt"].scorers}
    weights = {w.scorer.name: w.weight for w in with_adapters["prompt"].scorers}
    assert weights["lora-affinity"] == ADAPTER_WEIGHT == 4.0
    assert "lora-affinity" not in {w.scorer.name for w in with_adapters["kv-loaded"].scorers}


def test_an_adapters_request_goes_where_its_adapter_runs_else_to_its_home() -> None:
    """Equal loads and caches: `sql` (home C, a free slot) goes to B, which runs it; `math` goes to
    its home B although both B's slots are taken and C has a free one: placement keeps an adapter on
    its home engine (a wait for a slot there instead of a load on another engine)."""
    scheduler = scheduler_for(
        "tandem", SchedulerDeps(state=SchedulingState(clock=FakeClock()), adapters=True)
    )
    snaps = [
        snapshot(A, engine=lora(running="chat,code")),
        snapshot(B, engine=lora(running="sql,chat")),
        snapshot(C, engine=lora(running="chat")),
    ]
    sql = scheduler.pick("decode", view("sql", request_id="1"), snaps)
    math = scheduler.pick("decode", view("math", request_id="2"), snaps)
    urls = [s.endpoint.url for s in snaps]
    assert min(urls, key=home_ranks("sql", urls).__getitem__) == C.url
    assert min(urls, key=home_ranks("math", urls).__getitem__) == B.url
    assert (host(sql), host(math)) == ("10.0.0.2", "10.0.0.2")


def test_an_adapter_keeps_going_to_its_home_engine_and_adapters_spread_over_homes() -> None:
    """Free slots everywhere (nothing running): each adapter's requests go to the same engine, its
    first in rendezvous order, so its weights stay where they were loaded; 30 adapters spread over
    the three engines; an engine leaving moves only the adapters it was first for."""
    scheduler = scheduler_for(
        "tandem", SchedulerDeps(state=SchedulingState(clock=FakeClock()), adapters=True)
    )
    snaps = [snapshot(A, engine=lora()), snapshot(B, engine=lora()), snapshot(C, engine=lora())]
    names = [f"a{i:02d}" for i in range(30)]
    first = {n: host(scheduler.pick("decode", view(n, request_id=f"{n}-1"), snaps)) for n in names}
    again = {n: host(scheduler.pick("decode", view(n, request_id=f"{n}-2"), snaps)) for n in names}
    assert first == again
    assert len(set(first.values())) == 3
    urls = [s.endpoint.url for s in snaps]
    before = {n: min(urls, key=lambda u: home_ranks(n, urls)[u]) for n in names}
    after = {n: min(urls[:2], key=lambda u: home_ranks(n, urls[:2])[u]) for n in names}
    moved = {n for n in names if before[n] != after[n]}
    assert moved == {n for n in names if before[n] == urls[2]}
