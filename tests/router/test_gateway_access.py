"""Access control through the whole gateway: API keys (401s, tenants from keys, reloads), rate limits
(429 with Retry-After), tenant weights from the spec, the body limit, prompt logging, and the OpenAPI
document that describes the real request bodies.

Real: the router app served by uvicorn on 127.0.0.1, key files on disk, raw httpx and the official
`openai` client. Faked: the engines (`FakeEngine`) and, for rate limits, the router's clock.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import openai
import pytest
from tests.router.fake_engine import FakeEngine
from tests.router.harness import MODEL, FakeClock, Launcher, RunningRouter, metric, router_config

from tandem.core.tokenizer import encode
from tandem.router.settings import AccessSettings, AdmissionSettings, RouterSettings

SECRET_A = "sk-team-a-4f9c2e7d1b8a6035"
SECRET_B = "sk-team-b-0d1e2f3a4b5c6d7e"
COMPLETION = {"model": MODEL, "prompt": "x", "max_tokens": 4}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def keyed_router(
    launcher: Launcher, engine: FakeEngine, keys: Path, *, settings: RouterSettings | None = None
) -> RunningRouter:
    config = router_config(decode=[engine.url]).model_copy(update={"api_keys_file": str(keys)})
    return await launcher.router_for(config, settings=settings)


async def test_without_a_valid_key_the_gateway_answers_401_invalid_api_key(
    launcher: Launcher, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n")
    engine = await launcher.engine("d0")
    router = await keyed_router(launcher, engine, keys)
    for headers in ({}, bearer("sk-wrong"), {"x-api-key": SECRET_A[:-1]}, {"authorization": SECRET_A}):
        response = await router.http.post("/v1/completions", json=COMPLETION, headers=headers)
        assert response.status_code == 401
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
        assert SECRET_A not in response.text and "sk-wrong" not in response.text
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert (await router.http.get("/v1/models")).status_code == 401
    assert engine.received == []
    # No header, a key without the Bearer scheme, and /v1/models: missing; the other two: invalid.
    assert await metric(router, "tandem_router_auth_failures_total", reason="missing") == 3
    assert await metric(router, "tandem_router_auth_failures_total", reason="invalid") == 2


async def test_with_a_valid_key_the_openai_client_is_served_and_health_and_metrics_stay_open(
    launcher: Launcher, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n")
    engine = await launcher.engine("d0")
    router = await keyed_router(launcher, engine, keys)
    client = router.openai.with_options(api_key=SECRET_A)
    answer = await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert answer.choices[0].text == " d0-0 d0-1"
    assert [m.id async for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        await router.openai.completions.create(model=MODEL, prompt="x", max_tokens=1)  # key "x"
    assert (await router.http.get("/health")).status_code == 200
    assert (await router.http.get("/metrics")).status_code == 200
    assert (await router.http.get("/openapi.json")).status_code == 200
    assert "authorization" not in engine.received[0].headers  # keys never go upstream
    assert await metric(router, "tandem_router_api_keys") == 1


async def test_the_tenant_comes_from_the_key_and_a_tenant_header_is_ignored(
    launcher: Launcher, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n")
    engine = await launcher.engine("d0")
    router = await keyed_router(launcher, engine, keys)
    with caplog.at_level(logging.DEBUG):
        response = await router.http.post(
            "/v1/completions", json=COMPLETION, headers={**bearer(SECRET_A), "x-tenant-id": "team-b"}
        )
    assert response.status_code == 200
    [line] = [r for r in caplog.records if r.getMessage() == "request"]
    assert line.__dict__["tenant"] == "team-a"
    assert SECRET_A not in caplog.text  # keys are never logged
    assert await metric(router, "tandem_router_tenant_served_tokens_total", tenant="team-a") > 0


async def test_a_changed_key_file_takes_effect_without_a_restart(launcher: Launcher, tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n")
    engine = await launcher.engine("d0")
    settings = RouterSettings(access=AccessSettings(api_keys_reload_seconds=0.05))
    router = await keyed_router(launcher, engine, keys, settings=settings)
    replacement = tmp_path / "keys.new"
    replacement.write_text(f"{SECRET_B}: team-b\n")
    replacement.replace(keys)  # atomically, as the kubelet swaps a Secret's files
    status = 0
    for _ in range(400):  # up to about 20 s on a loaded machine
        status = (
            await router.http.post("/v1/completions", json=COMPLETION, headers=bearer(SECRET_B))
        ).status_code
        if status == 200:
            break
        await asyncio.sleep(0.05)
    assert status == 200
    old = await router.http.post("/v1/completions", json=COMPLETION, headers=bearer(SECRET_A))
    assert old.status_code == 401
    assert await metric(router, "tandem_router_api_key_reloads_total", outcome="ok") == 1


async def test_over_the_request_limit_a_tenant_gets_429_rate_limit_exceeded_with_retry_after(
    launcher: Launcher,
) -> None:
    engine = await launcher.engine("d0")
    clock = FakeClock()
    spec = {"router": {"rateLimits": {"requestsPerMinute": 2}}}
    router = await launcher.router(decode=[engine], spec=spec, clock=clock)
    headers = {"x-tenant-id": "team-a"}
    for _ in range(2):
        assert (
            await router.http.post("/v1/completions", json=COMPLETION, headers=headers)
        ).status_code == 200
    refused = await router.http.post("/v1/completions", json=COMPLETION, headers=headers)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "30"  # 2 per minute: one more in 30 s
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
    assert "requests per minute: limit 2" in error["message"]
    other = await router.http.post("/v1/completions", json=COMPLETION, headers={"x-tenant-id": "team-b"})
    assert other.status_code == 200  # buckets are per tenant
    assert await metric(router, "tandem_router_rate_limited_total", tenant="team-a", kind="requests") == 1
    clock.advance(30)
    assert (await router.http.post("/v1/completions", json=COMPLETION, headers=headers)).status_code == 200
    assert len(engine.received) == 4


async def test_prompt_and_streamed_output_tokens_count_against_the_token_limit(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=4)
    clock = FakeClock()
    prompt_tokens = len(encode("x"))
    per_request = prompt_tokens + 4
    spec = {"router": {"rateLimits": {"tokensPerMinute": 2 * per_request}}}
    router = await launcher.router(decode=[engine], spec=spec, clock=clock)
    stream = {**COMPLETION, "stream": True}
    for _ in range(2):
        response = await router.http.post("/v1/completions", json=stream)
        assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    refused = await router.http.post("/v1/completions", json=stream)
    assert refused.status_code == 429
    assert refused.json()["error"]["message"].startswith("Rate limit reached for tenant 'default' on tokens")
    # Empty bucket; it refills at 2 * per_request tokens per minute, and the request needs its prompt.
    assert int(refused.headers["retry-after"]) == -(-60 * prompt_tokens // (2 * per_request))
    assert await metric(router, "tandem_router_rate_limited_total", kind="tokens") == 1


async def test_a_tenants_own_limits_replace_the_defaults(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    spec = {
        "router": {
            "rateLimits": {"requestsPerMinute": 1},
            "tenants": [
                {"name": "gold", "rateLimits": {}},
                {"name": "silver", "rateLimits": {"requestsPerMinute": 3}},
            ],
        }
    }
    router = await launcher.router(decode=[engine], spec=spec, clock=FakeClock())

    async def statuses(tenant: str, n: int) -> list[int]:
        headers = {"x-tenant-id": tenant}
        return [
            (await router.http.post("/v1/completions", json=COMPLETION, headers=headers)).status_code
            for _ in range(n)
        ]

    assert await statuses("bronze", 2) == [200, 429]
    assert await statuses("silver", 4) == [200, 200, 200, 429]
    assert await statuses("gold", 5) == [200] * 5


async def test_tenant_weights_from_the_spec_scale_their_fair_queue_charges(launcher: Launcher) -> None:
    engine = await launcher.engine("d0", tokens=4)
    spec = {"router": {"tenants": [{"name": "gold", "weight": 4}]}}
    router = await launcher.router(decode=[engine], spec=spec)
    for tenant in ("gold", "plain"):
        response = await router.http.post("/v1/completions", json=COMPLETION, headers={"x-tenant-id": tenant})
        assert response.status_code == 200
    gold = await metric(router, "tandem_router_tenant_vtc_counter", tenant="gold")
    plain = await metric(router, "tandem_router_tenant_vtc_counter", tenant="plain")
    # `plain` arrived after `gold`, so VTC first lifted its counter to gold's; the rest is its charge.
    plain_charge = plain - gold
    assert plain_charge > 0 and gold == pytest.approx(plain_charge / 4)


async def test_a_body_over_the_limit_is_a_413_in_openai_shape(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    settings = RouterSettings(access=AccessSettings(max_request_bytes=4096))
    router = await launcher.router(decode=[engine], settings=settings)
    response = await router.http.post("/v1/completions", json={**COMPLETION, "prompt": "y" * 5000})
    assert response.status_code == 413
    assert response.json()["error"]["message"].endswith("exceeds the limit of 4096 bytes")

    async def chunked() -> Any:
        for _ in range(3):
            yield b" " * 2000  # no content-length: the limit applies while reading

    response = await router.http.post("/v1/completions", content=chunked())
    assert response.status_code == 413
    assert engine.received == []


@pytest.mark.parametrize("stream", [False, True])
async def test_prompts_and_outputs_are_not_logged_unless_asked(
    launcher: Launcher, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    engine = await launcher.engine("d0", tokens=2)
    quiet = await launcher.router(decode=[engine])
    loud = await launcher.router(decode=[engine], spec={"router": {"logPrompts": True}})
    body = {"model": MODEL, "messages": [{"role": "user", "content": "secret-plan-42"}], "stream": stream}
    with caplog.at_level(logging.DEBUG):
        assert (await quiet.http.post("/v1/chat/completions", json=body)).status_code == 200
    assert "secret-plan-42" not in caplog.text and "d0-0" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tandem.router"):
        assert (await loud.http.post("/v1/chat/completions", json=body)).status_code == 200
    [line] = [r for r in caplog.records if r.getMessage() == "request"]
    assert "secret-plan-42" in line.__dict__["prompt"]
    assert line.__dict__["output"] == " d0-0 d0-1"


async def test_openapi_describes_the_real_request_bodies_and_the_key(
    launcher: Launcher, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n")
    engine = await launcher.engine("d0")
    router = await keyed_router(launcher, engine, keys)
    document = (await router.http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    for path, name in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        operation = document["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(name)
        assert operation["security"] == [{"apiKey": []}]
        assert {"200", "400", "401", "404", "429"} <= set(operation["responses"])
    assert set(schemas["ChatCompletionRequest"]["required"]) == {"model", "messages"}
    assert schemas["CompletionRequest"]["properties"]["model"]["enum"] == sorted(
        {MODEL, "Qwen/Qwen2.5-7B-Instruct"}
    )
    assert "security" not in document["paths"]["/health"]["get"]


async def test_priority_comes_from_the_tenants_band_and_a_client_cannot_raise_itself(
    launcher: Launcher, tmp_path: Path
) -> None:
    """Auth on: team-a (band 0, not listed) tries to jump the queue with x-priority and by naming
    team-b (band 3) in the tenant header; both are refused or ignored, and team-b's request, queued
    after team-a's, is still dispatched first because of its configured band."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"{SECRET_A}: team-a\n{SECRET_B}: team-b\n")
    engine = await launcher.engine("d0", answer_delay=30)
    config = router_config(
        decode=[engine.url],
        spec={"router": {"tenants": [{"name": "team-b", "priority": 3}], "slo": {"ttftSeconds": 600}}},
    ).model_copy(update={"api_keys_file": str(keys)})
    one = RouterSettings(admission=AdmissionSettings(max_in_flight_per_endpoint=1, poll_seconds=0.02))
    router = await launcher.router_for(config, settings=one)
    for headers in ({"x-priority": "10"}, {"x-priority": "3", "x-tenant-id": "team-b"}, {"x-priority": "1"}):
        refused = await router.http.post(
            "/v1/completions", json=COMPLETION, headers={**bearer(SECRET_A), **headers}
        )
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["type"] == "PermissionDeniedError" and error["param"] == "x-priority"
        assert "team-a" in error["message"] and "band (0)" in error["message"]
    assert engine.received == []
    with pytest.raises(openai.PermissionDeniedError):
        await router.openai.with_options(api_key=SECRET_A).completions.create(
            model=MODEL, prompt="x", max_tokens=1, extra_headers={"x-priority": "5"}
        )

    def send(key: str, prompt: str, **headers: str) -> asyncio.Task[Any]:
        body = {**COMPLETION, "prompt": prompt, "max_tokens": 1}
        return asyncio.create_task(
            router.http.post("/v1/completions", json=body, headers={**bearer(key), **headers})
        )

    async def waiting(band: str, n: int) -> None:
        for _ in range(500):
            if await metric(router, "tandem_router_queue_depth", priority=band) == n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"never {n} waiting in band {band}")

    holder = send(SECRET_A, "holder")
    await engine.arrived.wait()
    early = send(SECRET_A, "a-first")
    await waiting("0", 1)
    lowered = send(SECRET_B, "b-lowered", **{"x-priority": "-1"})  # lowering itself is allowed
    await waiting("-1", 1)
    late = send(SECRET_B, "b-later")
    await waiting("3", 1)
    holder.cancel()
    for _ in range(500):
        if len(engine.received) >= 2:
            break
        await asyncio.sleep(0.01)
    assert [r.body["prompt"] for r in engine.received] == ["holder", "b-later"]
    for task in (early, lowered, late):
        task.cancel()
