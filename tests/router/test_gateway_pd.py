"""Prefill/decode disaggregation through the router: the handoff bodies and every fallback.

Real: the router app, uvicorn servers on 127.0.0.1, the official `openai` client. Faked: the prefill
and decode engines (`FakeEngine`; the prefill engine returns `kv_transfer_params` the way vLLM's NIXL
connector does when asked for a remote decode). No KV moves anywhere: these tests check what the
router sends, not what engines do with it.
"""

from __future__ import annotations

import asyncio

import pytest
from openai.types.chat import ChatCompletionMessageParam
from tests.router.harness import MODEL, NIXL_PARAMS, Launcher, metric
from tests.router.servers import closed_port_url

from tandem.router.pd.handoff import DEFAULT_DECODE_KV_PARAMS, PREFILL_KV_PARAMS
from tandem.router.settings import DisaggregationSettings, RouterSettings

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about disaggregation."}]


async def test_the_prefill_engine_gets_one_token_no_stream_and_remote_decode_params(
    launcher: Launcher,
) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")
    stream = await router.openai.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 2, "ignore_eos": True},
    )
    _ = [chunk async for chunk in stream]
    [sent] = prefill.received
    assert sent.path == "/v1/chat/completions"
    # both halves carry the tenant's cache salt: the prefill's KV is stored where the decode looks
    assert sent.body.pop("cache_salt") == decode.received[0].body["cache_salt"]
    assert sent.body == {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 1,
        "stream": False,
        "ignore_eos": True,
        "kv_transfer_params": dict(PREFILL_KV_PARAMS),
    }


async def test_the_decode_engine_gets_the_original_request_with_the_prefills_params(
    launcher: Launcher,
) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")
    original = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with router.http.stream(
        "POST", "/v1/completions", json=original, headers={"x-request-id": "pd-1"}
    ) as response:
        body = b"".join([chunk async for chunk in response.aiter_raw()])
    assert b" d0-2" in body and body.endswith(b"data: [DONE]\n\n")
    [sent] = decode.received
    assert sent.body.pop("cache_salt") == prefill.received[0].body["cache_salt"]
    assert sent.body == {**original, "kv_transfer_params": NIXL_PARAMS}
    upstream_id = sent.headers["x-request-id"]
    assert prefill.received[0].headers["x-request-id"] == upstream_id  # one id for both halves
    assert upstream_id.startswith("pd-1.") and response.headers["x-request-id"] == "pd-1"
    assert response.headers["x-tandem-prefill-endpoint"] == prefill.url.removeprefix("http://")
    assert response.headers["x-tandem-decode-endpoint"] == decode.url.removeprefix("http://")
    assert "x-tandem-pd-fallback" not in response.headers


async def test_decode_gets_the_default_params_when_the_prefill_returns_none(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0")  # answers without kv_transfer_params
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")
    await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert decode.received[0].body["kv_transfer_params"] == dict(DEFAULT_DECODE_KV_PARAMS)


async def test_auto_mode_disaggregates_a_prompt_with_enough_uncached_tokens(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    decode = await launcher.engine("d0")
    spec = {"disaggregation": {"minUncachedTokens": 3}}
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="auto", spec=spec)
    await router.openai.completions.create(model=MODEL, prompt="a b c", max_tokens=2)
    assert len(prefill.received) == 1
    assert decode.received[0].body["kv_transfer_params"] == NIXL_PARAMS
    decided = await metric(router, "tandem_router_pd_decisions_total", reason="many_uncached")
    assert decided == await metric(router, "tandem_router_pd_decisions_total", decision="disaggregate") == 1


async def test_auto_mode_keeps_a_short_prompt_on_the_decode_pool(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    decode = await launcher.engine("d0")
    spec = {"disaggregation": {"minUncachedTokens": 4}}  # "a b c" is 3 tokens
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="auto", spec=spec)
    raw = await router.openai.completions.with_raw_response.create(model=MODEL, prompt="a b c", max_tokens=2)
    assert prefill.received == []
    assert "x-tandem-pd-fallback" not in raw.headers
    assert "kv_transfer_params" not in decode.received[0].body
    assert (
        await metric(
            router, "tandem_router_pd_decisions_total", decision="decode_only", reason="few_uncached"
        )
        == 1
    )


async def test_mode_off_never_calls_the_prefill_pool(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0")
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="off")
    raw = await router.openai.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2)
    assert prefill.received == []
    assert "kv_transfer_params" not in decode.received[0].body
    assert "x-tandem-prefill-endpoint" not in raw.headers
    assert await metric(router, "tandem_router_pd_decisions_total", decision="decode_only") == 1


async def test_a_prefill_engine_that_is_down_falls_back_to_decode_only_and_counts_it(
    launcher: Launcher,
) -> None:
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[closed_port_url()], mode="always")
    raw = await router.openai.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2)
    assert raw.parse().choices[0].text == " d0-0 d0-1"
    assert raw.headers["x-tandem-pd-fallback"] == "connect"
    assert "x-tandem-prefill-endpoint" not in raw.headers
    assert "kv_transfer_params" not in decode.received[0].body
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="connect") == 1
    assert await metric(router, "tandem_router_pd_prefill_duration_seconds_count", outcome="fallback") == 1


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        pytest.param({"status": 500}, "status", id="5xx"),
        pytest.param({"status": 400}, "rejected", id="4xx"),
    ],
)
async def test_a_failing_prefill_falls_back_with_its_reason(
    launcher: Launcher, behaviour: dict[str, int], reason: str
) -> None:
    prefill = await launcher.engine("p0", **behaviour)
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")
    answer = await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert answer.choices[0].text == " d0-0"
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason=reason) == 1


async def test_a_slow_prefill_times_out_and_the_request_goes_decode_only(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0", answer_delay=30)
    decode = await launcher.engine("d0")
    settings = RouterSettings(disaggregation=DisaggregationSettings(prefill_timeout_seconds=1.0))
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always", settings=settings)
    raw = await router.openai.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=1)
    assert raw.headers["x-tandem-pd-fallback"] == "timeout"
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="timeout") == 1
    # The router closed the prefill connection, and the engine noticed (as vLLM aborts the request).
    await asyncio.wait_for(prefill.cancelled.wait(), timeout=10)


async def test_always_mode_without_prefill_endpoints_counts_a_fallback(launcher: Launcher) -> None:
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], mode="always")
    await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="no_endpoint") == 1


async def test_a_client_that_leaves_during_prefill_aborts_it(launcher: Launcher) -> None:
    prefill = await launcher.engine("p0", answer_delay=30)
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")
    request = asyncio.create_task(
        router.http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    )
    await asyncio.wait_for(prefill.arrived.wait(), timeout=10)
    request.cancel()  # closes the client's connection to the router
    with pytest.raises(asyncio.CancelledError):
        await request
    await asyncio.wait_for(prefill.cancelled.wait(), timeout=10)
    assert decode.received == []
    for _ in range(100):
        if await metric(router, "tandem_router_requests_total", status="499") == 1:
            break
        await asyncio.sleep(0.02)
    assert await metric(router, "tandem_router_requests_total", status="499") == 1
