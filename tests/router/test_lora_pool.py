"""LoRA adapters through P/D and the KV pool: an adapter's prompt has its own chunks, which only its own
requests load; with LMCache's keys (no adapter in them) adapters stay decode-only.

Real: redis-server on 127.0.0.1 (the `redis_server` fixture), simulated engines (`tandem.sim`, the tiny
profile at time scale 1000, serving adapters `sql` and `chat` from directories written to tmp_path: a
producer for prefill, consumers for decode) writing and reading the pool, keyed with the pool key
(`TANDEM_KV_POOL_KEY`, set in the environment as in a deployment), the router with tenant isolation
(so every key is salted too), httpx; /metrics as Prometheus text. Faked: in the connector stories the
engines are `FakeEngine`s (they record the bodies they get and write nothing).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.core.tokenizer_files import write_qwen2
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter, metric, router_config
from tests.router.pd_pool import AUTO_512, PROMPT, engine_counter, fake_pair
from tests.servers import RedisServer

from tandem.core.routerconfig import EngineKVKeys, RouterConfig
from tandem.kvpool.engine_keys import KeysUnavailable
from tandem.kvpool.keys import PoolKeys, PoolScope, TandemHash, lmcache_salt_tag, pool_key
from tandem.router.config import pool_keys
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.settings import RouterSettings
from tandem.sim.app import create_app as create_sim
from tandem.sim.settings import KVRole, SimSettings

SECRET = "0f" * 32
CACHE_KEY = "k" * 32
ADAPTERS = ("sql", "chat")
HITS = "vllm:external_prefix_cache_hits_total"
DECISIONS = "tandem_router_pd_decisions_total"
#: Tenant isolation on: the default tenant's requests carry a salt derived from CACHE_KEY.
ISOLATED = RouterSettings.model_validate({"access": {"cache_key": CACHE_KEY}})


@pytest.fixture(autouse=True)
def keyed_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines and the gateway key the pool's chunks with the pool secret, as in a cluster."""
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", SECRET)


def write_adapters(root: Path) -> list[str]:
    """Adapter directories for `--lora-modules` (each engine its own: the pool names adapters by
    name, whatever path an engine loads them from)."""
    modules = []
    for name in ADAPTERS:
        (root / name).mkdir(parents=True)
        config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
        (root / name / "adapter_config.json").write_text(json.dumps(config))
        modules.append(f"{name}={root / name}")
    return modules


async def lora_sim(launcher: Launcher, role: KVRole, pool_url: str, adapters: Path) -> str:
    settings = SimSettings(
        profile="tiny-cpu", model=MODEL_NAME, served_model_name=MODEL, time_scale=1000, kv_role=role,
        kv_pool=pool_url, enable_lora=True, max_loras=2, lora_modules=write_adapters(adapters),
    )  # fmt: skip
    return await launcher.serve_app(create_sim(settings, environ={}))


def lora_router_config(*, spec: dict[str, Any] | None = None, **options: Any) -> RouterConfig:
    """`router_config` (harness) for a service whose engines serve `sql` and `chat`."""
    sections = {"engine": {"kind": "sim", "lora": {"maxLoras": 2}}} | (spec or {})
    document = router_config(spec=sections, **options).model_dump(by_alias=True, mode="json")
    document["spec"]["adapters"] = [{"name": n, "source": f"pvc://loras/{n}"} for n in ADAPTERS]
    return RouterConfig.model_validate(document)


async def complete(router: RunningRouter, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}
    response = await router.http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def scope_keys(model: str) -> list[str]:
    """The metadata keys of PROMPT's two full chunks as the engines and the gateway name them under
    `model` (the base model's served name or an adapter's) for the default tenant."""
    salt = CacheScopes(key=CACHE_KEY.encode()).salt("default")
    scope = PoolScope(cache_salt=salt, lora_name=None if model == MODEL else model)
    keys = PoolKeys(model=MODEL_NAME, chunk_size=256, scheme=TandemHash(key=pool_key(SECRET)))
    return keys.chunk_keys(PROMPT, scope=scope)


