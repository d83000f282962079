"""Bad input in front of simulated engines: prompts over the context limit, and malformed bodies,
answered with 4xx in OpenAI's error shape whatever the P/D mode.

Real: the router and `tandem.sim` engines (in-process apps, a 64-token context, time scale 10^4),
each a uvicorn server on 127.0.0.1, and raw httpx. Nothing is faked.
"""

from __future__ import annotations

from typing import Literal

import pytest
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter, metric

from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

CONTEXT = 64


async def sim(launcher: Launcher) -> str:
    settings = SimSettings(
        model=MODEL_NAME, served_model_name=MODEL, max_model_len=CONTEXT, time_scale=10_000
    )
    return await launcher.serve_app(sim_app(settings))


async def router_for_mode(launcher: Launcher, mode: Literal["off", "always"]) -> RunningRouter:
    prefill = [await sim(launcher)] if mode == "always" else []
    return await launcher.router(decode=[await sim(launcher)], prefill=prefill, mode=mode)


@pytest.mark.parametrize("mode", ["off", "always"])
async def test_a_prompt_over_the_context_limit_is_a_400_naming_the_limit(
    launcher: Launcher, mode: Literal["off", "always"]
) -> None:
    router = await router_for_mode(launcher, mode)
    for path, body in (
        ("/v1/completions", {"model": MODEL, "prompt": "word " * 200}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "word " * 200}]}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 500}),
    ):
        for stream in (False, True):
            response = await router.http.post(path, json={**body, "stream": stream})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert f"maximum context length is {CONTEXT} tokens" in error["message"]
            assert error["type"] == "BadRequestError"
    assert await metric(router, "tandem_router_upstream_errors_total") == 0  # the client's error


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b'{"model": "qwen", "prompt": ', 400, None),
        (b'{"model": "qwen", "prompt": NaN}', 400, None),
        (b"[1, 2, 3]", 400, None),
        (b'{"model": "qwen", "prompt": {"a": 1}}', 400, "prompt"),
        (b'{"model": "qwen", "prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
        (b'{"model": "qwen", "prompt": "x", "stream": "yes please"}', 400, "stream"),
        (b'{"model": 7, "prompt": "x"}', 400, "model"),
        (b'{"model": "gpt-4o", "prompt": "x"}', 404, "model"),
        (b'{"prompt": "x"}', 400, "model"),
        (b"\xff\xfe", 400, None),
    ],
)
async def test_malformed_requests_get_4xx_in_openai_shape_and_reach_no_engine(
    launcher: Launcher, body: bytes, status: int, param: str | None
) -> None:
    router = await router_for_mode(launcher, "off")
    response = await router.http.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    # pydantic names the union member that failed last (`prompt.str`); the field comes first.
    assert (error["param"] or "").split(".")[0] == (param or "")
    assert await metric(router, "tandem_router_endpoint_in_flight_requests") == 0
