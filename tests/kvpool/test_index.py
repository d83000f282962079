"""Readiness (`tandem.kvpool.index.KVPoolIndex`): the router's barrier question against a real Redis.

Real: a redis-server on 127.0.0.1 (one with a password too). Faked: the clock that spaces retries of
an unavailable pool (a list the test advances), so the back-off is checked without waiting.
"""

from __future__ import annotations

import time
from dataclasses import replace

from tests.kvpool.pool import CHUNK, PAYLOAD, prompt, store_prompt
from tests.servers import RedisServer, free_port

from tandem.kvpool.client import connect
from tandem.kvpool.index import KVPoolIndex
from tandem.kvpool.keys import (
    KV_BYTES_SUFFIX,
    METADATA_SUFFIX,
    LMCache03Hash,
    LMCacheHash,
    PoolKeys,
    TandemHash,
    encode_metadata,
    lmcache_none_hash,
)

QWEN = PoolKeys(model="qwen", chunk_size=CHUNK)


def _index(url: str, clock: list[float] | None = None, password: str | None = None) -> KVPoolIndex:
    now = clock if clock is not None else [0.0]
    client = connect(url, timeout_s=2.0, password=password)
    return KVPoolIndex(client, keys=QWEN, clock=lambda: now[0], retry_after_s=1.0)


async def test_the_cached_prefix_is_the_leading_run_of_stored_chunks(redis_server: RedisServer) -> None:
    tokens = prompt(4 * CHUNK + 3)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens[: 2 * CHUNK])
        store_prompt(client, "other", tokens)  # another model's chunks do not count
    index = _index(redis_server.url)
    try:
        assert await index.cached_prefix_tokens(tokens) == 2 * CHUNK
        assert await index.cached_prefix_tokens(prompt(CHUNK - 1)) == 0
    finally:
        await index.aclose()


async def test_a_chunk_whose_bytes_were_evicted_ends_the_cached_prefix(redis_server: RedisServer) -> None:
    tokens = prompt(3 * CHUNK)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens)
        second = QWEN.chunk_keys(tokens, suffix="")[1]
        assert client.delete(second + KV_BYTES_SUFFIX) == 1  # metadata left behind
    index = _index(redis_server.url)
    try:
        assert await index.cached_prefix_tokens(tokens) == CHUNK
    finally:
        await index.aclose()


async def test_the_barrier_passes_once_every_full_chunk_is_stored(redis_server: RedisServer) -> None:
    tokens = prompt(3 * CHUNK)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens)
    index = _index(redis_server.url)
    try:
        result = await index.wait_for_prompt(tokens, timeout_s=5.0)
    finally:
        await index.aclose()
    assert (result.outcome, result.checks, result.chunks, result.found) == ("ok", 1, 3, 3)


async def test_a_barrier_that_times_out_says_how_many_of_its_chunks_were_there(
    redis_server: RedisServer,
) -> None:
    tokens = prompt(3 * CHUNK)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens[:CHUNK])  # the first chunk only
    index = KVPoolIndex(connect(redis_server.url), keys=QWEN, clock=time.monotonic)
    try:
        some = await index.wait_for_prompt(tokens, timeout_s=0.05)
        none = await index.wait_for_prompt(prompt(2 * CHUNK, start=10**6), timeout_s=0.05)
        short = await index.wait_for_prompt(tokens[: CHUNK - 1], timeout_s=0.05)
    finally:
        await index.aclose()
    assert (some.outcome, some.chunks, some.found) == ("timeout", 3, 1)
    assert (none.outcome, none.chunks, none.found) == ("timeout", 2, 0)
    assert (short.outcome, short.chunks, short.checks) == ("ok", 0, 0)


async def test_the_barrier_times_out_on_a_missing_chunk(redis_server: RedisServer) -> None:
    tokens = prompt(2 * CHUNK)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens, metadata=False)  # bytes only: not complete
    index = KVPoolIndex(connect(redis_server.url), keys=QWEN, clock=time.monotonic)
    try:
        result = await index.wait_for_prompt(tokens, timeout_s=0.05)
    finally:
        await index.aclose()
    assert result.outcome == "timeout"
    assert result.checks >= 1


async def test_a_dead_pool_answers_unavailable_and_is_not_asked_again_for_a_while() -> None:
    clock = [100.0]
    index = _index(f"redis://127.0.0.1:{free_port()}", clock)
    try:
        assert await index.cached_prefix_tokens(prompt(CHUNK)) is None
        result = await index.wait_for_prompt(prompt(CHUNK), timeout_s=1.0)
        assert (result.outcome, result.checks) == ("pool_unavailable", 0)  # within retry_after_s
        clock[0] += 1.5
        assert (await index.wait_for_prompt(prompt(CHUNK), timeout_s=1.0)).checks == 1
    finally:
        await index.aclose()


