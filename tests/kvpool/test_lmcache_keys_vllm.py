"""Tandem's LMCache keys against LMCache's own: the gateway's `PoolKeys` for LMCache engines equal the
keys LMCache 0.5.6's `ChunkedTokenDatabase` makes inside a vLLM 0.32 engine process, with the
`sha256_cbor` chunk hash Tandem configures (`engine_config.lmcache_env`).

Real (only in .venv-vllm, where vLLM and LMCache are installed; skipped elsewhere): a child process
started as the operator starts engines (PYTHONHASHSEED=0 and `engine_config.lmcache_env`'s
`LMCACHE_*` variables) loads LMCache's config the way its vLLM integration does
(`lmcache_get_or_create_config`), builds LMCache's `ChunkedTokenDatabase` (which calls vLLM's
`init_none_hash`) and prints `process_tokens` keys (`CacheEngineKey.to_string()`), with the KV dtype
vLLM's `get_kv_cache_torch_dtype` gives. This process (its own random hash seed) computes Tandem's
keys with `engine_pool_keys`. Faked: the engine itself (no model, no GPU: LMCache's metadata is built
from the engine's arguments instead of a running vLLM); LMCache writing to Redis is not exercised.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tandem.kvpool.engine_config import lmcache_env
from tandem.kvpool.engine_keys import engine_pool_keys, lmcache_kv_dtype
from tandem.kvpool.keys import PoolKeys, PoolScope, lmcache_cbor_none_hash, lmcache_salt_tag
from tandem.router.pd.handoff import decode_body, lmcache_tagged, prefill_body

if importlib.util.find_spec("lmcache") is None or importlib.util.find_spec("vllm") is None:
    pytest.skip("needs LMCache and vLLM (.venv-vllm)", allow_module_level=True)

CHUNK = 256
ENGINE = """
import json, sys
import torch
from lmcache.integration.vllm.utils import (
    extract_request_configs_from_sampling_params, lmcache_get_or_create_config,
)
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from lmcache.utils import TORCH_DTYPE_TO_STR_DTYPE
from lmcache.v1 import token_database
from lmcache.v1.metadata import LMCacheMetadata
from vllm.utils.torch_utils import get_kv_cache_torch_dtype

config = lmcache_get_or_create_config()
out = {"dtypes": {}, "keys": [], "tagged": []}
for cache, model in json.loads(sys.argv[1]):
    out["dtypes"][f"{cache}/{model}"] = TORCH_DTYPE_TO_STR_DTYPE[get_kv_cache_torch_dtype(cache, model)]
for case in json.loads(sys.argv[2]):
    metadata = LMCacheMetadata(
        model_name=case["model"], world_size=case["world_size"], local_world_size=case["world_size"],
        worker_id=0, local_worker_id=0, use_mla=case["mla"],
        kv_dtype=get_kv_cache_torch_dtype(case["cache"], case["dtype"]), kv_shape=(2, 2, 256, 2, 64),
    )
    database = token_database.ChunkedTokenDatabase(config, metadata)
    keys = [key.to_string() for _, _, key in database.process_tokens(tokens=case["tokens"])]
    tensor = [key.to_string() for _, _, key in database.process_tokens(tokens=torch.tensor(case["tokens"]))]
    assert keys == tensor
    out["keys"].append(keys)
    # The gateway's bodies for an adapter's request, through vLLM's OpenAI protocol into LMCache's
    # request configs (what vLLM hands the connector: the sampling params' extra_args).
    tagged = []
    for params in case.get("bodies", []):
        request = CompletionRequest(model="sql", prompt="hi", max_tokens=4, kv_transfer_params=params)
        configs = extract_request_configs_from_sampling_params(request.to_sampling_params(max_tokens=4))
        made = database.process_tokens(tokens=case["tokens"], request_configs=configs)
        tagged.append([key.to_string() for _, _, key in made])
    out["tagged"].append(tagged)
