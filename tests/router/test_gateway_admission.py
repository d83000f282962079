"""Admission through the whole gateway: 429s with Retry-After, queueing while saturated, header
validation, and the token charges taken from the answers.

Real: the router app on a uvicorn server on 127.0.0.1, the official `openai` client and raw httpx as
callers, the router's /metrics. Faked: the engines (`FakeEngine`: one " d0-<i>" token per SSE event,
usage with 3 prompt tokens). Saturation comes from a per-endpoint in-flight limit of 1 and an engine
that answers slowly; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from tests.router.fake_engine import PROMPT_TOKENS
from tests.router.harness import MODEL, Launcher, RunningRouter, metric

from tandem.router.settings import AdmissionSettings, RouterSettings

ONE_AT_A_TIME = RouterSettings(admission=AdmissionSettings(max_in_flight_per_endpoint=1, poll_seconds=0.02))
LONG_SLO = {"router": {"slo": {"ttftSeconds": 600}}}


async def hold_the_only_slot(router: RunningRouter) -> asyncio.Task[object]:
    """Start a request the slow engine sits on; returns once it holds the pool's capacity."""
    task: asyncio.Task[object] = asyncio.create_task(
        router.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    )
    for _ in range(500):
        if await metric(router, "tandem_router_admitted_requests") == 1:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the first request was never admitted")


async def test_a_full_queue_answers_429_with_retry_after_in_openai_shape(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", answer_delay=30)
    spec = {"router": {"maxQueue": 0}}
    router = await launcher.router(decode=[decode], settings=ONE_AT_A_TIME, spec=spec)
    first = await hold_the_only_slot(router)
    response = await router.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "y", "max_tokens": 1}, headers={"x-tenant-id": "b"}
    )
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "RateLimitError" and error["code"] == 429
    assert "queue is full" in error["message"]
    with pytest.raises(openai.RateLimitError):
        await router.openai.completions.create(model=MODEL, prompt="z", max_tokens=1)
    assert await metric(router, "tandem_router_admission_rejections_total", reason="queue_full") == 2
    first.cancel()


async def test_a_queued_request_whose_client_leaves_is_out_of_the_queue_at_once(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", answer_delay=30)
    router = await launcher.router(decode=[decode], settings=ONE_AT_A_TIME)
    first = await hold_the_only_slot(router)
    body = {"model": MODEL, "prompt": "y", "max_tokens": 1}
    queued = asyncio.create_task(router.http.post("/v1/completions", json=body, headers={"x-tenant-id": "b"}))
    for _ in range(500):
        if await metric(router, "tandem_router_queue_depth", priority="0") == 1:
            break
        await asyncio.sleep(0.01)
    queued.cancel()  # the client hangs up while its request waits
    for _ in range(500):
        if await metric(router, "tandem_router_queue_wait_seconds_count", outcome="cancelled") == 1:
            break
        await asyncio.sleep(0.01)
    assert await metric(router, "tandem_router_queue_depth", priority="0") == 0
    assert await metric(router, "tandem_router_queue_wait_seconds_count", outcome="cancelled") == 1
    assert [r.body["prompt"] for r in decode.received] == ["x"]  # it never reached the engine
    first.cancel()


async def test_the_default_objective_is_nobodys_deadline_a_queued_request_waits(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", token_delay=0.3, tokens=2)
    spec = {"router": {"slo": {"ttftSeconds": 0.05}}}  # a default objective far below the wait
    router = await launcher.router(decode=[decode], settings=ONE_AT_A_TIME, spec=spec)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    answers = await asyncio.gather(*(router.http.post("/v1/completions", json=body) for _ in range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert await metric(router, "tandem_router_admission_rejections_total", reason="deadline") == 0


async def test_a_request_that_cannot_start_within_its_ttft_objective_gets_429(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", answer_delay=30)
    router = await launcher.router(decode=[decode], settings=ONE_AT_A_TIME)
    first = await hold_the_only_slot(router)
    response = await router.http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "y", "max_tokens": 1},
        headers={"x-slo-ttft-ms": "50"},
    )
    assert response.status_code == 429 and "retry-after" in response.headers
    assert "0.05s" in response.json()["error"]["message"]
    assert await metric(router, "tandem_router_admission_rejections_total", reason="deadline") == 1
    assert await metric(router, "tandem_router_queue_wait_seconds_count", outcome="rejected") == 1
    first.cancel()


async def test_a_queued_request_is_served_when_the_running_one_ends(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", token_delay=0.05, tokens=4)
    router = await launcher.router(decode=[decode], settings=ONE_AT_A_TIME, spec=LONG_SLO)

    async def ask(prompt: str) -> str:
        answer = await router.openai.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, stream=False
        )
        return answer.choices[0].text

    texts = await asyncio.gather(*(ask(p) for p in ("a", "b", "c")))
    assert texts == [" d0-0 d0-1 d0-2 d0-3"] * 3
    assert await metric(router, "tandem_router_queue_wait_seconds_count", outcome="dispatched") == 3
    assert await metric(router, "tandem_router_admitted_requests") == 0
    assert await metric(router, "tandem_router_queue_depth", priority="0") == 0


@pytest.mark.parametrize(
    ("header", "value"),
    [("x-priority", "urgent"), ("x-slo-ttft-ms", "-1"), ("x-slo-tpot-ms", "soon")],
)
async def test_malformed_admission_headers_are_a_400(launcher: Launcher, header: str, value: str) -> None:
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode])
    response = await router.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}, headers={header: value}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == header
    assert decode.received == []


