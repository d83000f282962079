"""`tandem adapters sync`, the engine pods' adapter sidecar: the list it is given is installed, an
adapter added to or removed from the list while it runs is installed or removed without a restart,
a failure is reported with its reason and not retried on every pass, and the operator reads the
report into each adapter's state.

Real: the command as the operator renders it (`tandem.operator.resources.lora.sync_container`, its
paths moved under tmp_path and its port a free one) in its own process, its HTTP endpoints, the
list file as the rendered ConfigMap holds it, `tandem.core.adaptersync`/`adapterfetch` on tmp_path,
the operator's reader and judge (`tandem.operator.sidecars.http_report`, `adapterstatus.judge`). The
Hub is test_adapter_fetch.py's fake on 127.0.0.1; the engine is the simulator (its vLLM filesystem
resolver over the sidecar's cache) served by uvicorn on 127.0.0.1. Timeouts guard against hangs;
nothing asserts on speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.cli.test_adapter_fetch import Hub, adapter_files, hub  # noqa: F401 (the fixture)
from tests.operator.specs import IMAGES, OWNER, spec_of
from tests.operator.test_operator_reconcile import body as isvc_document
from tests.servers import free_port, run_uvicorn

from tandem.core.adaptersync import LIST_KEY, list_document
from tandem.operator.adapterstatus import Observed, judge
from tandem.operator.resources import desired_children
from tandem.operator.resources.lora import sync_container
from tandem.operator.resources.meta import Role, selector_labels
from tandem.operator.sidecars import http_report
from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings

PATIENCE_S = 30.0


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


class Sidecar:
    """The rendered sidecar's command running here (module docstring)."""

    def __init__(self, tmp_path: Path, fake_hub: Hub, spec_adapters: list[dict[str, str]]) -> None:
        document = isvc_document(
            {"engine": {"kind": "sim", "lora": {"maxRank": 16}}, "adapters": spec_adapters}
        )
        spec = spec_of(document)
        container = sync_container(spec, owner=OWNER, images=IMAGES)
        assert container is not None
        [config] = [
            c.manifest
            for c in desired_children(spec, owner=OWNER, images=IMAGES)
            if c.manifest["metadata"]["name"] == "demo-adapters"
        ]
        self.cache, self.list_file, self.port = tmp_path / "adapters", tmp_path / LIST_KEY, free_port()
        self.list_file.write_text(config["data"][LIST_KEY])
        moved = {"/adapters": str(self.cache), f"/etc/tandem/adapters/{LIST_KEY}": str(self.list_file)}
        command = [moved.get(a, a) for a in container["command"]]
        command[command.index("--port") + 1] = str(self.port)
        self.container = container | {"ports": [{"name": "adapter-sync", "containerPort": self.port}]}
        self.spec = spec
        env = os.environ | {"HF_ENDPOINT": fake_hub.url}
        args = [*command[1:], "--interval", "0.1", "--retry", "3600", "--host", "127.0.0.1"]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def report(self) -> dict[str, Any]:
        status, body = get(f"{self.url}/adapters")
        return json.loads(body) if status == 200 else {}

    def states(self) -> dict[str, str]:
        return {n: e["state"] for n, e in self.report().get("adapters", {}).items()}

    def pod(self) -> dict[str, Any]:
        """The engine pod as the kubelet reports it (this process as its sidecar)."""
        return {
            "metadata": {"name": "d-1", "labels": selector_labels(OWNER, Role.DECODE)},
            "spec": {"initContainers": [self.container]},
            "status": {
                "podIP": "127.0.0.1",
                "initContainerStatuses": [{"name": "adapters-sync", "started": True}],
            },
        }

    def stop(self) -> tuple[int, str]:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=30)
        return self.process.returncode, out


@pytest.fixture
def start(tmp_path: Path, hub: Hub) -> Iterator[Callable[[list[dict[str, str]]], Sidecar]]:  # noqa: F811
    started: list[Sidecar] = []

    def _start(spec_adapters: list[dict[str, str]]) -> Sidecar:
        started.append(Sidecar(tmp_path, hub, spec_adapters))
        return started[-1]

    yield _start
    for sidecar in started:
        if sidecar.process.poll() is None:
            sidecar.stop()


