"""What the KV-pool stories through the router share: the prompts, simulated engines writing a real
pool in LMCache's layout, and a completion that must succeed (tests/router/test_gateway_pd_pool.py,
tests/router/test_gateway_pool_keys_check.py), and a streamed body (the recall and prefill-ahead stories)."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.router.fake_engine import FakeEngine
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter

from tandem.sim.app import create_app as create_sim
from tandem.sim.settings import KVRole, SimSettings

PROMPT = [1000 + i for i in range(600)]  # two full 256-token chunks and 88 more
AUTO_512 = {"disaggregation": {"minUncachedTokens": 512}}


async def sim(launcher: Launcher, role: KVRole, pool_url: str) -> str:
    """A simulated engine (the tiny profile at time scale 1000) with `role` on the pool at `pool_url`."""
    settings = SimSettings(
        profile="tiny-cpu",
        model=MODEL_NAME,
        served_model_name=MODEL,
        time_scale=1000,
        kv_role=role,
        kv_pool=pool_url,
    )
    return await launcher.serve_app(create_sim(settings))


async def sim_pair(launcher: Launcher, pool_url: str) -> tuple[str, str]:
    """A producer for prefill and a consumer for decode on the pool at `pool_url`."""
    return await sim(launcher, "producer", pool_url), await sim(launcher, "consumer", pool_url)


async def fake_pair(launcher: Launcher) -> tuple[FakeEngine, FakeEngine]:
    """A prefill and a decode engine that answer and write nothing to any pool."""
    return await launcher.engine("p0"), await launcher.engine("d0")


async def engine_counter(url: str, name: str) -> float:
    async with httpx.AsyncClient(trust_env=False) as client:
        text = (await client.get(f"{url}/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def streamed(prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed completion's body that asks for its usage (a text prompt: its stream is continuable)."""
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def complete(router: RunningRouter, prompt: list[int]) -> httpx.Response:
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    response = await router.http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response
