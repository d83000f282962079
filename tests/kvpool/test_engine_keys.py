"""The keys vLLM engines write to the KV pool, worked out from how they were started
(`tandem.kvpool.engine_keys`). Pure: engine arguments, environment and a model's config.json in,
`PoolKeys` or the reason out; nothing is faked because nothing does I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import pytest

from tandem.kvpool.engine_keys import (
    KeysUnavailable,
    engine_pool_keys,
    key_alternatives,
    lmcache_kv_dtype,
    parallel_sizes,
    uses_mla,
)
from tandem.kvpool.keys import LMCache03Hash, LMCacheCborHash, LMCacheHash, PoolKeys, TandemHash

QWEN = {"model_type": "qwen2", "torch_dtype": "bfloat16"}
DEEPSEEK = {"model_type": "deepseek_v3", "kv_lora_rank": 512, "torch_dtype": "bfloat16"}


def keys(
    connector: Literal["tandem", "lmcache"] = "lmcache",
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    tp: tuple[int, int] = (1, 1),
    config: Mapping[str, object] | None = None,
    seed: str | None = "0",
) -> PoolKeys | KeysUnavailable:
    return engine_pool_keys(
        connector=connector,
        model="/models/qwen",
        chunk_size=256,
        engine_args=args,
        engine_env=env or {},
        tensor_parallel=tp,
        model_config=QWEN if config is None else config,
        python_hash_seed=seed,
    )


BUILTIN = {"LMCACHE_PRE_CACHING_HASH_ALGORITHM": "builtin"}


def test_lmcache_engines_key_by_their_model_argument_world_size_dtype_and_sha256_cbor_none_hash() -> None:
    assert keys(tp=(2, 2), args=["--dtype", "half"]) == PoolKeys(
        model="/models/qwen",
        chunk_size=256,
        dtype="half",
        world_size=2,
        scheme=LMCacheCborHash(5625442194607170974, builtin_none_hash=5313149338359954478),
    )


def test_lmcache_engines_told_to_hash_with_builtin_key_by_pythons_hash() -> None:
    found = keys(args=["--dtype", "half"], env=BUILTIN)
    assert isinstance(found, PoolKeys) and found.scheme == LMCacheHash(5313149338359954478)
    for name in ("sha256_cbor", "sha256_cbor_64bit"):  # LMCache 0.5.6 reads the old name as the new
        cbor = keys(env={"LMCACHE_PRE_CACHING_HASH_ALGORITHM": name})
        assert isinstance(cbor, PoolKeys) and isinstance(cbor.scheme, LMCacheCborHash)
    other = keys(env={"LMCACHE_PRE_CACHING_HASH_ALGORITHM": "xxhash"})
    assert isinstance(other, KeysUnavailable) and "'xxhash'" in other.reason


def test_tandems_connector_keeps_tandems_hash_and_keys_by_kv_head_not_tp() -> None:
    found = keys("tandem", seed=None, tp=(2, 2))
    assert isinstance(found, PoolKeys)
    assert (found.scheme, found.world_size, found.worker_id, found.dtype) == (TandemHash(), 1, 0, "bfloat16")
    for tp in ((1, 1), (2, 1), (1, 4), (4, 2)):
        assert keys("tandem", seed=None, tp=tp) == found  # KV head 0's key, whatever TP
    assert (
        isinstance(piped := keys("tandem", seed=None, args=["-pp", "2"]), PoolKeys) and piped.world_size == 2
    )
    keyed = engine_pool_keys(
        connector="tandem", model="m", chunk_size=256, engine_args=(), engine_env={}, tensor_parallel=(1, 1),
        model_config=QWEN, python_hash_seed=None, pool_key=b"k" * 32,
    )  # fmt: skip
    assert isinstance(keyed, PoolKeys) and keyed.scheme == TandemHash(key=b"k" * 32)


def test_lmcache_keys_have_lmcache_0_3s_as_their_alternative_and_tandems_none() -> None:
    found = keys(tp=(2, 2), args=["--dtype", "half"])
    assert isinstance(found, PoolKeys)
    (legacy,) = key_alternatives(found)
    assert legacy.scheme == LMCache03Hash(5313149338359954478)
    assert (legacy.model, legacy.world_size, legacy.worker_id) == ("/models/qwen", 2, 0)
    assert legacy.chunk_keys(list(range(256)), suffix="")[0].startswith("vllm@/models/qwen@2@0@")
    tandem = keys("tandem", seed=None)
    assert isinstance(tandem, PoolKeys) and key_alternatives(tandem) == ()


@pytest.mark.parametrize("seed", [None, "random", "not-a-number"])
def test_lmcache_builtin_without_a_fixed_seed_has_no_computable_keys(seed: str | None) -> None:
    found = keys(seed=seed, env=BUILTIN)
    assert isinstance(found, KeysUnavailable) and "PYTHONHASHSEED" in found.reason


def test_lmcache_sha256_cbor_keys_need_no_numeric_seed_and_then_have_no_0_3_alternative() -> None:
    found = keys(seed=None)
    assert isinstance(found, PoolKeys)
    assert found.scheme == LMCacheCborHash(11230124004819357437)  # vLLM 0.32's seed "vllm-none-hash"
    assert key_alternatives(found) == ()


def test_pools_of_different_world_sizes_share_no_keys_unless_mla_collapses_them() -> None:
    found = keys(tp=(2, 1))
    assert isinstance(found, KeysUnavailable) and "world sizes 2 and 1" in found.reason
    mla = keys(tp=(2, 1), config=DEEPSEEK)
    assert isinstance(mla, PoolKeys) and mla.world_size == 1  # LMCache's save_only_first_rank
    tandem = keys("tandem", tp=(2, 1), config=DEEPSEEK)
    assert isinstance(tandem, PoolKeys) and tandem.world_size == 1  # one latent, stored once


def test_tandems_keys_need_no_kv_head_count() -> None:
    """Head 0's key names the chunk: the gateway needs no `config.json` head count to compute it."""
    found = keys("tandem", tp=(2, 1), config={"model_type": "qwen2"})
    assert isinstance(found, PoolKeys) and (found.world_size, found.worker_id) == (1, 0)


