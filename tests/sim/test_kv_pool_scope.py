"""The simulator's KV pool scoped by `cache_salt` and the LoRA adapter, and sealed with the pool key
(`TANDEM_KV_POOL_KEY`).

Real: redis-server on 127.0.0.1 (the `redis_server` fixture), producer and consumer apps served by
uvicorn and called over HTTP, redis-py to inspect and damage the pool, `tandem.kvpool.keys` to name
and check chunks as Tandem's connector does. The pool key reaches the apps through the environment, as
in a deployment (`monkeypatch.setenv`). Nothing else is faked.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import pytest
from tests.servers import RedisServer, run_uvicorn
from tests.sim.test_kv_roles import MODEL_ID, PROMPT, SERVED, Scrape, engine

from tandem.kvpool.keys import METADATA_BYTES, PoolScope, TandemHash, check_chunk, chunk_key, pool_key
from tandem.sim.app import create_app
from tandem.sim.settings import KVRole, SimSettings

SECRET = "0f" * 32
KEY = pool_key(SECRET)


def chunk_names(*, key: bytes | None = None, scope: str | None = None) -> list[str]:
    """The Redis keys (no suffix) of PROMPT's two full chunks, as a writer with `key` names them."""
    hashes = TandemHash(key=key).chunk_hashes(PROMPT, 256, scope=scope)
    return [chunk_key(model=MODEL_ID, chunk_hash=h) for h in hashes]


def complete(url: str, *, salt: str | None = None, max_tokens: int = 1) -> None:
    body: dict[str, object] = {"model": SERVED, "prompt": PROMPT, "max_tokens": max_tokens}
    if salt is not None:
        body["cache_salt"] = salt
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200


def pool_hits(redis_server: RedisServer, *, salt: str | None) -> float:
    """Prompt tokens a fresh consumer loads from the pool for PROMPT under `salt`."""
    with engine("consumer", redis_server.url) as (url, _):
        complete(url, salt=salt)
        return Scrape(url)("vllm:external_prefix_cache_hits_total")


def test_a_salted_prompt_is_stored_in_its_salts_scope_and_found_only_there(redis_server: RedisServer) -> None:
    with engine("producer", redis_server.url) as (url, _):
        complete(url, salt="tenant-a")
    with redis_server.client() as pool:
        stored = sorted(k.decode() for k in pool.keys("*metadata"))
    assert stored == sorted(f"{name}metadata" for name in chunk_names(scope="tenant-a"))
    assert not set(chunk_names(scope="tenant-a")) & set(chunk_names())
    assert pool_hits(redis_server, salt="tenant-b") == 0
    assert pool_hits(redis_server, salt=None) == 0
    assert pool_hits(redis_server, salt="tenant-a") == 512


