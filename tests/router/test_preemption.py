"""Pre-emption end to end: a tenant with nothing running takes a slot from a tenant over its share,
and the stopped stream is continued into the same response.

Real: the router, uvicorn servers on 127.0.0.1, HTTP clients. Faked: the engine (`FakeEngine`), which
answers every request with the tokens " d0-0", " d0-1", ... (a continuation too), so that the test can
tell the two halves of a continued answer apart, and records what it was sent.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from tests.router.harness import MODEL, Launcher, RunningRouter, metric

from tandem.router.settings import AdmissionSettings, RouterSettings

TWO_SLOTS = AdmissionSettings(max_in_flight_per_endpoint=2, poll_seconds=0.02, handover_tokens=0)
LONG = 40


def chat(tenant: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"a question from {tenant}"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def stream_events(
    router: RunningRouter, body: dict[str, Any], tenant: str, started: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """Every JSON event of the answer, after checking that the stream is well formed."""
    events: list[dict[str, Any]] = []
    raw = b""
    async with router.http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-tenant-id": tenant}
    ) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_raw():
            raw += chunk
            if started is not None and raw.count(b"\n\n") >= 4:
                started.set()
    assert raw.endswith(b"data: [DONE]\n\n")
    for event in raw.split(b"\n\n")[:-2]:
        assert event.startswith(b"data: {"), event
        events.append(orjson.loads(event[6:]))
    return events


async def running_streams(
    router: RunningRouter, bodies: list[tuple[str, dict[str, Any]]]
) -> list[asyncio.Task[list[dict[str, Any]]]]:
    """Start one stream per (tenant, body); returns once each has sent its first events."""
    started = [asyncio.Event() for _ in bodies]
    tasks = [
        asyncio.create_task(stream_events(router, body, tenant, event))
        for (tenant, body), event in zip(bodies, started, strict=True)
    ]
    await asyncio.gather(*(event.wait() for event in started))
    return tasks


def heavy_pair(**extra: Any) -> list[tuple[str, dict[str, Any]]]:
    return [("heavy", chat("heavy", LONG, **extra))] * 2


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


async def test_a_light_request_takes_a_heavy_streams_slot_and_the_stream_is_continued(
    launcher: Launcher, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    heavy = await running_streams(router, heavy_pair())

    light = await stream_events(router, chat("light", 3), "light")

    assert text_of(light) == " d0-0 d0-1 d0-2"
    assert not any(task.done() for task in heavy)  # served while both heavy streams were still going
    assert await metric(router, "tandem_router_preemptions_total", tenant="heavy") == 1
    with caplog.at_level(logging.INFO, logger="tandem.router"):
        answers = await asyncio.gather(*heavy)
    lines = [r.__dict__ for r in caplog.records if r.getMessage() == "request"]
    assert [line.get("continued") for line in lines if line.get("tenant") == "heavy"].count(True) == 1
    [sent] = [r for r in engine.received if r.body.get("continue_final_message")]
    continuation, upstream_id = sent.body, sent.headers["x-request-id"]
    assert upstream_id.endswith("-continued")  # its own id, for the engine that may still abort the first
    assert upstream_id.removesuffix("-continued") in {r.headers["x-request-id"] for r in engine.received}
    before = continuation["messages"][-1]
    assert before["role"] == "assistant" and continuation["add_generation_prompt"] is False
    assert continuation["messages"][:-1] == chat("heavy", LONG)["messages"]
    seen = before["content"].count(" d0-")
    assert 0 < seen < LONG and continuation["max_tokens"] == LONG - seen
    texts = sorted((text_of(events) for events in answers), key=len)
    uninterrupted = "".join(f" d0-{i}" for i in range(LONG))
    continued = before["content"] + "".join(f" d0-{i}" for i in range(LONG - seen))
    assert sorted([uninterrupted, continued], key=len) == texts
    for events in answers:  # the usage is the whole answer's, as if it had not been cut
        [usage] = [e["usage"] for e in events if e.get("usage")]
        assert usage["completion_tokens"] == LONG


async def test_with_preemption_off_the_light_request_waits_for_a_slot(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    admission = TWO_SLOTS.model_copy(update={"preemption": "off"})
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=admission))
    heavy = await running_streams(router, heavy_pair())

    await stream_events(router, chat("light", 3), "light")

    assert any(task.done() for task in heavy)  # it got its slot when a heavy stream ended
    await asyncio.gather(*heavy)
    assert not [r for r in engine.received if r.body.get("continue_final_message")]
    assert await metric(router, "tandem_router_preemptions_total") == 0


async def test_a_stream_that_cannot_be_continued_is_not_stopped(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    heavy = await running_streams(router, heavy_pair(tools=tools))

    await stream_events(router, chat("light", 3), "light")

    assert any(task.done() for task in heavy)
    await asyncio.gather(*heavy)
    assert await metric(router, "tandem_router_preemptions_total") == 0


async def test_a_tenant_at_its_share_waits_its_turn(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    both = [("heavy", chat("heavy", LONG)), ("light", chat("light", LONG))]
    streams = await running_streams(router, both)  # one slot each: both at their share

    await stream_events(router, chat("light", 3), "light")
    await stream_events(router, chat("heavy", 3), "heavy")

    await asyncio.gather(*streams)
    assert await metric(router, "tandem_router_preemptions_total") == 0


async def test_a_client_that_leaves_while_its_continuation_waits_frees_everything(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    heavy = await running_streams(router, heavy_pair())
    light = asyncio.create_task(stream_events(router, chat("light", LONG), "light"))
    for _ in range(200):
        if await metric(router, "tandem_router_preemptions_total") == 1:
            break
        await asyncio.sleep(0.01)
    for task in heavy:  # the stopped stream's client hangs up before its continuation runs
        task.cancel()

    assert len(text_of(await light)) > 0
    for _ in range(200):
        if await metric(router, "tandem_router_admitted_requests") == 0:
            break
        await asyncio.sleep(0.02)
    assert await metric(router, "tandem_router_admitted_requests") == 0
    assert await metric(router, "tandem_router_endpoint_in_flight_requests") == 0
    assert await metric(router, "tandem_router_queue_depth", priority="0") == 0


async def test_a_continued_stream_ends_with_an_sse_error_when_no_engine_can_continue_it(
    launcher: Launcher,
) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    started = [asyncio.Event(), asyncio.Event()]
    heavy = [asyncio.create_task(raw_answer(router, chat("heavy", LONG), s)) for s in started]
    await asyncio.gather(*(s.wait() for s in started))
    engine.behaviour.status = 500  # from now on the engine refuses everything: the continuation too
    light = await router.http.post("/v1/chat/completions", json={**chat("light", 3), "stream": False})

    assert light.status_code in (500, 502, 503)
    raws = await asyncio.gather(*heavy)
    cut = [raw for raw in raws if b'"error"' in raw]
    assert cut and all(raw.endswith(b"data: [DONE]\n\n") for raw in cut)


async def raw_answer(router: RunningRouter, body: dict[str, Any], started: asyncio.Event) -> bytes:
    raw = b""
    async with router.http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"x-tenant-id": "heavy"}
    ) as response:
        async for chunk in response.aiter_raw():
            raw += chunk
            if raw.count(b"\n\n") >= 4:
                started.set()
    return raw