async def test_a_stream_without_usage_is_charged_from_usage_the_client_never_sees(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", tokens=5)
    router = await launcher.router(decode=[decode])
    body = {"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": True}
    async with router.http.stream(
        "POST", "/v1/completions", json=body, headers={"x-tenant-id": "t1"}
    ) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert all(b'"usage"' not in e for e in events)  # the router's own request for usage is hidden
    assert len(events) == 5 + 2  # five tokens, the finish event, [DONE]
    assert decode.received[0].body["stream_options"] == {"include_usage": True}
    served = await metric(router, "tandem_router_tenant_served_tokens_total", tenant="t1", kind="completion")
    prompt = await metric(router, "tandem_router_tenant_served_tokens_total", tenant="t1", kind="prompt")
    assert (served, prompt) == (5, PROMPT_TOKENS)  # "x" is 1 token here; the engine said 3
    assert await metric(router, "tandem_router_tenant_vtc_counter", tenant="t1") == PROMPT_TOKENS + 2 * 5


async def test_a_client_that_asked_for_usage_gets_it(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", tokens=2)
    router = await launcher.router(decode=[decode])
    stream = await router.openai.completions.create(
        model=MODEL, prompt="x", max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2


async def test_non_streaming_answers_are_charged_from_their_usage(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", tokens=3)
    router = await launcher.router(decode=[decode])
    chat = await router.openai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"x-tenant-id": "t2"},
    )
    assert chat.usage is not None
    assert (
        await metric(router, "tandem_router_tenant_served_tokens_total", tenant="t2", kind="completion") == 3
    )


async def test_tenant_labels_are_bounded(launcher: Launcher) -> None:
    decode = await launcher.engine("d0", tokens=1)
    settings = RouterSettings(admission=AdmissionSettings(max_tenant_labels=1))
    router = await launcher.router(decode=[decode], settings=settings)
    for tenant in ("first", "second", "third"):
        await router.openai.completions.create(
            model=MODEL, prompt="x", max_tokens=1, extra_headers={"x-tenant-id": tenant}
        )
    text = (await router.http.get("/metrics")).text
    served = [
        line for line in text.splitlines() if line.startswith("tandem_router_tenant_served_tokens_total{")
    ]
    assert {json.dumps(sorted(line.split("{")[1].split("}")[0].split(","))) for line in served} == {
        json.dumps(['kind="completion"', 'tenant="first"']),
        json.dumps(['kind="prompt"', 'tenant="first"']),
        json.dumps(['kind="completion"', 'tenant="other"']),
        json.dumps(['kind="prompt"', 'tenant="other"']),
    }
    assert (
        await metric(router, "tandem_router_tenant_served_tokens_total", tenant="other", kind="completion")
        == 2
    )
