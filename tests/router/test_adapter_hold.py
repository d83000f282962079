"""A request for a declared LoRA adapter that no engine can load yet is held, not failed.

Real: a `tandem sim` engine with `--enable-lora` and the filesystem resolver over a tmp_path folder,
the router (`create_app`), uvicorn on 127.0.0.1, httpx. The adapter `chat` is declared (the router
config's `adapterNames`) but its folder is written only while the request waits, as a fetch into the
adapters' cache would; or never, when the hold runs out. Nothing is faked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from tests.router.servers import serve
from tests.router.test_gateway_lora import complete, lora_config, lora_engine, write_adapter
from tests.router.test_routing_sims import samples

from tandem.router.app import create_app as router_app
from tandem.router.settings import RouterSettings


@pytest.fixture
async def exits() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def gateway(exits: AsyncExitStack, adapters: Path, *, hold_s: float) -> httpx.AsyncClient:
    engine = await exits.enter_async_context(serve(lora_engine(adapters)))
    settings = RouterSettings.model_validate({"proxy": {"adapter_hold_seconds": hold_s}})
    router = await exits.enter_async_context(serve(router_app(lora_config([engine.url]), settings=settings)))
    return await exits.enter_async_context(
        httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
    )


def held(metrics: str) -> dict[str, float]:
    found = samples(metrics).get("tandem_router_adapter_held_total", {})
    return {dict(labels)["outcome"]: value for labels, value in found.items()}


async def test_a_request_waits_for_its_adapter_to_arrive_and_is_then_served(
    exits: AsyncExitStack, tmp_path: Path
) -> None:
    write_adapter(tmp_path, "sql")
    client = await gateway(exits, tmp_path, hold_s=20)
    request = asyncio.create_task(client.post("/v1/completions", json=complete("chat")))
    await asyncio.sleep(0.8)
    assert not request.done(), "answered before the adapter existed"
    write_adapter(tmp_path, "chat")  # the fetch into the cache completes
    answer = await request
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "chat"
    metrics = (await client.get("/metrics")).text
    assert held(metrics) == {"loaded": 1.0}
    errors = samples(metrics)["tandem_router_upstream_errors_total"]
    assert {dict(labels)["kind"] for labels in errors} == {"adapter_missing"}
    # the engine was never taken out of rotation: the base model and the other adapter answer at once
    assert (await client.post("/v1/completions", json=complete("qwen"))).status_code == 200
    assert (await client.post("/v1/completions", json=complete("sql"))).status_code == 200


async def test_a_hold_that_runs_out_is_a_503_with_retry_after_naming_no_engine(
    exits: AsyncExitStack, tmp_path: Path
) -> None:
    write_adapter(tmp_path, "sql")
    client = await gateway(exits, tmp_path, hold_s=0.6)
    answer = await client.post("/v1/completions", json=complete("chat"))
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "4"
    error = answer.json()["error"]
    assert error["code"] == "adapter_not_ready"
    assert error["message"] == "adapter `chat` is not loaded on any engine yet; retry later"
    assert "127.0.0.1" not in answer.text
    metrics = (await client.get("/metrics")).text
    assert held(metrics) == {"expired": 1.0}
    assert (await client.post("/v1/completions", json=complete("qwen"))).status_code == 200


async def test_a_404_for_the_base_model_is_not_held(exits: AsyncExitStack, tmp_path: Path) -> None:
    """Undeclared names are refused by the gateway itself (404 at once), never held."""
    write_adapter(tmp_path, "sql")
    client = await gateway(exits, tmp_path, hold_s=20)
    answer = await asyncio.wait_for(client.post("/v1/completions", json=complete("nope")), timeout=5)
    assert answer.status_code == 404
    assert held((await client.get("/metrics")).text) == {}