out["settings"] = [config.chunk_size, config.save_unfull_chunk, config.pre_caching_hash_algorithm]
out["none_hash"] = token_database.NONE_HASH
out["builtin"] = database.hash_func is hash
out["hash_func"] = getattr(database.hash_func, "__name__", "")
print("RESULT " + json.dumps(out))
"""
#: (--kv-cache-dtype, --dtype) pairs whose LMCache name `lmcache_kv_dtype` must know.
DTYPES = [
    ["auto", "bfloat16"],
    ["auto", "half"],
    ["auto", "float16"],
    ["auto", "float32"],
    ["fp8", "bfloat16"],
    ["fp8_e4m3", "half"],
    ["fp8_e5m2", "half"],
    ["fp8_inc", "bfloat16"],
    ["int8_per_token_head", "bfloat16"],
]
DEEPSEEK = {"model_type": "deepseek_v3", "kv_lora_rank": 512}
CASES: list[dict[str, Any]] = [
    {
        "model": "/models/qwen",
        "tp": 1,
        "cache": "auto",
        "dtype": "bfloat16",
        "config": None,
        "n": 3 * CHUNK + 17,
    },
    {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "tp": 2,
        "cache": "auto",
        "dtype": "half",
        "config": None,
        "n": 600,
    },
    {"model": "/models/qwen", "tp": 4, "cache": "fp8", "dtype": "bfloat16", "config": None, "n": 2 * CHUNK},
    {
        "model": "/models/dsv3",
        "tp": 8,
        "cache": "auto",
        "dtype": "bfloat16",
        "config": DEEPSEEK,
        "n": 5 * CHUNK,
    },
    {"model": "/models/qwen", "tp": 1, "cache": "auto", "dtype": "bfloat16", "config": None, "n": CHUNK - 1},
]


#: The scopes of the gateway's tagged requests (`lmcache_tagged`): adapter `sql`, adapter `sql` for a
#: tenant, a tenant on the base model.
SCOPES = [
    PoolScope(lora_name="sql"),
    PoolScope(lora_name="sql", cache_salt="t1-ab"),
    PoolScope(cache_salt="t1-ab"),
]


def tagged_bodies(scope: PoolScope) -> list[dict[str, Any]]:
    """What the gateway sends LMCache engines for a request in `scope`: the decode-only body's, the
    prefill's and the decode's after a prefill (with a NIXL-style answer) `kv_transfer_params`."""
    body: dict[str, Any] = {"model": scope.lora_name or "qwen", "prompt": "hi"}
    lmcache_tagged(body, adapter=scope.lora_name, salt=scope.cache_salt)
    return [
        body["kv_transfer_params"],
        prefill_body(body)["kv_transfer_params"],
        decode_body(body, {"do_remote_prefill": True, "remote_engine_id": "e1"})["kv_transfer_params"],
    ]


BODIES = [params for scope in SCOPES for params in tagged_bodies(scope)]


def tokens(n: int) -> list[int]:
    return [(i * 7919 + 3) % 151936 for i in range(n)]


def tandem_keys(case: dict[str, Any]) -> PoolKeys:
    keys = engine_pool_keys(
        connector="lmcache",
        model=case["model"],
        chunk_size=CHUNK,
        engine_args=["--kv-cache-dtype", case["cache"], "--dtype", case["dtype"]],
        engine_env={},
        tensor_parallel=(case["tp"], case["tp"]),
        model_config=case["config"],
        python_hash_seed="0",
    )
    assert isinstance(keys, PoolKeys), keys
    return keys


@pytest.fixture(scope="module")
def lmcache() -> dict[str, Any]:
    engines = [
        {
            "model": case["model"],
            "world_size": case["tp"],
            "mla": case["config"] is not None,
            "cache": case["cache"],
            "dtype": case["dtype"],
            "tokens": tokens(case["n"]),
            "bodies": BODIES if index == 0 else [],
        }
        for index, case in enumerate(CASES)
    ]
    env = {k: v for k, v in os.environ.items() if k != "LMCACHE_CONFIG_FILE" and k != "PYTHONHASHSEED"}
    env |= {"PYTHONHASHSEED": "0", **lmcache_env(pool_url="redis://127.0.0.1:6379", chunk_size=CHUNK)}
    result = subprocess.run(
        [sys.executable, "-c", ENGINE, json.dumps(DTYPES), json.dumps(engines)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    answer: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return answer


def test_lmcache_runs_with_the_settings_the_keys_assume(lmcache: dict[str, Any]) -> None:
    assert lmcache["settings"] == [CHUNK, False, "sha256_cbor"]
    assert (lmcache["builtin"], lmcache["hash_func"]) == (False, "sha256_cbor")  # vLLM's, not Python's hash
    assert lmcache["none_hash"] == lmcache_cbor_none_hash("0") == 5625442194607170974


@pytest.mark.parametrize("index", range(len(CASES)))
def test_tandems_keys_are_lmcaches_keys(lmcache: dict[str, Any], index: int) -> None:
    case = CASES[index]
    assert tandem_keys(case).chunk_keys(tokens(case["n"]), suffix="") == lmcache["keys"][index]


@pytest.mark.parametrize("which", range(len(SCOPES)), ids=["adapter", "adapter-and-salt", "salt"])
def test_a_tagged_request_has_lmcaches_tagged_keys_which_tandem_computes(
    lmcache: dict[str, Any], which: int
) -> None:
    """Through vLLM's protocol, each of the gateway's bodies for an adapter's or a tenant's request
    makes LMCache's keys carry the tags; they are the keys Tandem computes for that scope, and no
    other scope's (the base model's, or the other scopes here)."""
    case, scope, n = CASES[0], SCOPES[which], len(BODIES) // len(SCOPES)
    ours = tandem_keys(case).chunk_keys(tokens(case["n"]), suffix="", scope=scope)
    assert lmcache["tagged"][0][which * n : (which + 1) * n] == [ours] * n
    salt = "@salt%" + lmcache_salt_tag("t1-ab")
    tail = {0: "@bfloat16@lora%sql", 1: "@bfloat16@lora%sql" + salt, 2: "@bfloat16" + salt}[which]
    assert all(key.endswith(tail) for key in ours)
    others = [lmcache["keys"][0]] + [keys for i, keys in enumerate(lmcache["tagged"][0]) if i // n != which]
    assert not any(set(ours) & set(keys) for keys in others)


def test_tandem_names_the_kv_dtype_as_lmcache_does(lmcache: dict[str, Any]) -> None:
    ours = {
        f"{cache}/{model}": lmcache_kv_dtype(["--kv-cache-dtype", cache, "--dtype", model], None)
        for cache, model in DTYPES
    }
    assert ours == lmcache["dtypes"]