def test_adapters_added_and_removed_while_it_runs_are_installed_and_removed(
    start: Callable[[list[dict[str, str]]], Sidecar],
    hub: Hub,  # noqa: F811
) -> None:
    hub.repos["org/sql"] = {"main": ("1" * 40, adapter_files())}
    hub.repos["org/chat"] = {"main": ("2" * 40, adapter_files())}
    sidecar = start([{"name": "sql", "source": "hf://org/sql"}])
    eventually(lambda: get(f"{sidecar.url}/ready")[0] == 200, "the first pass")
    assert sidecar.states() == {"sql": "Ready"}
    assert (sidecar.cache / "sql" / "adapter_config.json").is_file()
    pid = sidecar.process.pid

    sidecar.list_file.write_text(list_document([("sql", "hf://org/sql"), ("chat", "hf://org/chat")]))
    eventually(lambda: sidecar.states() == {"sql": "Ready", "chat": "Ready"}, "chat installed")
    assert (sidecar.cache / "chat" / "adapter_config.json").is_file()
    assert sorted(p for p in hub.downloads() if "adapter_config" in p) == [
        f"/org/chat/resolve/{'2' * 40}/adapter_config.json",
        f"/org/sql/resolve/{'1' * 40}/adapter_config.json",
    ], "sql is not downloaded again"

    sidecar.list_file.write_text(list_document([("chat", "hf://org/chat")]))
    eventually(lambda: sidecar.states() == {"chat": "Ready"}, "sql removed from the report")
    assert not (sidecar.cache / "sql").exists()
    assert sidecar.process.pid == pid and sidecar.process.poll() is None, "the same process all along"

    status, metrics = get(f"{sidecar.url}/metrics")
    assert status == 200
    assert b'tandem_adapter_sync_adapters{state="Ready"} 1.0' in metrics
    assert b"tandem_adapter_sync_installs_total 2.0" in metrics
    assert b"tandem_adapter_sync_removals_total 1.0" in metrics
    code, out = sidecar.stop()
    assert code == 0, out
    logged = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(e["msg"], e.get("adapter")) for e in logged if e.get("adapter")] == [
        ("adapter installed", "sql"),
        ("adapter installed", "chat"),
        ("adapter removed", "sql"),
    ]


def test_the_operator_reads_a_failure_and_its_reason_and_it_is_not_retried_every_pass(
    start: Callable[[list[dict[str, str]]], Sidecar],
    hub: Hub,  # noqa: F811
) -> None:
    hub.repos["org/good"] = {"main": ("7" * 40, adapter_files())}
    hub.repos["org/big"] = {"main": ("8" * 40, adapter_files(64))}
    sidecar = start([{"name": "good", "source": "hf://org/good"}, {"name": "big", "source": "hf://org/big"}])
    eventually(lambda: get(f"{sidecar.url}/ready")[0] == 200, "the first pass")
    states = judge(
        sidecar.spec, Observed(pods=[sidecar.pod()], reports={"d-1": http_report(sidecar.pod())}), owner=OWNER
    )
    assert [(a.name, a.state, a.reason) for a in states] == [
        ("good", "Ready", "installed on 1/1 engine pods"),
        ("big", "Failed", "rank 64 (adapter_config.json r) is above spec.engine.lora.maxRank 16"),
    ]
    passes = sidecar.report()["passes"]
    eventually(lambda: sidecar.report()["passes"] >= passes + 5, "five more passes")
    tries = [p for p in hub.requests if p.startswith("/api/models/org/big/")]
    assert len(tries) == 1, "a failed adapter waits --retry seconds before it is tried again"


def test_a_list_it_cannot_read_removes_nothing_and_is_reported(
    start: Callable[[list[dict[str, str]]], Sidecar],
    hub: Hub,  # noqa: F811
) -> None:
    hub.repos["org/sql"] = {"main": ("1" * 40, adapter_files())}
    sidecar = start([{"name": "sql", "source": "hf://org/sql"}])
    eventually(lambda: sidecar.states() == {"sql": "Ready"}, "sql installed")
    sidecar.list_file.write_text("{not json")
    eventually(lambda: sidecar.report().get("listError", "").startswith("adapters.json is not JSON"), "error")
    assert (sidecar.cache / "sql" / "adapter_config.json").is_file()
    _, metrics = get(f"{sidecar.url}/metrics")
    assert b"tandem_adapter_sync_list_error 1.0" in metrics


def test_an_adapter_added_to_the_list_is_served_by_the_engine_that_was_already_running(
    start: Callable[[list[dict[str, str]]], Sidecar],
    hub: Hub,  # noqa: F811
) -> None:
    """The simulator's vLLM filesystem resolver over the sidecar's cache, as in an engine pod."""
    peft = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
    files = adapter_files() | {
        "adapter_config.json": json.dumps(peft | {"base_model_name_or_path": "tiny"}).encode()
    }
    hub.repos["org/chat"] = {"main": ("2" * 40, files)}
    sidecar = start([])
    eventually(lambda: get(f"{sidecar.url}/ready")[0] == 200, "the first pass")
    settings = SimSettings.model_validate(
        {"profile": "tiny-cpu", "served_model_name": "qwen", "time_scale": 1000, "enable_lora": True}
    )
    environ = {  # what the operator gives the engine container
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_PLUGINS": "lora_filesystem_resolver",
        "VLLM_LORA_RESOLVER_CACHE_DIR": str(sidecar.cache),
    }
    body = {"prompt": "Tell me about adapters", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with run_uvicorn(create_app(settings, environ=environ)) as url, httpx.Client(base_url=url) as engine:
        assert engine.post("/v1/completions", json=body | {"model": "chat"}).status_code == 404
        sidecar.list_file.write_text(list_document([("chat", "hf://org/chat")]))
        eventually(lambda: sidecar.states() == {"chat": "Ready"}, "chat installed")
        served = engine.post("/v1/completions", json=body | {"model": "chat"})
        assert served.status_code == 200, served.text
        base = engine.post("/v1/completions", json=body | {"model": "qwen"}).json()
        assert served.json()["choices"][0]["text"] != base["choices"][0]["text"]
        assert "chat" in [card["id"] for card in engine.get("/v1/models").json()["data"]]
