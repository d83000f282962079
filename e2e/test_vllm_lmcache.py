"""Slow tier, CUDA only: vLLM's `LMCacheConnectorV1` (LMCache) writing and reading the KV pool whose keys
Tandem's gateway computes for its conditional P/D decision and its KV barrier.

LMCache's vLLM integration has no CPU path (docs/vllm.md), so this module is skipped unless the engine
interpreter (`TANDEM_VLLM_PYTHON`, default .venv-vllm) has LMCache and a CUDA device; it runs where a
GPU is lent. Two engines of the tiny local model are started as the operator starts a prefill and a
decode engine with `kvPool.connector: lmcache` (`engine_config.kv_transfer_config`, `lmcache_env`, the
engines' PYTHONHASHSEED) against a Redis this test starts, after the operator's init check of the
image's vLLM and LMCache (`tandem.kvpool.lmcache_check`; a pair it refuses is skipped, and
TANDEM_LMCACHE_CHECK=off runs it anyway, e.g. with an LMCache patched to size tokens by the cache).
With greedy decoding:

1. after the producer computes some prompts, Redis holds exactly the keys `engine_pool_keys` gives for
   their tokens (each chunk's `metadata` and `kv_bytes`), nothing else;
2. the consumer answers the same prompts with KV from Redis: `vllm:external_prefix_cache_hits_total`
   grows, and every answer equals the producer's token for token.

Run: `TANDEM_SLOW=1 TANDEM_VLLM_PYTHON=<python with vLLM for CUDA and LMCache> python -m pytest
e2e/test_vllm_lmcache.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from e2e.stacks import (
    CHUNK,
    EXTRA_ENGINE_ARGS,
    MODEL_DIR,
    VLLM_PYTHON,
    _start_redis,
    complete,
    counter,
    require_vllm,
    tokenize,
)
from tests.servers import free_port, stop_process

from tandem.core.spec import ENGINE_HASH_SEED
from tandem.kvpool.engine_config import KVRole, kv_transfer_config, lmcache_env, to_json
from tandem.kvpool.engine_keys import engine_pool_keys
from tandem.kvpool.keys import PoolKeys
from tandem.local.vllm_engine import default_args
from tandem.operator.resources.engine import LMCACHE_CHECK_SCRIPT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]

START_TIMEOUT_S = 600.0
CAN_RUN = "import lmcache.v1.cache_engine, torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"


@pytest.fixture(autouse=True, scope="module")
def _lmcache_and_cuda() -> None:
    require_vllm()
    probe = subprocess.run([str(VLLM_PYTHON), "-c", CAN_RUN], capture_output=True, text=True, check=False)
    if probe.returncode == 3:
        pytest.skip(f"needs a CUDA device: {VLLM_PYTHON} sees none")
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["no output"]
        pytest.skip(f"needs LMCache and torch in {VLLM_PYTHON}: {lines[-1][-200:]}")
    # The operator's init check of LMCache engine pods: a pair it refuses never starts in a cluster.
    check = subprocess.run(
        [str(VLLM_PYTHON), "-c", LMCACHE_CHECK_SCRIPT], capture_output=True, text=True, check=False
    )
    print(check.stdout.strip())
    if check.returncode != 0:
        pytest.skip(
            f"the engine pods' init check refuses this vLLM and LMCache: {check.stdout.strip()[-400:]}"
        )


def engine_args() -> list[str]:
    return [*default_args(EXTRA_ENGINE_ARGS), *EXTRA_ENGINE_ARGS]


def start_engine(role: KVRole, redis_url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    config = kv_transfer_config(
        connector="lmcache",
        role=role,
        pool_url=redis_url,
        model=MODEL_DIR.name,
        chunk_size=CHUNK,
    )
    port = free_port()
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--kv-transfer-config", to_json(config), *engine_args(),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    env |= lmcache_env(pool_url=redis_url, chunk_size=CHUNK)
    env |= {"PYTHONHASHSEED": ENGINE_HASH_SEED, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return process, f"http://127.0.0.1:{port}"


def wait_healthy(process: subprocess.Popen[bytes], base: str, log: Path) -> float:
    started = time.monotonic()
    while True:
        assert process.poll() is None, f"engine exited:\n{log.read_text()[-6000:]}"
        assert time.monotonic() - started < START_TIMEOUT_S, f"engine not healthy:\n{log.read_text()[-6000:]}"
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(1.0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(producer, consumer, redis URL): both engines started together."""
    state = tmp_path_factory.mktemp("lmcache")
    redis_port = free_port()
    redis_process = _start_redis(redis_port, state)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    roles: tuple[KVRole, KVRole] = ("producer", "consumer")
    logs = [state / f"{role}.log" for role in roles]
    started = [(*start_engine(role, redis_url, log), log) for role, log in zip(roles, logs, strict=True)]
    try:
        for process, base, log in started:
            print(f"{base} healthy in {wait_healthy(process, base, log):.1f}s")
        yield started[0][1], started[1][1], redis_url
    finally:
        for process, _, log in started:
            stop_process(process, timeout_s=30)
            print(log.read_text()[-3000:])
        stop_process(redis_process)


WORDS = "for item in range(10):\n    total += item * scale\n    print(total, item)\n"


def prompt(seed: int, repeats: int) -> str:
    return f"# lmcache case {seed}\n" + WORDS * repeats


def keys_for(tokens: list[int]) -> list[str]:
    config = json.loads((MODEL_DIR / "config.json").read_text())
    keys = engine_pool_keys(
        connector="lmcache", model=str(MODEL_DIR), chunk_size=CHUNK, engine_args=engine_args(),
        engine_env=lmcache_env(pool_url="redis://unused", chunk_size=CHUNK), tensor_parallel=(1, 1),
        model_config=config, python_hash_seed=ENGINE_HASH_SEED,
    )  # fmt: skip
    assert isinstance(keys, PoolKeys), keys
    return keys.chunk_keys(tokens, suffix="")


def test_lmcache_writes_the_keys_the_gateway_computes_and_the_consumer_loads_them(
    engines: tuple[str, str, str],
) -> None:
    producer, consumer, redis_url = engines
    texts = [prompt(1, 2), prompt(2, 24), prompt(3, 60)]
    answers = [complete(producer, text) for text in texts]
    token_lists = [tokenize(producer, text) for text in texts]
    chunk_keys = [key for tokens in token_lists for key in keys_for(tokens)]
    expected = {key + suffix for key in chunk_keys for suffix in ("metadata", "kv_bytes")}
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 30  # the producer's saves may finish after its answer
    while not expected <= (stored := {key.decode() for key in client.scan_iter(count=1000)}):
        assert time.monotonic() < deadline, (sorted(expected - stored)[:4], sorted(stored)[:4])
        time.sleep(0.2)
    print(f"tokens {[len(t) for t in token_lists]}; {len(stored)} Redis keys, e.g. {sorted(stored)[:2]}")
    assert stored == expected
    assert len(expected) >= 2 * 4  # prompts of several chunks

    before = counter(consumer, "vllm:external_prefix_cache_hits_total")
    for text, reference in zip(texts, answers, strict=True):
        loaded = complete(consumer, text)
        assert loaded["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"], text[:40]
    hits = counter(consumer, "vllm:external_prefix_cache_hits_total") - before
    full_chunks = sum((len(tokens) - 1) // CHUNK * CHUNK for tokens in token_lists)
    print(f"consumer external prefix-cache hits {hits:.0f}; full chunks before the last token {full_chunks}")
    assert hits == full_chunks
