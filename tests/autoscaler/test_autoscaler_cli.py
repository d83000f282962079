"""`tandem autoscaler` as a process: exit codes, `/healthz`, JSON logs.

Real: the CLI in a child process, talking HTTP to the emulated API server (kmock, tests/autoscaler/
conftest.py) on 127.0.0.1; signals. Waits poll with a generous deadline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys

import helm_python as helm
import httpx
import kmock as kmock_lib
import pytest
import yaml
from click.testing import CliRunner
from tests.operator.specs import ROOT
from tests.servers import free_port

from tandem.autoscaler.runner import ROUND_SECONDS
from tandem.cli.autoscaler import autoscaler
from tandem.cli.main import cli

PATIENCE_S = 90.0


def test_outside_a_cluster_without_an_api_server_it_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(cli, ["autoscaler"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("tandem: error: not in a cluster")


def test_a_taken_metrics_port_exits_1(api: kmock_lib.KubernetesEmulator) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["autoscaler", "--kube-api-server", str(api.url), "--metrics-host", "127.0.0.1",
                "--metrics-port", str(port)]  # fmt: skip
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith(f"tandem: error: cannot serve metrics on 127.0.0.1:{port}")
    )


async def test_the_process_serves_healthz_logs_json_and_exits_0_on_sigterm(
    api: kmock_lib.KubernetesEmulator,
) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tandem.cli", "autoscaler", "--kube-api-server", str(api.url),
        "--metrics-host", "127.0.0.1", "--metrics-port", str(port), "--interval-seconds", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE_S
        status = 0
        async with httpx.AsyncClient(trust_env=False) as client:
            while status != 200:
                assert process.returncode is None, "the autoscaler exited early"
                assert loop.time() < deadline, "no healthy /healthz in time"
                try:
                    status = (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code
                except httpx.TransportError:
                    await asyncio.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), PATIENCE_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    records = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
    assert any(r.get("msg") == "autoscaler started" for r in records), records
    assert not [r for r in records if r.get("logger") == "httpx"], "one log line per scrape is noise"


def test_the_charts_autoscaler_command_line_parses() -> None:
    values = {
        "autoscaler": {"enabled": True, "namespace": "team-a", "metricsPort": 9191},
        "operator": {"clusterWide": True},
    }
    rendered = helm.Chart.load(ROOT / "charts" / "tandem").render(
        values, name="tandem", namespace="tandem-system"
    )
    deployment = yaml.safe_load(rendered["tandem/templates/autoscaler-deployment.yaml"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "autoscaler"
    params = autoscaler.make_context("autoscaler", list(container["args"][1:])).params
    assert params["namespaces"] == ("team-a",)
    # The chart's round period is the program's own default.
    assert (params["metrics_port"], params["interval_seconds"]) == (9191, ROUND_SECONDS)
    assert container["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_charts_autoscaler_watches_the_operators_namespaces_by_default() -> None:
    values = {"autoscaler": {"enabled": True}, "operator": {"watchNamespaces": ["team-a", "team-b"]}}
    rendered = helm.Chart.load(ROOT / "charts" / "tandem").render(
        values, name="tandem", namespace="tandem-system"
    )
    deployment = yaml.safe_load(rendered["tandem/templates/autoscaler-deployment.yaml"])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    params = autoscaler.make_context("autoscaler", list(container["args"][1:])).params
    assert params["namespaces"] == ("team-a", "team-b")