def stored_keys(redis_server: RedisServer) -> set[str]:
    with redis_server.client() as client:
        return {k.decode() for k in client.keys("*metadata")}


def fake_vllm_pd(
    tmp_path: Path, prefill: str, decode: str, pool_url: str, *, lora: dict[str, int], connector: str
) -> RouterConfig:
    """The router config of a P/D service of vLLM engines (fakes, always disaggregated) under `lora`,
    with the KV pool at `pool_url` keyed as `connector`'s, and a Qwen2 tokenizer written to tmp_path."""
    write_qwen2(tmp_path, vocab=2000)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"}))
    return lora_router_config(
        decode=[decode],
        prefill=[prefill],
        mode="always",
        spec={"engine": {"kind": "vllm", "lora": lora}, "kvPool": {"connector": connector}},
        kv_pool_url=pool_url,
    ).model_copy(update={"tokenizer_path": str(tmp_path)})


def store_chunks(redis_server: RedisServer, keys: PoolKeys, adapters: Sequence[str | None]) -> None:
    """PROMPT's chunks in the pool under each of `adapters`' scopes (None: the base model) for the
    default tenant, as a prefill engine would store them, so every barrier passes at once."""
    salt = CacheScopes(key=CACHE_KEY.encode()).salt("default")
    with redis_server.client() as client:
        for adapter in adapters:
            for name in keys.chunk_keys(PROMPT, scope=PoolScope(salt, adapter)):
                client.set(name.removesuffix("metadata") + "kv_bytes", b"kv")
                client.set(name, b"meta")


# -- the simulator (Tandem's keys) --------------------------------------------------------------