def test_with_a_pool_key_chunks_are_keyed_and_tagged_and_a_keyed_consumer_loads_them(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", SECRET)
    with engine("producer", redis_server.url) as (url, _):
        complete(url)
    names = chunk_names(key=KEY)
    assert names != chunk_names()  # without the key nobody can name (or aim a write at) a chunk
    with redis_server.client() as pool:
        assert sorted(k.decode() for k in pool.keys("*metadata")) == sorted(f"{n}metadata" for n in names)
        for name in names:
            metadata, kv_bytes = pool.get(f"{name}metadata") or b"", pool.get(f"{name}kv_bytes") or b""
            assert len(metadata) == METADATA_BYTES + 32
            assert check_chunk(KEY, name=name, metadata=metadata, kv_bytes=kv_bytes) == "ok"
    with engine("consumer", redis_server.url) as (url, _):
        complete(url)
        metric = Scrape(url)
        assert metric("vllm:external_prefix_cache_hits_total") == 512
        assert metric("tandem_sim_kv_pool_chunks_rejected_total", reason="mac") == 0
        assert metric("tandem_sim_kv_pool_chunks_rejected_total", reason="untagged") == 0


@pytest.mark.parametrize(
    ("damage", "reason", "hits"),
    [
        pytest.param("flip-first-tag", "mac", 0, id="a-wrong-tag-is-absent"),
        pytest.param("strip-second-tag", "untagged", 256, id="an-untagged-chunk-ends-the-prefix"),
        pytest.param("second-bytes-under-first", "mac", 0, id="bytes-of-another-chunk"),
        pytest.param("second-sealed-as-first", "mac", 0, id="a-valid-chunk-copied-under-another-name"),
    ],
)
def test_a_keyed_consumer_recomputes_chunks_whose_tag_is_missing_or_wrong(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, damage: str, reason: str, hits: int
) -> None:
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", SECRET)
    with engine("producer", redis_server.url) as (url, _):
        complete(url)
    first, second = chunk_names(key=KEY)
    with redis_server.client() as pool:
        if damage == "flip-first-tag":
            metadata = pool.get(f"{first}metadata") or b""
            pool.set(f"{first}metadata", metadata[:-1] + bytes([metadata[-1] ^ 1]))
        elif damage == "strip-second-tag":
            pool.set(f"{second}metadata", (pool.get(f"{second}metadata") or b"")[:METADATA_BYTES])
        elif damage == "second-bytes-under-first":
            pool.set(f"{first}kv_bytes", pool.get(f"{second}kv_bytes") or b"")
        else:
            pool.set(f"{first}kv_bytes", pool.get(f"{second}kv_bytes") or b"")
            pool.set(f"{first}metadata", pool.get(f"{second}metadata") or b"")
    with engine("consumer", redis_server.url) as (url, _):
        complete(url, max_tokens=2)
        metric = Scrape(url)
        assert metric("vllm:external_prefix_cache_hits_total") == hits
        assert metric("tandem_sim_kv_pool_chunks_rejected_total", reason=reason) == 1
    refused = second if damage == "strip-second-tag" else first
    with redis_server.client() as pool:  # deleted, as the connector does, so a producer can rewrite it
        assert pool.exists(f"{refused}metadata", f"{refused}kv_bytes") == 0
    with engine("producer", redis_server.url) as (url, _):
        complete(url)
    assert pool_hits(redis_server, salt=None) == 512


# -- LoRA adapters: their own scope in the pool ----------------------------------------------------


def lora_engine(role: KVRole, pool_url: str, adapters: Path) -> contextlib.AbstractContextManager[str]:
    """A simulated engine serving adapters `sql` and `chat` from `adapters` (each engine its own
    directory: the pool names an adapter by its name, not its path)."""
    for name in ("sql", "chat"):
        (adapters / name).mkdir(parents=True)
        config = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}
        (adapters / name / "adapter_config.json").write_text(json.dumps(config))
    settings = SimSettings(
        profile="tiny-cpu", model=MODEL_ID, served_model_name=SERVED, time_scale=1000, kv_role=role,
        kv_pool=pool_url, enable_lora=True, max_loras=2,
        lora_modules=[f"sql={adapters / 'sql'}", f"chat={adapters / 'chat'}"],
    )  # fmt: skip
    return run_uvicorn(create_app(settings))


def test_an_adapters_prompt_is_stored_in_the_adapters_scope_and_found_only_under_it(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TANDEM_KV_POOL_KEY", SECRET)
    with lora_engine("producer", redis_server.url, tmp_path / "p") as url:
        assert httpx.post(f"{url}/v1/completions", json={"model": "sql", "prompt": PROMPT}).status_code == 200
    sql = [chunk_key(model=MODEL_ID, chunk_hash=h) for h in TandemHash(key=KEY).chunk_hashes(
        PROMPT, 256, scope=PoolScope(cache_salt=None, lora_name="sql"))]  # fmt: skip
    with redis_server.client() as pool:
        stored = sorted(k.decode() for k in pool.keys("*metadata"))
    assert stored == sorted(f"{name}metadata" for name in sql)
    assert not set(sql) & set(chunk_names(key=KEY))  # not the base model's keys

    with lora_engine("consumer", redis_server.url, tmp_path / "c") as url:
        hits = []
        for model in ("chat", SERVED, "sql"):
            body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
            hits.append(Scrape(url)("vllm:external_prefix_cache_hits_total"))
    assert hits == [0, 0, 512]  # only `sql` loads `sql`'s chunks
