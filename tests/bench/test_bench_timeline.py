"""The autoscaler timeline recorder: `tandem bench --url ... --timeline URL` during an endpoint run.

Real: the CLI (click's runner), the driver's HTTP streams, the recorder's once-a-second scrapes over
loopback, Prometheus parsing, timeline.json/png and the markdown. Faked: the endpoint
(`tests.bench.fake_openai`) and the autoscaler, a tiny app started here whose gauges change with
every scrape: ready replicas of the decode pool go 1, 2, 3, 3, ...; desired is 3; KV utilisation 0.5;
it also serves a counter and an unrelated gauge, which must not be recorded.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from tests.bench.fake_openai import FakeState, create_app
from tests.servers import free_port, run_uvicorn

from tandem.bench.timeline import parse_gauges
from tandem.cli.main import cli


@dataclass
class Scrapes:
    count: int = 0


def autoscaler_app(scrapes: Scrapes) -> FastAPI:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        ready = min(3, 1 + scrapes.count)
        scrapes.count += 1
        return PlainTextResponse(
            "# TYPE tandem_autoscaler_desired_replicas gauge\n"
            'tandem_autoscaler_desired_replicas{service="svc",pool="decode"} 3\n'
            "# TYPE tandem_autoscaler_ready_replicas gauge\n"
            f'tandem_autoscaler_ready_replicas{{service="svc",pool="decode"}} {ready}\n'
            "# TYPE tandem_autoscaler_kv_utilization gauge\n"
            'tandem_autoscaler_kv_utilization{service="svc"} 0.5\n'
            "# TYPE tandem_autoscaler_decisions counter\n"
            'tandem_autoscaler_decisions_total{service="svc"} 7\n'
            "# TYPE other_gauge gauge\n"
            "other_gauge 1\n"
        )

    return app


@pytest.fixture
def servers() -> Iterator[tuple[str, str, Scrapes]]:
    scrapes = Scrapes()
    with (
        run_uvicorn(create_app(FakeState(token_delay=0.01))) as endpoint,
        run_uvicorn(autoscaler_app(scrapes)) as autoscaler,
    ):
        yield endpoint, autoscaler, scrapes


def test_only_gauges_with_the_autoscaler_prefix_are_kept() -> None:
    text = (
        "# TYPE tandem_autoscaler_ready_replicas gauge\n"
        'tandem_autoscaler_ready_replicas{service="s",pool="p"} 2\n'
        "# TYPE tandem_autoscaler_decisions counter\ntandem_autoscaler_decisions_total 1\n"
        "# TYPE x gauge\nx 1\n"
    )
    assert parse_gauges(text) == [("tandem_autoscaler_ready_replicas", {"service": "s", "pool": "p"}, 2.0)]


def test_an_endpoint_run_records_the_autoscaler_timeline_next_to_the_clients_ttft(
    servers: tuple[str, str, Scrapes], tmp_path: Path
) -> None:
    endpoint, autoscaler, scrapes = servers
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        "".join(f'{{"offset_s": {t}, "max_tokens": 4, "prompt": "hello {t}"}}\n' for t in range(4))
    )
    dead = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "bench", "--url", f"{endpoint}/v1", "--workload-file", str(workload), "--timeline", autoscaler,
        "--timeline", dead, "--timeline-interval", "0.5", "--slo-ttft-ms", "500", "--out", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "timeline.json").read_text())
    names = sorted({s["name"] for s in doc["series"]})
    assert names == [
        "tandem_autoscaler_desired_replicas",
        "tandem_autoscaler_kv_utilization",
        "tandem_autoscaler_ready_replicas",
    ]
    (ready,) = [s for s in doc["series"] if s["name"] == "tandem_autoscaler_ready_replicas"]
    assert ready["labels"] == {"service": "svc", "pool": "decode"} and ready["url"] == autoscaler
    values = [v for _, v in ready["points"]]
    assert len(values) >= 4 and values[:3] == [1.0, 2.0, 3.0], "one sample per scrape, in order"
    times = [t for t, _ in ready["points"]]
    assert all(b > a for a, b in itertools.pairwise(times))
    area = sum(v * (t2 - t1) for (t1, v), (t2, _) in itertools.pairwise(ready["points"]))
    assert doc["replica_seconds"]["svc/decode"] == pytest.approx(area)
    assert doc["replica_seconds"]["svc/decode"] > 0
    assert doc["slo"]["ttft_s"] == 0.5 and doc["slo"]["met"] == 4 and doc["slo"]["attainment"] == 1.0
    assert max(doc["rolling_ttft"]["count"]) >= 1
    assert doc["scrape_errors"][dead]["count"] >= 1, "a dead URL is counted, not fatal"
    assert (out / "timeline.png").stat().st_size > 0
    assert "| svc/decode |" in result.stdout and "SLO attainment (TTFT ≤ 500 ms" in result.stdout
    assert scrapes.count >= 4


def test_a_gateways_engine_capacity_is_recorded_per_engine() -> None:
    """The gateway's per-engine capacity gauges are kept; the summary says where C started, where it
    ended and when it was first confirmed."""
    from tandem.bench.stats import Slo
    from tandem.bench.timeline import Sample, build_timeline, timeline_markdown

    page = (
        "# TYPE tandem_router_engine_capacity gauge\n"
        'tandem_router_engine_capacity{pool="decode",endpoint="127.0.0.1:8101"} 4\n'
        "# TYPE tandem_router_engine_capacity_confirmed gauge\n"
        'tandem_router_engine_capacity_confirmed{pool="decode",endpoint="127.0.0.1:8101"} 1\n'
        "# TYPE tandem_router_engine_dispatch_limit gauge\n"
        'tandem_router_engine_dispatch_limit{pool="decode",endpoint="127.0.0.1:8101"} 4\n'
        "# TYPE tandem_router_endpoint_in_flight_requests gauge\n"
        'tandem_router_endpoint_in_flight_requests{pool="decode",endpoint="127.0.0.1:8101"} 3\n'
    )
    kept = {name for name, _, _ in parse_gauges(page)}
    assert kept == {
        "tandem_router_engine_capacity",
        "tandem_router_engine_capacity_confirmed",
        "tandem_router_engine_dispatch_limit",
    }
    labels = {"pool": "decode", "endpoint": "127.0.0.1:8101"}
    samples = [
        Sample(t, "gw", name, labels, value)
        for t, c, confirmed in ((0.0, 256, 0), (1.0, 256, 0), (1.5, 4, 1), (2.5, 4, 1))
        for name, value in (
            ("tandem_router_engine_capacity", c),
            ("tandem_router_engine_capacity_confirmed", confirmed),
        )
    ]
    doc = build_timeline(samples, [], time_scale=1.0, slo=Slo())
    assert doc["engine_capacity"] == {"127.0.0.1:8101": {"first": 256, "last": 4, "confirmed_at_s": 1.5}}
    assert "| 127.0.0.1:8101 | 256 | 4 | 1.5 |" in timeline_markdown(doc)
