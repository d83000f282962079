"""The gateway's happy paths and request validation, end to end.

Real: the router app (`create_app`, its own httpx client), uvicorn servers on 127.0.0.1, the official
`openai` client as the caller. Faked: the engines (`fake_engine.FakeEngine`, an OpenAI-speaking
FastAPI app that records what it receives).
"""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.harness import MODEL, MODEL_NAME, Launcher


async def test_a_non_streaming_chat_completion_is_the_engines_answer(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    answer = await router.openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert answer.choices[0].message.content == " d0-0 d0-1 d0-2"
    assert answer.usage is not None and answer.usage.completion_tokens == 3


async def test_a_streaming_chat_completion_arrives_chunk_by_chunk_with_usage(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    stream = await router.openai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " d0-0 d0-1 d0-2 d0-3"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_a_non_streaming_completion_is_the_engines_answer(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    answer = await router.openai.completions.create(model=MODEL, prompt="Once", max_tokens=2)
    assert answer.choices[0].text == " d0-0 d0-1"


async def test_a_streaming_completion_is_relayed_byte_for_byte(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    body = {"model": MODEL, "prompt": "Once", "max_tokens": 2, "stream": True}
    async with router.http.stream("POST", "/v1/completions", json=body) as response:
        relayed = b"".join([chunk async for chunk in response.aiter_raw()])
    async with router.http.stream("POST", f"{engine.url}/v1/completions", json=body) as direct:
        original = b"".join([chunk async for chunk in direct.aiter_raw()])
    assert response.headers["content-type"].startswith("text/event-stream")
    assert relayed == original
    assert relayed.endswith(b"data: [DONE]\n\n")


async def test_requests_go_round_robin_over_three_decode_engines(launcher: Launcher) -> None:
    engines = [await launcher.engine(f"d{i}") for i in range(3)]
    router = await launcher.router(decode=engines)
    for _ in range(6):
        await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert [len(e.received) for e in engines] == [2, 2, 2]


async def test_the_body_reaches_the_engine_unchanged_with_unknown_fields(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    body = {
        "model": MODEL,
        "prompt": [1, 2, 3],
        "max_tokens": 2,
        "ignore_eos": True,
        "min_tokens": 1,
        "vendor_extension": {"nested": [1, "two"]},
    }
    response = await router.http.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert engine.received[0].body.pop("cache_salt").startswith("t1-")  # the gateway's own field
    assert engine.received[0].body == body
    assert engine.received[0].path == "/v1/completions"


async def test_an_incoming_request_id_is_echoed_and_engines_see_it_made_unique(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    responses = await asyncio.gather(
        *(
            router.http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "x", "max_tokens": 1},
                headers={"x-request-id": "req-42"},
            )
            for _ in range(2)
        )
    )
    assert [r.headers["x-request-id"] for r in responses] == ["req-42", "req-42"]
    assert responses[0].headers["x-tandem-decode-endpoint"] == engine.url.removeprefix("http://")
    assert "x-tandem-prefill-endpoint" not in responses[0].headers
    upstream = [r.headers["x-request-id"] for r in engine.received]
    assert all(u.startswith("req-42.") for u in upstream)
    assert len(set(upstream)) == 2  # the same client id twice is still two requests to the engine


@pytest.mark.parametrize(
    "bad",
    ["x" * 129, "has space", 'quo"te', "new\tline", ""],
    ids=["too-long", "space", "quote", "control", "empty"],
)
async def test_a_malformed_request_id_is_a_400_naming_the_header(launcher: Launcher, bad: str) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    response = await router.http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 1},
        headers={"x-request-id": bad},
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-request-id"
    assert len(response.headers["x-request-id"]) == 32  # a fresh id, not the client's
    assert engine.received == []


async def test_engine_steering_fields_from_clients_are_dropped(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    hostile = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 1,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "remote_block_ids": [1, 2, 3],
            "remote_host": "10.9.9.9",
        },
        "priority": -100,
        "request_id": "someone-elses-request",
        "cache_salt": "another-tenants-salt",
    }
    response = await router.http.post("/v1/completions", json=hostile)
    assert response.status_code == 200
    sent = engine.received[0].body
    assert not {"kv_transfer_params", "priority", "request_id"} & set(sent)
    assert sent.pop("cache_salt") != "another-tenants-salt"  # replaced by the tenant's own
    assert sent == {"model": MODEL, "prompt": "x", "max_tokens": 1}


async def test_a_request_without_an_id_gets_one_that_the_engine_sees_too(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    raw = await router.openai.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=1)
    request_id = raw.headers["x-request-id"]
    assert len(request_id) == 32
    assert engine.received[0].headers["x-request-id"] == request_id


async def test_the_model_name_is_accepted_as_well_as_the_served_name(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    answer = await router.openai.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1)
    assert answer.choices[0].text == " d0-0"


async def test_invalid_json_is_a_400_in_openai_error_shape(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    response = await router.http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert "not valid JSON" in error["message"]
    assert engine.received == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"model": MODEL, "prompt": "x", "max_tokens": "many"}, "max_tokens", id="bad-type"),
        pytest.param({"model": MODEL, "prompt": "x", "temperature": 3}, "temperature", id="out-of-range"),
        pytest.param({"model": MODEL}, "prompt", id="missing-prompt"),
    ],
)
async def test_an_invalid_parameter_is_a_400_naming_it(
    launcher: Launcher, body: dict[str, object], param: str
) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    response = await router.http.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert error["message"].startswith(f"{param}: ")
    assert engine.received == []


