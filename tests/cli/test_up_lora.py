"""`tandem up -f deploy/examples/lora.yaml`: the catalog's adapters are served by name through the
gateway, as a new user would try them, and adapters added to or removed from the catalog while the
stack runs are served or refused without a restart.

Real: `tandem up` in a subprocess (Redis, simulated engines with the LoRA flags and the filesystem
resolver over the stack's adapter folder, the gateway), httpx as the client. Nothing is faked.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from tests.cli.upstack import running_up
from tests.servers import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "lora.yaml"


def test_the_examples_catalog_adapters_are_served_through_the_gateway(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "up", "-f", str(EXAMPLE), "--port", str(port)]
    process = subprocess.Popen(
        [*argv, "--state-dir", str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not process.stdout.readline().startswith("ready:"):
            assert process.poll() is None, "tandem up ended before it was ready"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", trust_env=False, timeout=30) as http:
            listed = {m["id"]: m.get("parent") for m in http.get("/models").json()["data"]}
            body = {"prompt": "select the rows", "max_tokens": 4, "temperature": 0}
            base = http.post("/completions", json={**body, "model": "qwen"})
            sql = http.post("/completions", json={**body, "model": "sql-lora"})
            summarize = http.post("/completions", json={**body, "model": "summarize-lora"})
            unknown = http.post("/completions", json={**body, "model": "nope-lora"})
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert listed == {"qwen": None, "sql-lora": "qwen", "summarize-lora": "qwen"}
    assert [r.status_code for r in (base, sql, summarize)] == [200, 200, 200], sql.text
    assert [r.json()["model"] for r in (base, sql, summarize)] == ["qwen", "sql-lora", "summarize-lora"]
    texts = {r.json()["choices"][0]["text"] for r in (base, sql, summarize)}
    assert len(texts) == 3, "each adapter answers differently from the base model"
    assert unknown.status_code == 404


def test_an_adapter_copied_into_the_catalog_is_served_and_one_removed_is_refused(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLE.parent / "adapters", tmp_path / "adapters")
    body = {"prompt": "select the rows", "max_tokens": 4, "temperature": 0}

    def status(http: httpx.Client, model: str) -> int:
        return http.post("/completions", json={**body, "model": model}).status_code

    def until(http: httpx.Client, model: str, code: int) -> None:
        deadline = time.monotonic() + 30
        while status(http, model) != code:
            assert time.monotonic() < deadline, f"{model} never answered {code}"
            time.sleep(0.25)

    with running_up(yaml.safe_load(EXAMPLE.read_text()), tmp_path) as stack:
        with httpx.Client(base_url=stack.endpoint, trust_env=False, timeout=30) as http:
            assert [status(http, m) for m in ("sql-lora", "new-lora")] == [200, 404]
            shutil.copytree(tmp_path / "adapters" / "sql-lora", tmp_path / "adapters" / "new-lora")
            until(http, "new-lora", 200)
            listed = [m["id"] for m in http.get("/models").json()["data"]]
            shutil.rmtree(tmp_path / "adapters" / "summarize-lora")
            until(http, "summarize-lora", 404)
            assert status(http, "sql-lora") == 200
        said = [line for line in stack.output if "adapter catalog:" in line]
    assert sorted(listed) == ["new-lora", "qwen", "sql-lora", "summarize-lora"]
    assert [line.split("adapter catalog: ")[1] for line in said] == [
        "added new-lora",
        "removed summarize-lora",
    ]
