"""LMCache 0.3's chunk keys (`tandem.core.kvkeys.LMCache03Hash`, `tandem.kvpool.keys.PoolKeys`): the
layout of the default engine image's LMCache (`lmcache/vllm-openai:v0.3.9`).

Known answers: the keys below were printed by LMCache 0.3.9's own `ChunkedTokenDatabase.process_tokens`
(`CacheEngineKey.to_string()`) in a vLLM 0.11.0 process on CPython 3.12 with PYTHONHASHSEED=0 and
Tandem's `LMCACHE_*` settings (chunk 256, `save_unfull_chunk: False`, `builtin` hash), 2026-11-28, for
`tokens(n)` below; this file recomputes them in this process. Real: the hashing; nothing faked.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from tests.interpreters import cpython

from tandem.core.kvkeys import PY312_NONE_HASH, LMCache03Hash, lmcache03_chunk_hashes, lmcache_none_hash
from tandem.kvpool.keys import PoolKeys, parse_key

NONE = 5313149338359954478  # hash("0") under PYTHONHASHSEED=0 (vLLM's NONE_HASH)


def tokens(n: int) -> list[int]:
    return [(i * 7919 + 3) % 151936 for i in range(n)]


#: (model, world size, tokens, LMCache 0.3.9's keys)
KNOWN = [
    (
        "/models/qwen",
        1,
        3 * 256 + 17,
        [
            "vllm@/models/qwen@1@0@2f7f4492ec2fe3e3",
            "vllm@/models/qwen@1@0@-606b4b97289a68db",
            "vllm@/models/qwen@1@0@46703115add0b6af",
        ],
    ),
    (
        "Qwen/Qwen2.5-7B-Instruct",
        2,
        600,
        [
            "vllm@Qwen/Qwen2.5-7B-Instruct@2@0@2f7f4492ec2fe3e3",
            "vllm@Qwen/Qwen2.5-7B-Instruct@2@0@-606b4b97289a68db",
        ],
    ),
]


@pytest.mark.parametrize(("model", "world", "n", "keys"), KNOWN)
def test_the_keys_are_lmcache_0_3_9s(model: str, world: int, n: int, keys: list[str]) -> None:
    assert lmcache_none_hash("0") == NONE
    pool = PoolKeys(model=model, chunk_size=256, world_size=world, scheme=LMCache03Hash(NONE))
    assert pool.chunk_keys(tokens(n), suffix="") == keys
    assert pool.chunk_keys(tokens(n)) == [k + "metadata" for k in keys]


def test_the_chain_differs_from_lmcache_0_5s_from_the_first_chunk() -> None:
    from tandem.core.kvkeys import lmcache_chunk_hashes

    old, new = (f(tokens(512), 256, none_hash=NONE) for f in (lmcache03_chunk_hashes, lmcache_chunk_hashes))
    assert len(old) == len(new) == 2 and old[0] != new[0]


def test_the_stand_in_is_none_on_cpython_3_12() -> None:
    """The engines' CPython (≥ 3.12) hashes `(parent, chunk, None)` as this process hashes the int."""
    python = cpython((3, 12))
    if python is None:
        pytest.skip("no CPython 3.12 or later here")
    chunk = tokens(256)
    code = f"import json; print(json.dumps([hash(None), hash(({NONE}, tuple({chunk}), None))]))"
    answer = json.loads(
        subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert answer == [PY312_NONE_HASH, lmcache03_chunk_hashes(chunk, 256, none_hash=NONE)[0]]


def test_the_keys_parse_with_their_model_and_no_dtype() -> None:
    parsed = parse_key("vllm@Qwen/Qwen2.5-7B-Instruct@2@0@-606b4b97289a68dbkv_bytes")
    assert parsed is not None
    assert (parsed.model, parsed.world_size, parsed.worker_id) == ("Qwen/Qwen2.5-7B-Instruct", 2, 0)
    assert (parsed.chunk_hash, parsed.dtype, parsed.suffix) == ("-606b4b97289a68db", "", "kv_bytes")
    assert parsed.base == "vllm@Qwen/Qwen2.5-7B-Instruct@2@0@-606b4b97289a68db"
    current = parse_key("qwen@1@0@2f7f@bfloat16metadata")  # LMCache 0.5's layout still wins
    assert current is not None and (current.model, current.dtype) == ("qwen", "bfloat16")
