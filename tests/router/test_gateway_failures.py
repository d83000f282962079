"""Engines failing: retries before the first byte, rotation, mid-stream death, client disconnects.

Real: the router app, uvicorn servers on 127.0.0.1, the official `openai` client (and raw httpx where
the bytes matter). Faked: the engines (`FakeEngine` with failure injection) and, where a cool-down is
involved, the router's clock (`FakeClock`). Engines that are "down" are loopback ports nobody
listens on.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from tests.router.harness import MODEL, FakeClock, Launcher, metric
from tests.router.servers import closed_port_url

from tandem.router.settings import RotationSettings, RouterSettings

COMPLETION = {"model": MODEL, "prompt": "x", "max_tokens": 2}


def single_strike() -> RouterSettings:
    """One failure takes an endpoint out of rotation for 10 s."""
    return RouterSettings(rotation=RotationSettings(failure_threshold=1, cooldown_seconds=10))


async def test_a_request_is_retried_on_another_engine_when_one_is_down(launcher: Launcher) -> None:
    alive = await launcher.engine("d0")
    dead = closed_port_url()
    router = await launcher.router(decode=[dead, alive])
    for _ in range(4):
        answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert answer.choices[0].text == " d0-0"
    assert len(alive.received) == 4
    assert await metric(router, "tandem_router_retries_total", pool="decode", reason="connect") >= 1
    dead_name = dead.removeprefix("http://")
    errors = await metric(router, "tandem_router_upstream_errors_total", endpoint=dead_name, kind="connect")
    assert errors >= 1


async def test_an_engine_that_keeps_failing_leaves_rotation(launcher: Launcher) -> None:
    alive = await launcher.engine("d0")
    dead = closed_port_url()
    router = await launcher.router(decode=[dead, alive])
    for _ in range(8):
        await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    dead_name = dead.removeprefix("http://")
    assert await metric(router, "tandem_router_endpoint_up", endpoint=dead_name) == 0
    # Default threshold: 3 consecutive failures; after that the dead engine is not tried again.
    assert await metric(router, "tandem_router_upstream_errors_total", endpoint=dead_name) == 3


async def test_a_5xx_before_the_first_byte_is_retried_elsewhere(launcher: Launcher) -> None:
    broken = await launcher.engine("d0", status=500)
    healthy = await launcher.engine("d1")
    router = await launcher.router(decode=[broken, healthy])
    for _ in range(2):
        answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert answer.choices[0].text == " d1-0"
    assert len(broken.received) >= 1
    assert await metric(router, "tandem_router_retries_total", pool="decode", reason="status") >= 1


async def test_when_every_decode_engine_is_down_the_client_gets_a_503_in_openai_shape(
    launcher: Launcher,
) -> None:
    router = await launcher.router(decode=[closed_port_url(), closed_port_url()])
    with pytest.raises(openai.InternalServerError) as caught:
        await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert caught.value.status_code == 503
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["type"] == "ServiceUnavailableError"
    assert caught.value.body["code"] == 503
    assert "no decode endpoint could serve the request (2 attempts failed)" in caught.value.body["message"]
    assert "127.0.0.1" not in caught.value.body["message"]  # the log line names them, not the client
    assert await metric(router, "tandem_router_requests_total", status="503") == 1


async def test_a_streaming_request_to_dead_engines_is_a_503_not_a_broken_stream(
    launcher: Launcher,
) -> None:
    router = await launcher.router(decode=[closed_port_url()])
    response = await router.http.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "ServiceUnavailableError"


async def test_health_is_503_with_a_reason_when_no_decode_engine_is_in_rotation(
    launcher: Launcher,
) -> None:
    router = await launcher.router(decode=[closed_port_url()], settings=single_strike())
    assert (await router.http.get("/health")).status_code == 200
    await router.http.post("/v1/completions", json=COMPLETION)
    health = await router.http.get("/health")
    assert health.status_code == 503
    assert health.json()["reason"] == "no decode endpoint in rotation (all 1 cooling down after failures)"
    again = await router.http.post("/v1/completions", json=COMPLETION)
    assert again.status_code == 503
    assert "no decode endpoint in rotation" in again.json()["error"]["message"]


async def test_an_engine_out_of_rotation_gets_traffic_again_after_its_cooldown(
    launcher: Launcher,
) -> None:
    clock = FakeClock()
    engine = await launcher.engine("d0", status=500)
    router = await launcher.router(decode=[engine], settings=single_strike(), clock=clock)
    assert (await router.http.post("/v1/completions", json=COMPLETION)).status_code == 503
    assert (await router.http.get("/health")).status_code == 503
    engine.behaviour.status = 200  # the engine recovers, but the router does not know yet
    clock.advance(9.9)
    assert (await router.http.post("/v1/completions", json=COMPLETION)).status_code == 503
    assert len(engine.received) == 1
    clock.advance(0.2)
    assert (await router.http.get("/health")).status_code == 200
    assert (await router.http.post("/v1/completions", json=COMPLETION)).status_code == 200
    assert len(engine.received) == 2


async def test_a_client_that_leaves_mid_stream_cancels_the_engines_stream(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=500, token_delay=0.02)
    router = await launcher.router(decode=[engine])
    stream = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=500, stream=True)
    received = 0
    async for _ in stream:
        received += 1
        if received == 3:
            break
    await stream.close()
    await asyncio.wait_for(engine.cancelled.wait(), timeout=10)
    for _ in range(100):  # the router frees the slot right after closing the upstream stream
        if await metric(router, "tandem_router_endpoint_in_flight_requests") == 0:
            break
        await asyncio.sleep(0.02)
    assert await metric(router, "tandem_router_endpoint_in_flight_requests") == 0


async def test_a_stream_that_dies_midway_ends_with_an_sse_error_event_then_done(
    launcher: Launcher,
) -> None:
    engine = await launcher.engine("d0", tokens=5, die_after=2)
    router = await launcher.router(decode=[engine])
    body = {**COMPLETION, "max_tokens": 5, "stream": True}
    async with router.http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        raw = b"".join([chunk async for chunk in r.aiter_raw()])
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert len(events) == 4  # two tokens, the error, [DONE]
    assert [json.loads(e)["choices"][0]["text"] for e in events[:2]] == [" d0-0", " d0-1"]
    error = json.loads(events[2])["error"]
    assert error["type"] == "BadGatewayError" and error["code"] == 502
    assert "failed mid-stream" in error["message"]
    assert events[3] == b"[DONE]"
    name = engine.url.removeprefix("http://")
    assert await metric(router, "tandem_router_upstream_errors_total", endpoint=name, kind="read") == 1


async def test_the_openai_client_sees_a_mid_stream_death_as_an_api_error(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=5, die_after=1)
    router = await launcher.router(decode=[engine])
    stream = await router.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    texts: list[str] = []
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        async for chunk in stream:
            texts.append(chunk.choices[0].delta.content or "")
    assert texts == [" d0-0"]
