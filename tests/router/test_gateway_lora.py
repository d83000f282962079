"""LoRA adapters through the gateway: adapter names accepted as `model`, listed under their model,
sent to the service's pools unchanged, not disaggregated without a KV pool whose keys carry them
(with one: tests/router/test_lora_pool.py), and their prompts keyed apart.

Real: `tandem sim` engines with `--enable-lora` (a `--lora-modules` adapter and the filesystem
resolver over adapter directories written to tmp_path), the router (`create_app`, and
`create_many_app` over a `GatewayFile`), uvicorn servers on 127.0.0.1, httpx; /metrics as
Prometheus text. The many-service tests use `fake_engine.FakeEngine` as engines (they record the
bodies they get). Nothing else is faked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.router.harness import Launcher
from tests.router.servers import serve
from tests.router.test_gateway_many_models import gateway_document
from tests.router.test_routing_sims import samples
from tests.servers import free_port

from tandem.core.gateway import GatewayFile
from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app as router_app
from tandem.router.compose.many import create_many_app
from tandem.router.config import adapter_names
from tandem.router.errors import ConfigurationError
from tandem.router.settings import RouterSettings
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

RESOLVER = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    "VLLM_PLUGINS": "lora_filesystem_resolver",
}


def write_adapter(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
    (path / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": "tiny"}))
    return path


def lora_config(
    urls: list[str], *, mode: str = "off", prefill: int = 0, isolation: str = "tenant"
) -> RouterConfig:
    """A service of model `tiny` served as `qwen`, with the declared adapter `sql` and the catalog
    adapter `chat` (`adapterNames`)."""
    return RouterConfig.model_validate(
        {
            "service": "lora",
            "spec": {
                "model": {"name": "tiny", "servedName": "qwen"},
                "engine": {"kind": "sim", "lora": {"maxLoras": 2}},
                "adapters": [{"name": "sql", "source": "pvc://loras/sql"}],
                "prefill": {"replicas": prefill},
                "decode": {"replicas": len(urls) - prefill},
                "disaggregation": {"mode": mode},
                "router": {"policy": "tandem", "cacheIsolation": isolation},
            },
            "discovery": {"kind": "static", "prefill": urls[:prefill], "decode": urls[prefill:]},
            "adapterNames": ["chat", "sql"],
        }
    )


def lora_engine(adapters: Path, *, seed: int = 0, events: str | None = None) -> Any:
    """A simulated engine serving `sql` from the start and resolving the others from `adapters`;
    `events`: where it publishes its KV events."""
    settings = SimSettings.model_validate(
        {
            "kv_events_endpoint": events,
            "profile": "tiny-cpu",
            "served_model_name": "qwen",
            "time_scale": 1000,
            "num_gpu_blocks": 400,
            "seed": seed,
            "enable_lora": True,
            "max_loras": 2,
            "lora_modules": [f"sql={adapters / 'sql'}"],
        }
    )
    return sim_app(settings, environ=RESOLVER | {"VLLM_LORA_RESOLVER_CACHE_DIR": str(adapters)})


@pytest.fixture
def adapters(tmp_path: Path) -> Path:
    write_adapter(tmp_path, "sql")
    write_adapter(tmp_path, "chat")
    return tmp_path


@pytest.fixture
async def exits() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def gateway(
    exits: AsyncExitStack, adapters: Path, *, engines: int = 1, precise: bool = False, **options: Any
) -> tuple[httpx.AsyncClient, list[str]]:
    """A gateway in front of `engines` LoRA engines; `precise`: its prefix index is fed by their KV
    events."""
    events = [f"tcp://127.0.0.1:{free_port()}" if precise else None for _ in range(engines)]
    urls = [
        (await exits.enter_async_context(serve(lora_engine(adapters, seed=i, events=e)))).url
        for i, e in enumerate(events)
    ]
    settings = RouterSettings()
    if precise:
        endpoints = {url: {"events": e} for url, e in zip(urls, events, strict=True)}
        settings = RouterSettings.model_validate(
            {"scheduling": {"prefix_source": "precise", "kv_events": {"endpoints": endpoints}}}
        )
    router = await exits.enter_async_context(
        serve(router_app(lora_config(urls, **options), settings=settings))
    )
    client = await exits.enter_async_context(
        httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
    )
    return client, urls


def complete(model: str, prompt: str = "Tell me about adapters") -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}


# -- the names ----------------------------------------------------------------------------------


def test_a_services_adapters_are_its_declared_ones_then_its_catalogs_once_each() -> None:
    config = lora_config(["http://127.0.0.1:1"])
    assert adapter_names(config) == ("sql", "chat")


def test_adapter_names_in_the_router_config_must_be_adapter_names() -> None:
    document = lora_config(["http://127.0.0.1:1"]).model_dump(by_alias=True, mode="json")
    with pytest.raises(ValueError, match="adapterNames"):
        RouterConfig.model_validate(document | {"adapterNames": ["../etc"]})


# -- one service --------------------------------------------------------------------------------


async def test_an_adapter_name_is_served_under_the_adapter(exits: AsyncExitStack, adapters: Path) -> None:
    client, _ = await gateway(exits, adapters)
    base = await client.post("/v1/completions", json=complete("qwen"))
    sql = await client.post("/v1/completions", json=complete("sql"))
    chat = await client.post("/v1/completions", json=complete("chat"))  # the engine's resolver finds it
    nope = await client.post("/v1/completions", json=complete("nope"))
    assert [r.status_code for r in (base, sql, chat, nope)] == [200, 200, 200, 404]
    assert [r.json()["model"] for r in (base, sql, chat)] == ["qwen", "sql", "chat"]
    texts = {r.json()["choices"][0]["text"] for r in (base, sql, chat)}
    assert len(texts) == 3  # each ran under its own adapter (the simulator's text depends on it)
    assert nope.json()["error"]["message"] == "The model `nope` does not exist."


async def test_models_lists_the_adapters_under_the_model_before_and_after_use(
    exits: AsyncExitStack, adapters: Path
) -> None:
    client, _ = await gateway(exits, adapters)
    before = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert list(before) == ["qwen", "sql", "chat"]
    assert [before[n]["parent"] for n in before] == [None, "qwen", "qwen"]
    assert before["sql"]["root"] == str(adapters / "sql")  # the engine's own entry
    assert before["chat"]["root"] == "chat"  # not loaded yet: the gateway's entry
    assert (await client.post("/v1/completions", json=complete("chat"))).status_code == 200
    after = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert after["chat"]["root"] == str(adapters / "chat") and after["chat"]["parent"] == "qwen"


async def test_without_a_pool_whose_keys_carry_adapters_an_adapters_request_is_not_disaggregated(
    exits: AsyncExitStack, adapters: Path
) -> None:
    client, urls = await gateway(exits, adapters, engines=2, mode="always", prefill=1)
    assert (await client.post("/v1/completions", json=complete("qwen"))).status_code == 200
    assert (await client.post("/v1/completions", json=complete("sql"))).status_code == 200
    decisions = samples((await client.get("/metrics")).text)["tandem_router_pd_decisions_total"]
    assert decisions == {
        (("decision", "disaggregate"), ("reason", "always")): 1.0,
        (("decision", "decode_only"), ("reason", "adapter")): 1.0,
    }
    prefill = samples((await client.get(f"{urls[0]}/metrics")).text)
    # the prefill engine saw the base model's request only
    assert sum(prefill["vllm:request_success_total"].values()) == 1


# -- the prefix keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precise", "isolation"),
    [(False, "tenant"), (True, "tenant"), (True, "off")],
    ids=["approximate", "precise", "precise-without-salts"],
)
async def test_the_same_prompt_under_the_base_model_and_two_adapters_never_matches_another(
    exits: AsyncExitStack, adapters: Path, precise: bool, isolation: str
) -> None:
    """A prompt matches its own earlier copy under the same name only, in the router's own index
    (approximate: keys of routed prompts) and in the one the engines' KV events feed (precise: the
    simulator roots an adapter's blocks and names it in every block's `extra_keys`, as vLLM 0.32).
    With tenant isolation (the default) every key is rooted in (salt, adapter), without it in the
    adapter alone. `tandem_router_prefix_match_ratio` observes each request's best match over its
    prompt."""
    client, _ = await gateway(exits, adapters, engines=2, precise=precise, isolation=isolation)
    prompt = "Shared system prompt. " + " ".join(f"w{i}" for i in range(200))
    if precise:  # the subscribers connect (else the first events go unseen)
        await _until(client, lambda m: _total(m, "tandem_router_kv_event_connected") == 2)
    ratios = []
    for model in ("qwen", "sql", "chat", "qwen", "sql", "chat"):
        before = samples((await client.get("/metrics")).text)
        assert (await client.post("/v1/completions", json=complete(model, prompt))).status_code == 200
        after = samples((await client.get("/metrics")).text)
        ratios.append(_total(after, RATIO) - _total(before, RATIO))
        if precise and len(ratios) <= 3:  # its blocks reach the index before the next request
            await _until(client, _more_blocks_than(_total(before, BLOCKS)))
    assert ratios[:3] == [0.0, 0.0, 0.0]
    assert all(r > 0.9 for r in ratios[3:]), ratios


RATIO = "tandem_router_prefix_match_ratio_sum"
BLOCKS = "tandem_router_kv_index_blocks"


def _more_blocks_than(held: float) -> Callable[[dict[str, dict[Any, float]]], bool]:
    return lambda metrics: _total(metrics, BLOCKS) > held


def _total(metrics: dict[str, dict[Any, float]], name: str) -> float:
    return sum(metrics.get(name, {}).values())


async def _until(client: httpx.AsyncClient, condition: Callable[[dict[str, dict[Any, float]]], bool]) -> None:
    """Poll the gateway's /metrics until `condition` holds (a liveness guard of about 20 s, not a
    speed check)."""
    for _ in range(2000):
        if condition(samples((await client.get("/metrics")).text)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway's metrics never got there")


# -- many services ------------------------------------------------------------------------------


def many_file(a: str, b: str, *, catalog: list[str] | None = None) -> dict[str, Any]:
    document = gateway_document({"alpha": ("qwen", [a]), "beta": ("llama", [b])})
    alpha = document["services"][0]["config"]
    alpha["spec"]["engine"]["lora"] = {"maxLoras": 2}
    alpha["spec"]["adapters"] = [{"name": "sql", "source": "pvc://loras/sql"}]
    if catalog is not None:
        alpha["adapterNames"] = catalog
    return document


async def test_many_services_route_an_adapter_to_its_service_unchanged(launcher: Launcher) -> None:
    a, b = await launcher.engine("a0"), await launcher.engine("b0")
    file = GatewayFile.model_validate(many_file(a.url, b.url, catalog=["chat"]))
    url = await launcher.serve_app(create_many_app(file, settings=RouterSettings()))
    async with httpx.AsyncClient(base_url=url, timeout=20, trust_env=False) as client:
        answers = [await client.post("/v1/completions", json=complete(m)) for m in ("sql", "chat", "llama")]
        listed = (await client.get("/v1/models")).json()["data"]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert [r.body["model"] for r in a.received] == ["sql", "chat"]
    assert [r.body["model"] for r in b.received] == ["llama"]
    assert [(m["id"], m.get("parent")) for m in listed] == [
        ("qwen", None),
        ("sql", "qwen"),
        ("chat", "qwen"),
        ("llama", None),
    ]


async def test_a_catalog_name_another_service_serves_stops_start_up() -> None:
    file = GatewayFile.model_validate(
        many_file("http://127.0.0.1:1", "http://127.0.0.1:2", catalog=["llama"])
    )
    with pytest.raises(ConfigurationError, match="model name 'llama' is claimed by services alpha and beta"):
        create_many_app(file, settings=RouterSettings())