def test_engine_args_override_the_pools_parallel_sizes() -> None:
    found = keys(tp=(1, 1), args=["-tp", "2", "--pipeline-parallel-size=2"])
    assert isinstance(found, PoolKeys) and found.world_size == 4
    bad = keys(args=["--tensor-parallel-size", "two"])
    assert isinstance(bad, KeysUnavailable) and "--tensor-parallel-size" in bad.reason


@pytest.mark.parametrize(
    ("args", "tp", "sizes"),
    [
        ([], 2, (2, 1, 1)),
        (["--tensor-parallel-size", "4"], 2, (4, 1, 1)),
        (["--tensor-parallel-size", "4", "-tp", "8"], 1, (8, 1, 1)),  # the last one, as argparse keeps
        (["-pp", "2", "-pcp", "2"], 1, (1, 2, 2)),
    ],
)
def test_parallel_sizes(args: list[str], tp: int, sizes: tuple[int, int, int]) -> None:
    assert parallel_sizes(args, tensor_parallel=tp) == sizes


@pytest.mark.parametrize(
    ("args", "config", "dtype"),
    [
        ([], {"torch_dtype": "bfloat16"}, "bfloat16"),
        ([], {"torch_dtype": "float16"}, "half"),
        (["--dtype", "float32"], None, "float"),
        (["--kv-cache-dtype", "fp8"], {"torch_dtype": "bfloat16"}, "uint8"),  # fp8 caches are uint8 tensors
        (["--kv-cache-dtype", "fp8_e5m2"], None, "uint8"),
        (["--kv-cache-dtype", "fp8_inc"], None, "fp8_e4m3fn"),
        (["--kv-cache-dtype", "auto", "--dtype", "half"], None, "half"),
        (["--kv-cache-dtype", "something_new"], None, None),
        (["--kv-cache-dtype", "float16"], {"torch_dtype": "bfloat16"}, "half"),  # a float cache: its name
        (["--kv-cache-dtype", "float"], None, "float"),
    ],
)
def test_lmcache_names_the_kv_cache_torch_dtype(
    args: list[str], config: dict[str, object] | None, dtype: str | None
) -> None:
    assert lmcache_kv_dtype(args, config) == dtype


def test_an_unknown_cache_dtype_turns_the_keys_off() -> None:
    found = keys(args=["--kv-cache-dtype", "something_new"])
    assert isinstance(found, KeysUnavailable) and "--kv-cache-dtype" in found.reason


@pytest.mark.parametrize(
    ("config", "env", "mla"),
    [
        (DEEPSEEK, {}, True),
        ({"text_config": DEEPSEEK}, {}, True),
        ({**DEEPSEEK, "kv_lora_rank": None}, {}, False),
        ({**DEEPSEEK, "is_causal": False}, {}, False),
        (DEEPSEEK, {"VLLM_MLA_DISABLE": "1"}, False),
        (DEEPSEEK, {"VLLM_MLA_DISABLE": "0"}, True),
        ({"model_type": "deepseek_v4", "compress_ratios": [1], "head_dim": 512}, {}, True),
        (QWEN, {}, False),
        (None, {}, False),
    ],
)
def test_uses_mla_follows_vllms_rule(
    config: dict[str, object] | None, env: dict[str, str], mla: bool
) -> None:
    assert uses_mla(config, env) is mla
