"""Which chunk keys the gateway looks the KV pool up with, by connector (`tandem.router.config.resolve`
and `pool_keys`). Pure apart from a model's config.json in a temporary directory: a router config and
settings in, the effective `KVPoolAccess` (or the reason it is off) out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.router.harness import router_config

from tandem.core.kvkeys import LMCacheCborHash, lmcache_cbor_none_hash
from tandem.core.routerconfig import EngineKVKeys, RouterConfig
from tandem.kvpool.keys import TandemHash
from tandem.router.config import resolve
from tandem.router.settings import RouterSettings

ENGINE = "http://10.0.0.7:8000"
POOL = "redis://127.0.0.1:6379"
LMCACHE_KEYS = EngineKVKeys(connector="lmcache", model="/models/qwen", python_hash_seed="0")


def vllm_config(tmp_path: Path, *, spec: dict[str, Any] | None = None, **update: object) -> RouterConfig:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "float16"}))
    sections = {"engine": {"kind": "vllm"}, "kvPool": {"connector": "lmcache"}, **(spec or {})}
    config = router_config(decode=[ENGINE], spec=sections)
    return config.model_copy(update={"kv_pool_url": POOL, "tokenizer_path": str(tmp_path), **update})


def test_lmcache_engines_are_looked_up_with_lmcaches_keys(tmp_path: Path) -> None:
    effective = resolve(vllm_config(tmp_path, engine_kv_keys=LMCACHE_KEYS), RouterSettings())
    assert effective.kv_pool is not None and effective.kv_pool_off is None
    keys = effective.kv_pool.keys
    # The engines hash with sha256_cbor (Tandem sets it); the builtin chain's seed stays known for
    # engines told otherwise. hash("0") under PYTHONHASHSEED=0 is 5313149338359954478.
    assert keys.scheme == LMCacheCborHash(lmcache_cbor_none_hash("0"), builtin_none_hash=5313149338359954478)
    assert (keys.model, keys.world_size, keys.worker_id, keys.dtype) == ("/models/qwen", 1, 0, "half")
    assert effective.describe()["kv_pool_keys"] == "lmcache-sha256_cbor"


def test_lmcache_engines_without_a_hash_seed_are_looked_up_with_sha256_cbors_fixed_seed(
    tmp_path: Path,
) -> None:
    """sha256_cbor starts from a fixed seed when PYTHONHASHSEED is unset, so the keys are computable;
    the builtin chain's are not (random per process)."""
    unseeded = LMCACHE_KEYS.model_copy(update={"python_hash_seed": None})
    effective = resolve(vllm_config(tmp_path, engine_kv_keys=unseeded), RouterSettings())
    assert effective.kv_pool is not None
    assert effective.kv_pool.keys.scheme == LMCacheCborHash(
        lmcache_cbor_none_hash(None), builtin_none_hash=None
    )


def test_a_config_that_does_not_say_how_lmcache_keys_is_not_looked_up(tmp_path: Path) -> None:
    effective = resolve(vllm_config(tmp_path), RouterSettings())
    assert effective.kv_pool is None
    assert effective.kv_pool_off is not None and "engineKvKeys" in effective.kv_pool_off


def test_the_connector_the_engines_run_wins_over_the_spec(tmp_path: Path) -> None:
    """The local runtime runs Tandem's connector where the spec says lmcache, and says so."""
    local = EngineKVKeys(connector="tandem", model="Qwen/Qwen2.5-7B-Instruct", python_hash_seed="0")
    access = resolve(vllm_config(tmp_path, engine_kv_keys=local), RouterSettings()).kv_pool
    assert access is not None and access.keys.scheme == TandemHash()
    assert access.keys.model == "Qwen/Qwen2.5-7B-Instruct"


def test_pools_of_different_tensor_parallel_sizes_are_not_looked_up(tmp_path: Path) -> None:
    spec = {"prefill": {"replicas": 1, "tensorParallel": 2}, "decode": {"replicas": 1, "tensorParallel": 1}}
    effective = resolve(vllm_config(tmp_path, spec=spec, engine_kv_keys=LMCACHE_KEYS), RouterSettings())
    assert effective.kv_pool is None
    assert effective.kv_pool_off is not None and "world sizes 2 and 1" in effective.kv_pool_off


def test_without_a_pool_url_nothing_is_off(tmp_path: Path) -> None:
    effective = resolve(vllm_config(tmp_path, kv_pool_url=None), RouterSettings())
    assert (effective.kv_pool, effective.kv_pool_off) == (None, None)
