"""End to end: `tandem up` on the shipped example, called through the official `openai` client.

Real everything: the `tandem` CLI in a subprocess, Redis, the simulated engines and the gateway as real
processes on 127.0.0.1. Nothing is faked. The example runs at time scale 1; the test only checks
behaviour, never speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from e2e.stacks import wait_ready
from openai import OpenAI
from tests.servers import free_port

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "deploy" / "examples" / "local-sim.yaml"
READY_TIMEOUT = 120.0

pytestmark = pytest.mark.e2e


@dataclass
class Stack:
    process: subprocess.Popen[str]
    endpoint: str
    state_dir: Path
    output: list[str]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc (children of children included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # Field 4 (after the parenthesised command, which may contain spaces) is the parent pid.
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state_dir = tmp_path_factory.mktemp("state")
    command = [
        sys.executable,
        "-m",
        "tandem.cli",
        "up",
        "-f",
        str(EXAMPLE),
        "--port",
        str(free_port()),
        "--state-dir",
        str(state_dir),
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output: list[str] = []
    try:
        endpoint, _ = wait_ready(process, output, timeout_s=READY_TIMEOUT)
        yield Stack(process=process, endpoint=endpoint, state_dir=state_dir, output=output)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_a_chat_completion_is_answered_through_the_gateway(stack: Stack) -> None:
    with OpenAI(base_url=stack.endpoint, api_key="unused") as client:
        raw = client.chat.completions.with_raw_response.create(
            model="qwen",
            messages=[{"role": "user", "content": "Hello from the e2e test"}],
            max_tokens=8,
            extra_body={"ignore_eos": True},
        )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert raw.headers["x-request-id"]
    # Clients are not told which engines served them (pod addresses, whether a prompt was cached);
    # the gateway's metrics say the prompt was prefilled apart.
    assert not [name for name in raw.headers if name.lower().startswith("x-tandem-")]
    page = httpx.get(stack.endpoint.removesuffix("/v1") + "/metrics", timeout=10).text
    disaggregated = [
        line
        for line in page.splitlines()
        if line.startswith("tandem_router_pd_decisions_total{") and 'decision="disaggregate"' in line
    ]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in disaggregated) >= 1


def test_a_streamed_completion_arrives_in_chunks_with_usage(stack: Stack) -> None:
    with OpenAI(base_url=stack.endpoint, api_key="unused") as client:
        chunks = list(
            client.completions.create(
                model="qwen",
                prompt="Once upon a time",
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
        )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_a_long_prompt_leaves_its_kv_chunks_in_the_pool(stack: Stack) -> None:
    prompt = " ".join(f"word{i}" for i in range(400))  # about 1,200 tokens: several full chunks
    with OpenAI(base_url=stack.endpoint, api_key="unused") as client:
        client.completions.create(model="qwen", prompt=prompt, max_tokens=2)
    config = yaml.safe_load((stack.state_dir / "router.yaml").read_text())
    # The stack's Redis requires its password (`tandem up` keeps it in the state dir for its user).
    password = (stack.state_dir / "auth.conf").read_text().split()[1]  # `requirepass <password>`
    pool = redis.Redis.from_url(config["kvPoolUrl"], password=password)
    try:
        keys = {k.decode() for k in pool.scan_iter(match="Qwen/Qwen2.5-7B-Instruct@*")}
    finally:
        pool.close()
    bases = {k.removesuffix("kv_bytes") for k in keys if k.endswith("kv_bytes")}
    assert bases, keys
    assert bases == {k.removesuffix("metadata") for k in keys if k.endswith("metadata")}


def test_sigterm_stops_every_child_and_frees_the_port(stack: Stack) -> None:
    children = descendants(stack.process.pid)
    assert len(children) >= 5  # redis, one prefill, two decode engines, the gateway
    port = int(stack.endpoint.split(":")[2].split("/")[0])
    stack.process.send_signal(signal.SIGTERM)
    assert stack.process.wait(timeout=60) == 0
    leftovers = {pid for pid in children if alive(pid)}
    assert leftovers == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
