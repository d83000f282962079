"""`tandem up -f deploy/examples/lora.yaml`: the catalog's adapters are served by name through the
gateway, as a new user would try them.

Real: `tandem up` in a subprocess (Redis, simulated engines with the LoRA flags and the filesystem
resolver over the stack's adapter folder, the gateway), httpx as the client. Nothing is faked.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
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
