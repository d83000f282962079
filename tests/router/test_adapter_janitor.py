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
from tandem.router.upstream.adaptercopy import COPY_PAUSE_S, AdapterCopier
from tandem.router.upstream.adapters import undeclared
from tandem.router.upstream.client import HTTPUpstream, new_wire
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings


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


async def test_the_copier_loads_an_adapter_through_the_runtime_api_and_pauses_after_a_refusal(
    tmp_path: Path,
) -> None:
    """`AdapterCopier` against real simulated engines: one with vLLM's runtime API loads `chat` from
    `<directory>/chat` (then listed, its root that path; a second copy of it in place succeeds too);
    one without it answers 404, which counts as failed, is told to `done`, and stops copies for
    COPY_PAUSE_S (the clock moved past it, copies start again)."""
    write_adapter(tmp_path, "sql")
    write_adapter(tmp_path, "chat")
    now = [0.0]
    heard: list[tuple[str, str, bool]] = []
    async with AsyncExitStack() as stack:
        engine = await stack.enter_async_context(serve(lora_engine(tmp_path)))
        closed = SimSettings.model_validate(
            {"profile": "tiny-cpu", "served_model_name": "qwen", "enable_lora": True, "max_loras": 2}
        )
        without = await stack.enter_async_context(serve(sim_app(closed, environ={})))
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        wire = new_wire(RouterSettings().proxy)
        stack.callback(wire.close)
        upstream = HTTPUpstream(wire, RouterSettings().proxy)
        copier = AdapterCopier(
            upstream, directory=str(tmp_path), timeout_s=5.0, done=lambda *a: heard.append(a),
            clock=lambda: now[0],
        )  # fmt: skip
        assert await copier.copy(engine.url, "chat")
        models = (await direct.get(f"{engine.url}/v1/models")).json()["data"]
        assert [m["root"] for m in models if m["id"] == "chat"] == [str(tmp_path / "chat")]
        assert await copier.copy(engine.url, "chat"), "in place: an adapter loaded before is read again"
        assert not await copier.copy(without.url, "chat")
        assert copier.copies == {"loaded": 2, "failed": 1}
        assert heard == [(engine.url, "chat", True), (engine.url, "chat", True), (without.url, "chat", False)]
        assert not copier.start(engine.url, "chat"), "paused after the failure"
        now[0] += COPY_PAUSE_S
        assert copier.start(engine.url, "chat")
        await copier.stop()
