"""Tandem's gateway replicas in the harness: their command lines, their /metrics counters over a run,
and how the report shows them.

Real: the pure functions of `tandem.bench.gateways` (Prometheus text written here in the gateway's
format, with `--workers`' `worker` label), `tandem.bench.harness.tandem_replicas` on a planned
gateway process, and `tandem.bench.report` on run summaries. Nothing is started or faked (the
harness test runs two real replicas).
"""

from __future__ import annotations

import pytest

from tandem.bench.counters import MetricsError
from tandem.bench.fairness import ServiceWeights
from tandem.bench.gateways import GatewayCounters, parse_gateway_counters, replica_report
from tandem.bench.harness import HarnessError, tandem_replicas
from tandem.bench.records import DriveResult
from tandem.bench.report import RunData, markdown_table, summarize
from tandem.local.plan import ProcessPlan

METRICS = """\
# TYPE tandem_router_requests counter
tandem_router_requests_total{route="/v1/chat/completions",status="200",worker="0"} 20.0
tandem_router_requests_total{route="/v1/chat/completions",status="200",worker="1"} 9.0
tandem_router_requests_total{route="/v1/completions",status="429",worker="0"} 1.0
tandem_router_requests_total{route="/metrics",status="200",worker="0"} 7.0
# TYPE tandem_router_shared_counter_syncs counter
tandem_router_shared_counter_syncs_total{outcome="ok",worker="0"} 40.0
tandem_router_shared_counter_syncs_total{outcome="ok",worker="1"} 38.0
tandem_router_shared_counter_syncs_total{outcome="error",worker="0"} 2.0
# TYPE tandem_router_upstream_errors counter
tandem_router_upstream_errors_total{endpoint="http://127.0.0.1:1",kind="connect"} 5.0
"""


def test_a_gateways_metrics_give_its_v1_requests_and_shared_counter_syncs_summed_over_workers() -> None:
    assert parse_gateway_counters(METRICS) == GatewayCounters(30, 78, 2)
    assert parse_gateway_counters("") == GatewayCounters(), "a gateway without replicas has no syncs"
    with pytest.raises(MetricsError):
        parse_gateway_counters("tandem_router_requests_total{route=} nope\n")


def test_each_replica_reports_its_deltas_over_the_run_or_its_scrape_error() -> None:
    before: dict[str, GatewayCounters | str] = {"a": GatewayCounters(2, 3, 0), "b": GatewayCounters(0, 1, 0)}
    after: dict[str, GatewayCounters | str] = {
        "a": GatewayCounters(32, 103, 0),
        "b": "http://b/metrics: ConnectError: refused",
    }
    assert replica_report(["a", "b"], before, after) == [
        {"url": "a", "requests": 30, "counter_syncs_ok": 100, "counter_syncs_error": 0},
        {"url": "b", "error": "http://b/metrics: ConnectError: refused"},
    ]
    assert replica_report(["c"], {}, {}) == [{"url": "c", "error": "not scraped before the run"}]


ROUTER = ProcessPlan(
    name="router", role="router", probe="http", port=8080,
    argv=("py", "-m", "tandem.cli", "router", "--config", "r.yaml", "--host", "127.0.0.1", "--port", "8080"),
)  # fmt: skip


def test_replicas_are_the_planned_gateway_on_their_own_ports_told_how_many_they_are() -> None:
    first, second = tandem_replicas(ROUTER, ports=(8080, 8081), extra_args=("--fairness=fcfs",))
    assert (first.name, first.port, second.name, second.port) == ("router-0", 8080, "router-1", 8081)
    base = ROUTER.argv[:-1]
    assert first.argv == (*base, "8080", "--replicas", "2", "--fairness=fcfs")
    assert second.argv == (*base, "8081", "--replicas", "2", "--fairness=fcfs"), (
        "the user's flags come last, so an explicit --replicas wins"
    )
    (one,) = tandem_replicas(ROUTER, ports=(8080,), extra_args=("--fairness=fcfs",))
    assert one == ProcessPlan(
        name="router", role="router", probe="http", port=8080, argv=(*ROUTER.argv, "--fairness=fcfs")
    ), "one replica is the planned process as before, without --replicas"
    with pytest.raises(HarnessError, match="no --port"):
        tandem_replicas(ProcessPlan("r", "router", ("py", "--port"), 1, "http"), ports=(1,))


def summary(label: str, target: dict[str, object], replicas: list[dict[str, object]]) -> dict[str, object]:
    run = RunData(label, target, DriveResult((), 0.0), {}, {}, replicas=replicas)
    return summarize(run, time_scale=1.0, weights=ServiceWeights())


def test_the_table_shows_replicas_requests_and_syncs_per_replica_only_when_a_target_had_several() -> None:
    replicated = summary(
        "tandem", {"kind": "tandem", "policy": "tandem", "replicas": 2},
        [{"url": "a", "requests": 31, "counter_syncs_ok": 12, "counter_syncs_error": 0},
         {"url": "b", "requests": 29, "counter_syncs_ok": 11, "counter_syncs_error": 1}],
    )  # fmt: skip
    peer = summary(
        "vllm-router:round_robin", {"kind": "vllm-router", "policy": "round_robin", "replicas": 1}, []
    )
    direct = summary("direct", {"kind": "direct", "policy": None}, [])
    table = markdown_table([replicated, peer, direct])
    assert "| gateway replicas | 2 | 1 | – |" in table
    assert "| requests per gateway replica | 31 / 29 | – | – |" in table
    assert "| shared counter syncs per replica | 12 / 11 (1 failed) | – | – |" in table
    single = summary("tandem", {"kind": "tandem", "policy": "tandem", "replicas": 1}, [])
    assert "gateway replicas" not in markdown_table([single, peer])
