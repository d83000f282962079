"""Faults with real processes: engines killed (mid-stream, and before any byte), the KV pool's Redis
going down, an endpoint removed while it serves, and the router itself killed and restarted.

Real: simulated engines and (last story) the router as child processes (`tests.router.processes`),
redis-server, the router app on 127.0.0.1, raw httpx. Nothing is faked; the engines run at time
scale 1 so a long answer stays in flight for seconds, and every wait polls with a generous deadline.
docs/security.md ("Faults") lists the command for each story.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from tests.router.harness import Launcher, RunningRouter, metric, router_config
from tests.router.processes import MODEL, Child, router_process, sim_processes
from tests.servers import LOOPBACK, free_port, run_redis_server

from tandem.core.routerconfig import EndpointList, RouterConfig, write_endpoint_file

LONG = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": 1000, "ignore_eos": True}
SHORT = {"model": MODEL, "prompt": "hello", "max_tokens": 8}


async def eventually(check: Callable[[], Awaitable[bool]], *, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def sse_payloads(data: bytes) -> list[Any]:
    """Every event's `data:` payload, parsed (`[DONE]` kept as the string); fails on a broken event."""
    assert data.endswith(b"\n\n"), f"the stream ends inside an event: {data[-200:]!r}"
    payloads: list[Any] = []
    for event in data.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: "), f"not an SSE data event: {event[:200]!r}"
        text = event.removeprefix(b"data: ").decode()
        payloads.append(text if text == "[DONE]" else json.loads(text))
    return payloads


async def running(engine: Child) -> float:
    """`vllm:num_requests_running` of a simulated engine (0 when it cannot be read)."""
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            text = (await http.get(f"{engine.url}/metrics", timeout=5)).text
    except httpx.TransportError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_event_then_done(
    launcher: Launcher, tmp_path: Path
) -> None:
    with sim_processes(tmp_path, ["d0"]) as [engine]:
        router = await launcher.router(decode=[engine.url])
        data = b""
        async with router.http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
            assert response.status_code == 200
            chunks = response.aiter_raw()
            async for chunk in chunks:
                data += chunk
                if data.count(b"\n\n") >= 5:  # tokens are flowing
                    break
            engine.kill()
            async for chunk in chunks:
                data += chunk
    payloads = sse_payloads(data)
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]["error"]
    assert error["code"] == 502 and "failed mid-stream" in error["message"]
    tokens = payloads[:-2]
    assert len(tokens) >= 5 and all(p["object"] == "text_completion" for p in tokens)
    assert await metric(router, "tandem_router_upstream_errors_total", endpoint=engine.name, kind="read") == 1


async def test_an_engine_killed_before_answering_is_retried_on_another_transparently(
    launcher: Launcher, tmp_path: Path
) -> None:
    with sim_processes(tmp_path, ["d0", "d1"]) as engines:
        router = await launcher.router(decode=[e.url for e in engines])
        request = asyncio.create_task(router.http.post("/v1/completions", json={**LONG, "max_tokens": 400}))

        busy: list[Child] = []

        async def one_busy() -> bool:
            busy[:] = [e for e in engines if await running(e) >= 1]
            return len(busy) == 1

        await eventually(one_busy, what="an engine to start the request")
        other = next(e for e in engines if e is not busy[0])
        busy[0].kill()  # non-streaming: not a byte of the answer has reached the router yet
        response = await request
    assert response.status_code == 200
    assert response.headers["x-tandem-decode-endpoint"] == other.name
    assert response.json()["usage"]["completion_tokens"] == 400
    assert await metric(router, "tandem_router_retries_total", pool="decode", reason="read") == 1


