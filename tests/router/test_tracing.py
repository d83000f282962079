"""Traces: a request's whole way as one trace, from the client's `traceparent` through the gateway's
stages to the prefill and decode engines' `llm_request` spans, received by a real OTLP receiver.

Real: OTLP receivers on 127.0.0.1 (gRPC and HTTP/protobuf, `tests.otlp`, decoding the wire's
protobuf), the gateway's OpenTelemetry exporters, redis-server, simulated engines (tiny profile, time
scale 1000, a producer for prefill and a consumer for decode) exporting vLLM's span under
`--otlp-traces-endpoint`. Faked: the mid-stream failure's engine is a `FakeEngine` that breaks its
stream after one token.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.otlp import CLIENT, INTERNAL, SERVER, grpc_receiver, http_receiver
from tests.router.harness import MODEL, MODEL_NAME, Launcher
from tests.router.pd_pool import PROMPT
from tests.servers import RedisServer

from tandem.core.tracing import parse_traceparent, sampled, settings_from_env, traceparent
from tandem.sim.app import create_app as create_sim
from tandem.sim.settings import SimSettings

CLIENT_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CLIENT_SPAN = 0x00F067AA0BA902B7


async def sim(launcher: Launcher, role: Any, pool_url: str, endpoint: str, protocol: str) -> str:
    settings = SimSettings(
        profile="tiny-cpu", model=MODEL_NAME, served_model_name=MODEL, time_scale=1000, kv_role=role,
        kv_pool=pool_url, otlp_traces_endpoint=endpoint,
    )  # fmt: skip
    return await launcher.serve_app(
        create_sim(settings, environ={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol})
    )


def tracing(endpoint: str, protocol: str, ratio: float) -> dict[str, Any]:
    return {"tracing": {"endpoint": endpoint, "protocol": protocol, "samplingRatio": ratio}}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_pd_request_is_one_trace_from_the_clients_span_to_both_engines(
    launcher: Launcher, redis_server: RedisServer, protocol: str
) -> None:
    with grpc_receiver() if protocol == "grpc" else http_receiver() as receiver:
        prefill = await sim(launcher, "producer", redis_server.url, receiver.endpoint, protocol)
        decode = await sim(launcher, "consumer", redis_server.url, receiver.endpoint, protocol)
        router = await launcher.router(
            decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url,
            spec=tracing(receiver.endpoint, protocol, 0.0),
        )  # fmt: skip
        # Sampling ratio 0: only the client's sampled parent makes this request traced.
        headers = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN, True), "x-request-id": "traced-1"}
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "ignore_eos": True, "stream": True}
        async with router.http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            _ = [line async for line in response.aiter_lines()]
        assert response.headers["x-tandem-prefill-endpoint"] == prefill.removeprefix("http://")
        untraced = await router.http.post("/v1/completions", json={**body, "stream": False})
        assert untraced.status_code == 200
        trace_id = f"{CLIENT_TRACE:032x}"
        spans = receiver.wait_for(7, trace_id=trace_id)
        assert len(receiver.wait_for(8, timeout_s=2.0)) == 7, "the request without a parent is not traced"
    by_name = {s.name: s for s in spans}
    assert (
        sorted(by_name)
        == sorted(
            [
                f"text_completion {MODEL}",
                "tandem.admission",
                "tandem.prefill",
                "tandem.kv_barrier",
                "tandem.decode",
                "llm_request",
            ]
        )
        and len(spans) == 7
    ), [s.name for s in spans]
    server = by_name[f"text_completion {MODEL}"]
    assert (server.parent_id, server.kind, server.error) == (f"{CLIENT_SPAN:016x}", SERVER, False)
    assert server.service == "test-router"
    attrs = server.attributes
    assert attrs["gen_ai.operation.name"] == "text_completion" and attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.usage.input_tokens"] == len(PROMPT) and attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["tandem.request_id"] == "traced-1" and attrs["tandem.pd"] == "disaggregated"
    assert attrs["tandem.kv_barrier"] == "ok" and attrs["http.response.status_code"] == 200
    assert attrs["tandem.prefill_endpoint"] == prefill.removeprefix("http://")
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    for name in ("tandem.admission", "tandem.prefill", "tandem.kv_barrier", "tandem.decode"):
        child = by_name[name]
        assert child.parent_id == server.span_id, name
        assert server.start_ns <= child.start_ns <= child.end_ns <= server.end_ns, name
    assert (by_name["tandem.prefill"].kind, by_name["tandem.decode"].kind) == (CLIENT, CLIENT)
    assert by_name["tandem.admission"].kind == INTERNAL
    # Each engine's vLLM span is the child of the gateway's call to it.
    engines = sorted((s for s in spans if s.name == "llm_request"), key=lambda s: s.start_ns)
    assert [s.parent_id for s in engines] == [
        by_name["tandem.prefill"].span_id,
        by_name["tandem.decode"].span_id,
    ]
    assert all(s.kind == SERVER and s.service == f"vllm-{MODEL}" for s in engines)
    assert engines[1].attributes["gen_ai.usage.completion_tokens"] == 3
    assert "prompt" not in str(attrs) and "tandem.output" not in attrs, "no text without logPrompts"


async def test_a_429_and_a_stream_that_breaks_are_spans_with_error_status(launcher: Launcher) -> None:
    with grpc_receiver() as receiver:
        broken = await launcher.engine("d0", die_after=1, tokens=8)
        spec = {**tracing(receiver.endpoint, "grpc", 1.0), "router": {"rateLimits": {"requestsPerMinute": 1}}}
        router = await launcher.router(decode=[broken], spec=spec)
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "stream": True}
        async with router.http.stream("POST", "/v1/completions", json=body) as first:
            _ = [line async for line in first.aiter_lines()]
        limited = await router.http.post("/v1/completions", json=body)
        assert limited.status_code == 429
        servers = [s for s in receiver.wait_for(4) if s.kind == SERVER]
    assert len(servers) == 2
    broken_span, limited_span = sorted(servers, key=lambda s: s.start_ns)
    assert broken_span.error and broken_span.attributes["http.response.status_code"] == 200
    assert broken_span.status_message
    assert limited_span.error and limited_span.attributes["http.response.status_code"] == 429


async def test_with_tracing_off_no_trace_headers_reach_the_engines(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    headers = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN, True)}
    response = await router.http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "x"}, headers=headers
    )
    assert response.status_code == 200
    assert "traceparent" not in engine.received[-1].headers


def test_the_standard_otel_variables_win_over_the_spec_and_can_turn_tracing_off() -> None:
    from tandem.core.tracing import TracingSpec

    spec = TracingSpec(endpoint="http://collector:4317", sampling_ratio=0.5)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318/v1/traces", "OTEL_EXPORTER_OTLP_PROTOCOL":
           "http/protobuf", "OTEL_TRACES_SAMPLER_ARG": "0.25"}  # fmt: skip
    assert settings_from_env(spec, env) == TracingSpec(
        endpoint="http://other:4318/v1/traces", protocol="http/protobuf", sampling_ratio=0.25
    )
    assert settings_from_env(spec, {"OTEL_SDK_DISABLED": "true"}) is None
    assert settings_from_env(None, {}) is None
    assert settings_from_env(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}) == TracingSpec(
        endpoint="http://c:4317"
    )


def test_traceparent_parsing_and_parent_based_ratio_sampling() -> None:
    header = traceparent(CLIENT_TRACE, CLIENT_SPAN, False)
    assert parse_traceparent(header) == (CLIENT_TRACE, CLIENT_SPAN, False)
    assert parse_traceparent("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None
    assert parse_traceparent("01-abc") is None and parse_traceparent(None) is None
    assert sampled(CLIENT_TRACE, parent=True, ratio=0.0) and not sampled(
        CLIENT_TRACE, parent=False, ratio=1.0
    )
    ids = range(1, 20_001)
    share = sum(sampled(i * 0x9E3779B97F4A7C15 % (1 << 64), parent=None, ratio=0.1) for i in ids) / len(ids)
    assert 0.09 < share < 0.11


async def test_a_request_retried_on_another_engine_says_so_in_its_span(launcher: Launcher) -> None:
    with grpc_receiver() as receiver:
        failing = await launcher.engine("d0", status=503)
        healthy = await launcher.engine("d1")
        router = await launcher.router(
            decode=[failing, healthy], spec=tracing(receiver.endpoint, "grpc", 1.0)
        )
        retried = None
        for i in range(6):  # until one request was sent to the failing engine first
            response = await router.http.post(
                "/v1/completions", json={"model": MODEL, "prompt": f"p{i}"}, headers={"x-request-id": f"r{i}"}
            )
            assert response.status_code == 200
            if failing.received:
                retried = f"r{i}"
                break
        assert retried is not None
        servers = [s for s in receiver.wait_for(2 * (int(retried[1:]) + 1)) if s.kind == SERVER]
    span = next(s for s in servers if s.attributes["tandem.request_id"] == retried)
    assert span.attributes["tandem.retries"] == 1 and not span.error
    assert span.attributes["tandem.decode_endpoint"] == healthy.url.removeprefix("http://")
