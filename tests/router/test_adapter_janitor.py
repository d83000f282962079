"""An adapter the service no longer declares leaves its engines: the gateway, on seeing each engine,
unloads what the engine serves beyond the declared adapters (`tandem.router.upstream.adapters`).

Real: a `tandem sim` engine with `--enable-lora` and vLLM's runtime API and filesystem resolver over
adapter directories in tmp_path, the router (`create_app`), uvicorn servers on 127.0.0.1, httpx.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
from tests.router.servers import serve
from tests.router.test_gateway_lora import lora_config, lora_engine, write_adapter

from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app as router_app
from tandem.router.compose.service import adapter_janitor
from tandem.router.config import resolve
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.settings import RouterSettings
from tandem.router.upstream.adapters import undeclared
from tandem.router.upstream.client import HTTPUpstream, new_wire


async def served(client: httpx.AsyncClient) -> list[str]:
    return [m["id"] for m in (await client.get("/v1/models")).json()["data"]]


async def test_an_undeclared_adapter_is_unloaded_from_the_engines_and_the_declared_stay(
    tmp_path: Path,
) -> None:
    for name in ("sql", "chat", "old"):
        write_adapter(tmp_path, name)
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(serve(lora_engine(tmp_path)))
        direct = await stack.enter_async_context(httpx.AsyncClient(base_url=engine.url, trust_env=False))
        for name in ("chat", "old"):  # loaded by use, through the engine's resolver
            reply = await direct.post("/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1})
            assert reply.status_code == 200
        assert await served(direct) == ["qwen", "sql", "chat", "old"]
        # The service declares sql and chat (lora_config), not old.
        await stack.enter_async_context(serve(router_app(lora_config([engine.url]))))
        for _ in range(100):
            if "old" not in await served(direct):
                break
            await asyncio.sleep(0.05)
        assert await served(direct) == ["qwen", "sql", "chat"]
        again = await direct.post("/v1/unload_lora_adapter", json={"lora_name": "old"})
        assert again.status_code == 404, "already unloaded"


def test_the_sweep_picks_adapters_only_and_a_volume_catalog_turns_it_off() -> None:
    entries: list[dict[str, object]] = [
        {"id": "qwen", "parent": None},
        {"id": "sql", "parent": "qwen"},
        {"id": "old", "parent": "qwen"},
    ]
    assert undeclared(entries, {"sql"}) == ["old"]
    assert undeclared(entries, {"sql", "old"}) == []
    upstream = HTTPUpstream(new_wire(RouterSettings().proxy), RouterSettings().proxy)
    config = lora_config(["http://127.0.0.1:1"])
    adapters = ServiceAdapters({"qwen"}, ("sql", "chat"))
    assert adapter_janitor(resolve(config, RouterSettings()), upstream, adapters) is not None
    document = config.model_dump(by_alias=True, mode="json")
    document["spec"]["adapterCatalog"] = {"source": "pvc://loras/catalog"}
    on_volume = resolve(RouterConfig.model_validate(document), RouterSettings())
    assert adapter_janitor(on_volume, upstream, adapters) is None, (
        "names only the engines know: nothing unloaded"
    )
    document["spec"]["engine"].pop("lora")
    document["spec"].pop("adapters")
    document["spec"].pop("adapterCatalog")
    document.pop("adapterNames")
    off = resolve(RouterConfig.model_validate(document), RouterSettings())
    assert adapter_janitor(off, upstream, adapters) is None
