"""`tandem up` with two InferenceServices and an InferenceGateway in one file: one gateway port serves
both models and the gateway's alias.

Real: `python -m tandem.cli up` as a child process (Redis, simulated engines and the gateway as its
children), httpx as the caller. Nothing is faked.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner
from tests.servers import free_port

from tandem.cli.main import cli

pytestmark = pytest.mark.e2e


def service(name: str, *, labelled: bool = True) -> dict[str, object]:
    labels = {"labels": {"tandem.dev/gateway": "fleet"}} if labelled else {}
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, **labels},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct", "servedName": name},
            "engine": {"kind": "sim", "sim": {"timeScale": 0.01}},
            "prefill": {"replicas": 0},
            "decode": {"replicas": 1},
            "disaggregation": {"mode": "off"},
        },
    }


GATEWAY = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceGateway",
    "metadata": {"name": "fleet"},
    "spec": {
        "selector": {"matchLabels": {"tandem.dev/gateway": "fleet"}},
        "aliases": [
            {
                "name": "chat",
                "targets": [{"service": "qwen-v1", "weight": 3}, {"service": "qwen-v2", "weight": 1}],
            }
        ],
    },
}


def test_two_services_and_a_gateway_run_behind_one_port(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all([GATEWAY, service("qwen-v1"), service("qwen-v2")]))
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "up", "-f", str(path), "--port", str(port)]
    argv += ["--state-dir", str(tmp_path / "state")]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        ready = ""
        while time.monotonic() < deadline and not ready:
            line = process.stdout.readline()
            assert line, "tandem up ended before it was ready"
            ready = line if line.startswith("ready:") else ""
        assert "models 'qwen-v1', 'qwen-v2' and aliases 'chat' are served" in ready
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", trust_env=False, timeout=30) as http:
            listed = sorted(m["id"] for m in http.get("/models").json()["data"])
            answers = [
                http.post("/completions", json={"model": m, "prompt": "hi", "max_tokens": 2}).json()
                for m in ("qwen-v1", "qwen-v2", "chat", "chat", "chat", "chat")
            ]
            unknown = http.post("/completions", json={"model": "qwen-v3", "prompt": "hi"})
            metrics = http.get(f"http://127.0.0.1:{port}/metrics").text
        state = json.loads((tmp_path / "state" / "state.json").read_text())
        shown = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "status", "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert state["pid"] == process.pid and state["name"] == "fleet"
    assert listed == ["chat", "qwen-v1", "qwen-v2"]
    assert [a["model"] for a in answers] == ["qwen-v1", "qwen-v2", "chat", "chat", "chat", "chat"]
    assert unknown.status_code == 404 and "qwen-v3" in unknown.json()["error"]["message"]
    assert 'tandem_router_alias_requests_total{alias="chat",target="qwen-v1"} 3.0' in metrics
    assert 'tandem_router_alias_requests_total{alias="chat",target="qwen-v2"} 1.0' in metrics
    assert shown.returncode == 0, shown.stderr
    header = shown.stdout.splitlines()[:4]
    assert header[0].startswith("fleet: ready, 3 models at http://127.0.0.1:")
    assert [line.split(maxsplit=1) for line in header[1:]] == [
        ["qwen-v1", "service qwen-v1"],
        ["qwen-v2", "service qwen-v2"],
        ["chat", "alias: qwen-v1 75%, qwen-v2 25%"],
    ]
    config = yaml.safe_load((tmp_path / "state" / "gateway.yaml").read_text())
    assert config["kind"] == "gateway" and [s["name"] for s in config["services"]] == ["qwen-v1", "qwen-v2"]


def test_a_service_the_gateway_does_not_select_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all([GATEWAY, service("qwen-v1"), service("loose", labelled=False)]))
    result = CliRunner().invoke(cli, ["up", "-f", str(path), "--state-dir", str(tmp_path / "state")])
    assert result.exit_code == 2
    assert "InferenceService loose is not selected by InferenceGateway fleet" in result.stderr