async def test_a_password_protected_pool_needs_the_password(redis_server: RedisServer) -> None:
    tokens = prompt(CHUNK)
    with redis_server.client() as client:
        store_prompt(client, "qwen", tokens)
        client.config_set("requirepass", "s3cret")
    without = _index(redis_server.url)
    with_env = _index(redis_server.url, password="s3cret")
    in_url = _index(f"redis://:s3cret@127.0.0.1:{redis_server.port}")
    try:
        assert await without.cached_prefix_tokens(tokens) is None
        assert await with_env.cached_prefix_tokens(tokens) == CHUNK
        assert await in_url.cached_prefix_tokens(tokens) == CHUNK
    finally:
        for index in (without, with_env, in_url):
            await index.aclose()


async def test_lmcache_engines_chunks_are_found_under_lmcaches_own_keys(redis_server: RedisServer) -> None:
    """Keys as LMCache writes them (`/models/qwen@2@0@<builtin hash>@half` + suffix, worker 1 too)."""
    none_hash = lmcache_none_hash("0")
    assert none_hash is not None
    keys = PoolKeys(
        model="/models/qwen", chunk_size=CHUNK, dtype="half", world_size=2, scheme=LMCacheHash(none_hash)
    )
    tokens = prompt(3 * CHUNK + 5)
    with redis_server.client() as client:
        for worker in (0, 1):
            for base in replace(keys, worker_id=worker).chunk_keys(tokens[: 2 * CHUNK], suffix=""):
                client.set(base + KV_BYTES_SUFFIX, b"x")
                client.set(base + METADATA_SUFFIX, b"m")
        store_prompt(client, "/models/qwen", tokens)  # Tandem's hash of the same tokens: not these keys
    index = KVPoolIndex(connect(redis_server.url), keys=keys, clock=time.monotonic)
    try:
        assert index.metadata_keys(tokens)[0].startswith("/models/qwen@2@0@")
        assert await index.cached_prefix_tokens(tokens) == 2 * CHUNK
        assert (await index.wait_for_prompt(tokens[: 2 * CHUNK], timeout_s=1.0)).outcome == "ok"
    finally:
        await index.aclose()


async def test_another_layout_that_holds_the_prompt_becomes_the_keys(redis_server: RedisServer) -> None:
    """LMCache 0.5's keys find nothing where the engines write LMCache 0.3's: the index tries the
    alternatives it was given and keeps the first that holds any of the prompt's chunks."""
    none_hash = lmcache_none_hash("0") or 0
    current = PoolKeys(model="/models/qwen", chunk_size=CHUNK, scheme=LMCacheHash(none_hash))
    legacy = replace(current, scheme=LMCache03Hash(none_hash))
    tokens = prompt(2 * CHUNK + 5)
    client = connect(redis_server.url, timeout_s=2.0)
    index = KVPoolIndex(client, keys=current, alternatives=[legacy], clock=lambda: 0.0)
    try:
        assert await index.adopt_alternative(tokens) is None  # nothing stored yet
        assert index.keys is current and index.alternatives == (legacy,)
        with redis_server.client() as sync:
            sync.set(legacy.chunk_keys(tokens)[0], b"m")  # the first chunk, as LMCache 0.3 names it
        assert await index.adopt_alternative(prompt(CHUNK - 1)) is None  # no full chunk: nothing to ask
        assert await index.adopt_alternative(tokens) is legacy
        assert index.keys is legacy and not index.alternatives
        assert index.metadata_keys(tokens) == legacy.chunk_keys(tokens)
    finally:
        await index.aclose()


async def test_the_index_looks_a_prompt_up_in_its_tenants_scope(redis_server: RedisServer) -> None:
    keys = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=TandemHash(key=b"k" * 32))
    tokens = prompt(2 * CHUNK)
    meta = encode_metadata(length=PAYLOAD, dtype="bfloat16", layers=1, tokens=CHUNK, hidden=1)
    with redis_server.client() as client:
        for base in keys.chunk_keys(tokens, suffix="", scope="t1-a"):  # tenant a's chunks only
            client.set(base + KV_BYTES_SUFFIX, b"x" * PAYLOAD)
            client.set(base + METADATA_SUFFIX, meta)
    index = KVPoolIndex(connect(redis_server.url), keys=keys, clock=time.monotonic)
    try:
        assert await index.cached_prefix_tokens(tokens, scope="t1-a") == 2 * CHUNK
        assert await index.cached_prefix_tokens(tokens, scope="t1-b") == 0
        assert await index.cached_prefix_tokens(tokens) == 0
        assert (await index.wait_for_prompt(tokens, timeout_s=1.0, scope="t1-a")).outcome == "ok"
        assert (await index.wait_for_prompt(tokens, timeout_s=0.02, scope="t1-b")).outcome == "timeout"
    finally:
        await index.aclose()