async def test_the_same_prompt_as_base_and_under_two_adapters_never_loads_anothers_chunks(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Through P/D the base model's, `sql`'s and `chat`'s requests each write and load their own two
    chunks; a decode engine asked for `sql` while only the base model's chunks of that very prompt are
    in the pool loads nothing, and asked again later under `chat` and the base model it loads theirs."""
    prefill = await lora_sim(launcher, "producer", redis_server.url, tmp_path / "prefill")
    decode = await lora_sim(launcher, "consumer", redis_server.url, tmp_path / "decode")
    fresh = await lora_sim(launcher, "consumer", redis_server.url, tmp_path / "fresh")
    pd = await launcher.router_for(
        lora_router_config(decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url),
        settings=ISOLATED,
    )
    alone = await launcher.router_for(
        lora_router_config(decode=[fresh], mode="off", kv_pool_url=redis_server.url), settings=ISOLATED
    )

    await complete(pd, MODEL)
    assert stored_keys(redis_server) == set(scope_keys(MODEL))
    await complete(alone, "sql")  # the base model's chunks of this prompt are there: not sql's
    assert await engine_counter(fresh, HITS) == 0

    for model in ADAPTERS:
        response = await complete(pd, model)
        assert response.headers["x-tandem-prefill-endpoint"] == prefill.removeprefix("http://")
        assert "x-tandem-pd-fallback" not in response.headers
    assert await engine_counter(decode, HITS) == 3 * 512  # each decode loaded its own prefill's chunks
    assert stored_keys(redis_server) == {k for m in (MODEL, *ADAPTERS) for k in scope_keys(m)}
    assert len(stored_keys(redis_server)) == 6  # three scopes, two chunks each, no key shared
    assert await metric(pd, DECISIONS, decision="disaggregate", reason="always") == 3
    assert await metric(pd, DECISIONS, reason="adapter") == 0
    assert await metric(pd, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") == 3

    await complete(alone, "chat")  # a second `chat` request: it hits `chat`'s own chunks
    assert await engine_counter(fresh, HITS) == 512
    await complete(alone, MODEL)
    assert await engine_counter(fresh, HITS) == 2 * 512


async def test_the_gateways_look_up_counts_only_the_adapters_own_chunks(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    """`auto` with `minUncachedTokens` 512: the base model's chunks of the prompt do not make `sql`'s
    request look cached (it is prefilled), `sql`'s own chunks do (its second request decodes alone)."""
    prefill = await lora_sim(launcher, "producer", redis_server.url, tmp_path / "prefill")
    decode = await lora_sim(launcher, "consumer", redis_server.url, tmp_path / "decode")
    config = lora_router_config(
        decode=[decode], prefill=[prefill], mode="auto", spec=AUTO_512, kv_pool_url=redis_server.url
    )
    router = await launcher.router_for(config, settings=ISOLATED)
    first = [await complete(router, model) for model in (MODEL, "sql")]
    assert all("x-tandem-prefill-endpoint" in r.headers for r in first)
    again = await complete(router, "sql")
    assert "x-tandem-prefill-endpoint" not in again.headers
    assert await metric(router, DECISIONS, decision="disaggregate", reason="many_uncached") == 2
    assert await metric(router, DECISIONS, decision="decode_only", reason="few_uncached") == 1


# -- the engines' connector ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("connector", "told", "decision"),
    [
        ("tandem", None, ("disaggregate", "always")),
        ("lmcache", EngineKVKeys(connector="lmcache", model="/models/qwen", python_hash_seed="0"),
         ("disaggregate", "always")),
        ("lmcache", None, ("decode_only", "adapter")),  # the gateway cannot compute LMCache's keys
    ],
    ids=["tandem", "lmcache", "lmcache-keys-unknown"],
)  # fmt: skip
async def test_adapters_are_disaggregated_only_where_the_pools_keys_carry_them(
    launcher: Launcher,
    redis_server: RedisServer,
    tmp_path: Path,
    connector: str,
    told: EngineKVKeys | None,
    decision: tuple[str, str],
) -> None:
    """vLLM engines with Tandem's connector key an adapter's chunks in its scope: its request is
    disaggregated like the base model's, and the barrier waits for the adapter's chunks. LMCache
    0.5.6's chain carries no adapter (vLLM #44250), but its keys carry the request's `lmcache.tag.*`
    configs: the gateway tags the adapter's prefill and decode bodies (and only an adapter's), so its
    request is disaggregated too and the barrier waits for the tagged keys. Where the gateway cannot
    compute LMCache's keys the request stays decode-only (reason `adapter`), still tagged, and the
    prefill engine never sees it. The fake engines write nothing: the test stores the chunks the
    engines would (under the keys the gateway computes for each scope), so every barrier passes at its
    first check."""
    prefill, decode = await fake_pair(launcher)
    config = fake_vllm_pd(
        tmp_path, prefill.url, decode.url, redis_server.url, lora={"maxLoras": 2}, connector=connector
    ).model_copy(update={"engine_kv_keys": told})
    keys = pool_keys(config, environ={"TANDEM_KV_POOL_KEY": SECRET})
    salt = CacheScopes(key=CACHE_KEY.encode()).salt("default")
    if not isinstance(keys, KeysUnavailable):
        store_chunks(redis_server, keys, (None, "sql"))
    router = await launcher.router_for(config, settings=ISOLATED)
    await complete(router, MODEL)
    await complete(router, "sql")
    assert await metric(router, DECISIONS, decision="disaggregate", reason="always") >= 1  # the base model
    assert await metric(router, DECISIONS, decision=decision[0], reason=decision[1]) >= 1  # the adapter
    prefilled = [r.body["model"] for r in prefill.received]
    assert prefilled == ([MODEL, "sql"] if decision[0] == "disaggregate" else [MODEL])
    barriers = 2 if decision[0] == "disaggregate" else 1 if told is not None else 0
    assert await metric(router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") == barriers
    tags = {
        (r.body["model"], (r.body.get("kv_transfer_params") or {}).get("lmcache.tag.lora"))
        for r in (*prefill.received, *decode.received)
    }
    tagged = "sql" if connector == "lmcache" else None
    assert tags == {(MODEL, None), ("sql", tagged)}, "each engine gets the adapter's tag, only for LMCache"
    salts = {
        (r.body.get("kv_transfer_params") or {}).get("lmcache.tag.salt")
        for r in (*prefill.received, *decode.received)
    }
    assert salt is not None
    assert salts == {lmcache_salt_tag(salt) if connector == "lmcache" else None}, "and the tenant's, hashed"