async def test_an_unknown_model_is_a_404_worded_like_vllm(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    with pytest.raises(openai.NotFoundError) as caught:
        await router.openai.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body == {
        "message": "The model `gpt-9` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


async def test_an_engines_4xx_is_passed_through_without_retry(launcher: Launcher) -> None:
    engines = [await launcher.engine(f"d{i}", status=400) for i in range(2)]
    router = await launcher.router(decode=engines)
    response = await router.http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].endswith("fails on purpose")
    assert sum(len(e.received) for e in engines) == 1


async def test_models_lists_the_engines_models_once(launcher: Launcher) -> None:
    engines = [await launcher.engine(f"d{i}") for i in range(2)]
    router = await launcher.router(decode=engines)
    models = [m async for m in router.openai.models.list()]
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "fake"


async def test_models_lists_the_served_name_even_when_every_engine_is_down(launcher: Launcher) -> None:
    router = await launcher.router(decode=["http://127.0.0.1:9"])
    models = [m async for m in router.openai.models.list()]
    assert [(m.id, m.owned_by) for m in models] == [(MODEL, "tandem")]


async def test_health_is_ok_while_a_decode_endpoint_is_in_rotation(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    response = await router.http.get("/health")
    assert response.status_code == 200
    assert response.json()["pools"]["decode"] == {"endpoints": 1, "in_rotation": 1}


async def test_an_unknown_path_is_a_404_in_openai_error_shape(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    response = await router.http.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "NotFoundError"


async def test_the_request_log_line_names_tenant_endpoint_and_status(
    launcher: Launcher, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    with caplog.at_level(logging.INFO, logger="tandem.router"):
        await router.http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1},
            headers={"x-tenant-id": "team-a", "x-request-id": "req-7"},
        )
    [line] = [r for r in caplog.records if r.getMessage() == "request"]
    fields = line.__dict__
    assert fields["status"] == 200
    assert fields["tenant"] == "team-a"
    assert fields["decode_endpoint"] == engine.url.removeprefix("http://")
    assert fields["route"] == "/v1/completions"
    assert fields["duration_s"] >= 0 and fields["ttfb_s"] >= 0


async def test_metrics_expose_the_documented_names(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)
    response = await router.http.get("/metrics")
    names = {m.name for m in text_string_to_metric_families(response.text)}
    assert {
        "tandem_router_requests",
        "tandem_router_request_duration_seconds",
        "tandem_router_time_to_first_byte_seconds",
        "tandem_router_upstream_errors",
        "tandem_router_retries",
        "tandem_router_pd_decisions",
        "tandem_router_pd_prefill_duration_seconds",
        "tandem_router_pd_fallbacks",
        "tandem_router_endpoint_up",
        "tandem_router_endpoint_in_flight_requests",
        "tandem_router_endpoint_consecutive_failures",
        "tandem_router_pool_in_flight_requests",
        "tandem_router_schedule_decision_duration_seconds",
    } <= names
    assert 'tandem_router_requests_total{route="/v1/completions",status="200"} 1.0' in response.text
    assert 'tandem_router_schedule_decision_duration_seconds_count{pool="decode"} 1.0' in response.text
    endpoint = engine.url.removeprefix("http://")
    assert f'tandem_router_endpoint_up{{endpoint="{endpoint}",pool="decode"}} 1.0' in response.text