async def test_with_redis_down_disaggregated_requests_fall_back_to_decode_only_without_client_errors(
    launcher: Launcher, tmp_path: Path
) -> None:
    with (
        run_redis_server() as pool,
        sim_processes(tmp_path, ["p0", "d0"], "--kv-role", "both", "--kv-pool", pool.url) as [
            prefill,
            decode,
        ],
    ):
        router = await launcher.router(
            decode=[decode.url], prefill=[prefill.url], mode="always", kv_pool_url=pool.url
        )
        prompt = "the quick brown fox " * 100  # several KV chunks
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8}
        before = await router.http.post("/v1/completions", json=body)
        assert before.status_code == 200
        assert before.headers["x-tandem-prefill-endpoint"] == prefill.name
        with pool.client() as client, contextlib.suppress(redis.ConnectionError):
            client.shutdown(nosave=True)
        for i in range(4):
            answer = await router.http.post("/v1/completions", json={**body, "prompt": f"{i} {prompt}"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 8
            assert "x-tandem-pd-fallback" in answer.headers
        stream = await router.http.post("/v1/completions", json={**body, "stream": True})
        assert stream.status_code == 200
        assert sse_payloads(stream.content)[-1] == "[DONE]" and b'"error"' not in stream.content
    assert await metric(router, "tandem_router_pd_fallbacks_total") >= 5


async def read_stream(router: RunningRouter, started: asyncio.Event, count: list[int]) -> tuple[str, bytes]:
    """Stream a long completion; returns the decode endpoint and the bytes."""
    async with router.http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as response:
        data = b""
        async for chunk in response.aiter_raw():
            if not data:
                count[0] += 1
                if count[0] == 4:
                    started.set()
            data += chunk
        return response.headers["x-tandem-decode-endpoint"], data


async def test_an_endpoint_removed_under_load_finishes_its_streams_and_gets_no_new_ones(
    launcher: Launcher, tmp_path: Path
) -> None:
    endpoint_file = tmp_path / "endpoints.json"
    with sim_processes(tmp_path, ["d0", "d1"]) as [leaving, staying]:
        write_endpoint_file(endpoint_file, EndpointList(decode=[leaving.url, staying.url]))
        config = RouterConfig.model_validate(
            {
                **router_config(decode=[leaving.url], spec={"router": {"policy": "round-robin"}}).model_dump(
                    by_alias=True, exclude_none=True
                ),
                "discovery": {"kind": "file", "path": str(endpoint_file), "pollSeconds": 0.1},
            }
        )
        router = await launcher.router_for(config)
        started, count = asyncio.Event(), [0]
        streams = [asyncio.create_task(read_stream(router, started, count)) for _ in range(4)]
        await asyncio.wait_for(started.wait(), timeout=60)
        write_endpoint_file(endpoint_file, EndpointList(decode=[staying.url]))  # scale-down

        async def one_left() -> bool:
            return bool((await router.http.get("/health")).json()["pools"]["decode"]["endpoints"] == 1)

        await eventually(one_left, what="discovery to drop the endpoint")
        draining = await metric(router, "tandem_router_endpoint_in_flight_requests", endpoint=leaving.name)
        for _ in range(3):
            answer = await router.http.post("/v1/completions", json=SHORT)
            assert answer.status_code == 200
            assert answer.headers["x-tandem-decode-endpoint"] == staying.name
        results = await asyncio.gather(*streams)
    assert draining == 2  # round-robin: half the streams were on the endpoint that left
    assert sorted(endpoint for endpoint, _ in results) == sorted([leaving.name] * 2 + [staying.name] * 2)
    for _, data in results:
        payloads = sse_payloads(data)
        assert payloads[-1] == "[DONE]" and not any("error" in p for p in payloads[:-1])
        assert sum(1 for p in payloads[:-1] if p["choices"]) == 1000  # every token arrived
    assert await metric(router, "tandem_router_endpoint_in_flight_requests", endpoint=leaving.name) == 0


def wait_listening(port: int, child: Child, *, timeout_s: float = 90.0) -> None:
    """Until something accepts TCP connections on `port` (no HTTP request is sent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert child.process.poll() is None, f"the router exited; see {child.log}"
        with socket.socket() as sock:
            if sock.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.02)
    raise AssertionError(f"nothing listened on port {port} within {timeout_s:.0f}s")


def test_a_router_killed_and_restarted_on_its_port_serves_its_first_request(tmp_path: Path) -> None:
    with sim_processes(tmp_path, ["d0"], time_scale=100) as [engine]:
        config = tmp_path / "router.yaml"
        document = router_config(decode=[engine.url]).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        config.write_text(yaml.safe_dump(document))
        port = free_port()
        with router_process(tmp_path, config, port=port) as first:
            assert httpx.post(f"{first.url}/v1/completions", json=SHORT, timeout=30).status_code == 200
            first.kill()
        with router_process(tmp_path, config, port=port, wait=False) as second:
            wait_listening(port, second)
            # The very first request after the port opens: discovery was filled before it did.
            response = httpx.post(f"{second.url}/v1/completions", json=SHORT, timeout=30)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == 8
