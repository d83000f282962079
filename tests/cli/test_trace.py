"""`tandem up --trace` and `tandem trace REQUEST_ID`: a request's trace on a laptop, without a collector.

Real: `tandem up` in a subprocess (Redis, a prefill and a decode simulated engine, the gateway), a P/D
request sent with httpx, the spans the gateway and the engines wrote (Tandem's file exporter), and
`tandem trace` in a subprocess. The waterfall's pure parts run on spans written here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from tests.servers import free_port

from tandem.cli.trace import request_trace, waterfall

SPEC = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "traced"},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "chatty"},
        "engine": {"kind": "sim", "sim": {"profile": "tiny-cpu", "timeScale": 100}},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "disaggregation": {"mode": "always"},
    },
}


def span(
    name: str, span_id: str, parent: str | None, start: int, end: int, **extra: object
) -> dict[str, object]:
    return {"trace_id": "t1", "span_id": span_id, "parent_id": parent, "name": name, "service": "svc",
            "start_ns": start, "end_ns": end, "status": "ok", "attributes": {}, **extra}  # fmt: skip


def test_the_waterfall_is_the_trace_as_a_tree_on_one_axis() -> None:
    spans = [
        span("decode", "c2", "root", 40_000_000, 100_000_000),
        span("chat m", "root", "client", 0, 100_000_000, attributes={"tandem.request_id": "r-1"}),
        span("llm_request", "e1", "c2", 50_000_000, 90_000_000, status="error", status_message="boom"),
        span("admission", "c1", "root", 1_000_000, 2_000_000),
        {**span("other", "x", None, 0, 1), "trace_id": "t2"},
    ]
    found = request_trace(spans, "r-1")
    assert {s["span_id"] for s in found} == {"root", "c1", "c2", "e1"}
    lines = waterfall(found, "r-1")
    assert lines[0] == "trace t1 · request r-1 · 100.0 ms · 4 spans"
    names = [line.split("]  ")[1].split("  svc")[0] for line in lines[1:]]
    assert names == ["chat m", "  admission", "  decode", "    llm_request"]
    assert lines[1].split()[:3] == ["0.0", "100.0", "ms"]
    assert "[" + "█" * 40 + "]" in lines[1]
    assert lines[4].endswith("ERROR: boom")
    assert request_trace(spans, "nobody") == []


def test_tandem_up_trace_writes_spans_that_tandem_trace_prints(tmp_path: Path) -> None:
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    state = tmp_path / "state"
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "up", "-f", str(path), "--port", str(port), "--trace"]
    process = subprocess.Popen(
        [*argv, "--state-dir", str(state)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not process.stdout.readline().startswith("ready:"):
            assert process.poll() is None, "tandem up ended before it was ready"
        body = {"model": "chatty", "prompt": "trace me", "max_tokens": 4}
        headers = {"x-request-id": "laptop-1"}
        with httpx.Client(trust_env=False, timeout=30) as http:
            answer = http.post(f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers)
        assert answer.status_code == 200
        shown = None
        for _ in range(40):  # the exporters write every half second
            shown = subprocess.run(
                [sys.executable, "-m", "tandem.cli", "trace", "laptop-1", "--state-dir", str(state)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if shown.returncode == 0 and shown.stdout.count("llm_request") == 2:
                break
            time.sleep(0.25)
        missing = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "trace", "nobody", "--state-dir", str(state)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    assert shown is not None and shown.returncode == 0, shown.stderr if shown else None
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("trace ") and "request laptop-1" in lines[0]
    assert lines[1].split("]  ")[1] == "text_completion chatty  traced-router"
    assert {"tandem.admission", "tandem.prefill", "tandem.kv_barrier", "tandem.decode"} <= {
        line.split("]  ")[1].split()[0] for line in lines[2:]
    }
    assert sum("llm_request  vllm-chatty" in line for line in lines) == 2
    assert missing.returncode == 1 and "no trace of request 'nobody'" in missing.stderr
