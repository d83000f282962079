"""The diagnostics port: `/metrics` (which says where requests ran) off the client port, behind a token.

The attack: a client reads the gateway's `/metrics` on the port it sends requests to, and learns
from the P/D decisions and per-endpoint counts whether its probe prompt was cached. With
`--metrics-port`, the client port answers `/metrics` with 404, and the diagnostics port serves it only
with `TANDEM_METRICS_TOKEN`.

Real: `tandem router` as a child process (one process, then two workers) in front of one simulated
engine process (`tests.router.processes`), httpx as the clients. Nothing is faked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.processes import MODEL, Child, router_process, sim_processes, static_router_config
from tests.servers import free_port

TOKEN = "diagnostics-token-for-the-test"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    with sim_processes(tmp_path_factory.mktemp("engine"), ["d0"], time_scale=100.0) as [child]:
        yield child


def _config(tmp_path: Path, engine: Child) -> Path:
    return static_router_config(tmp_path, engine, service="diagnostics")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_leave_the_client_port_for_the_diagnostics_port_behind_its_token(
    tmp_path: Path, engine: Child, workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_METRICS_TOKEN", TOKEN)
    metrics_port = free_port()
    flags = ["--metrics-port", str(metrics_port), "--workers", workers]
    with router_process(tmp_path, _config(tmp_path, engine), *flags) as gateway:
        client = f"http://{gateway.name}"
        diagnostics = f"http://127.0.0.1:{metrics_port}"
        with httpx.Client(trust_env=False, timeout=30) as http:
            served = http.post(
                f"{client}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}
            )
            public = http.get(f"{client}/metrics")
            anonymous = http.get(f"{diagnostics}/metrics")
            wrong = http.get(f"{diagnostics}/metrics", headers={"authorization": "Bearer not-the-token"})
            generation = http.post(
                f"{diagnostics}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                headers={"authorization": f"Bearer {TOKEN}"},
            )  # fmt: skip
            scraped = http.get(f"{diagnostics}/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    assert served.status_code == 200
    assert public.status_code == 404 and public.json()["error"]["code"] == 404
    assert "tandem_router" not in public.text
    assert anonymous.status_code == 401 and wrong.status_code == 401
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert "tandem_router" not in anonymous.text + wrong.text
    assert generation.status_code == 404, "the diagnostics port serves no requests"
    assert scraped.status_code == 200
    served_count = sum(
        sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
        if sample.name == "tandem_router_requests_total"
        and sample.labels.get("route") == "/v1/completions"
        and sample.labels.get("status") == "200"
    )
    assert served_count == 1


def test_without_a_token_the_diagnostics_port_is_open_and_the_client_port_still_hides_metrics(
    tmp_path: Path, engine: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TANDEM_METRICS_TOKEN", raising=False)
    metrics_port = free_port()
    config = _config(tmp_path, engine)
    with (
        router_process(tmp_path, config, "--metrics-port", str(metrics_port)) as gateway,
        httpx.Client(trust_env=False, timeout=30) as http,
    ):
        public = http.get(f"http://{gateway.name}/metrics")
        scraped = http.get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert public.status_code == 404
    assert scraped.status_code == 200 and "tandem_router_connections_open" in scraped.text
