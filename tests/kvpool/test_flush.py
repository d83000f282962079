"""Flushing one model (`tandem.kvpool.flush`): its pairs go, every other key stays.

Real: a redis-server on 127.0.0.1. Nothing is faked.
"""

from __future__ import annotations

import pytest
from tests.kvpool.pool import CHUNK, prompt, store_prompt
from tests.servers import RedisServer

from tandem.kvpool.flush import FlushResult, flush_model
from tandem.kvpool.keys import LMCache03Hash, PoolKeys, lmcache_none_hash

NONE_HASH_0 = lmcache_none_hash("0") or 0


def test_only_the_named_models_chunks_are_deleted(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(5 * CHUNK))
        kept = store_prompt(client, "qwen2", prompt(2 * CHUNK))  # a name that extends "qwen"
        kept += store_prompt(client, "llama", prompt(CHUNK))
        client.set("qwen@notes", b"not a chunk key")
        result = flush_model(client, "qwen", batch=3)
        remaining = sorted(k.decode() for k in client.keys("*"))
    assert result == FlushResult(keys=10, chunks=5)
    assert remaining == sorted([*(b + s for b in kept for s in ("kv_bytes", "metadata")), "qwen@notes"])


def test_lmcache_0_3_keys_of_the_model_go_too(redis_server: RedisServer) -> None:
    """The default engine image's LMCache writes `vllm@<model>@...` (tandem.kvpool.keys)."""
    legacy = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=LMCache03Hash(NONE_HASH_0))
    other = PoolKeys(model="llama", chunk_size=CHUNK, scheme=LMCache03Hash(NONE_HASH_0))
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(2 * CHUNK))
        for keys in (legacy, other):
            for name in keys.chunk_keys(prompt(3 * CHUNK), suffix=""):
                client.set(name + "kv_bytes", b"x")
                client.set(name + "metadata", b"m")
        result = flush_model(client, "qwen")
        remaining = sorted(k.decode() for k in client.keys("*"))
    assert result == FlushResult(keys=10, chunks=5)
    assert remaining == sorted(
        n + s for n in other.chunk_keys(prompt(3 * CHUNK), suffix="") for s in ("kv_bytes", "metadata")
    )


def test_glob_characters_in_a_model_name_match_only_themselves(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "m*", prompt(CHUNK))
        store_prompt(client, "mx", prompt(CHUNK))
        assert flush_model(client, "m*").chunks == 1
        assert client.dbsize() == 2


def test_flushing_an_absent_model_deletes_nothing(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        store_prompt(client, "qwen", prompt(CHUNK))
        assert flush_model(client, "absent") == FlushResult(keys=0, chunks=0)
        assert client.dbsize() == 2


def test_a_non_positive_batch_is_rejected(redis_server: RedisServer) -> None:
    with redis_server.client() as client, pytest.raises(ValueError, match="batch"):
        flush_model(client, "qwen", batch=0)
