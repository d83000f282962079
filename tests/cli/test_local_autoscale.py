"""The local actuator with real processes: scale up starts a simulated engine and lists it in the
endpoint file (where the router's file discovery finds it); scale down drains it (out of the file
first, stopped only once its running request finished) and leaves no process behind.

Real: `tandem sim` processes started by the runtime's `Supervisor`, the endpoint file, the router's
`FileEndpoints` reading it, HTTP on 127.0.0.1. Nothing is faked; waits poll with generous deadlines.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Literal

import httpx
import pytest

from tandem.core.routerconfig import FileDiscovery
from tandem.local.autoscale import LocalEndpoints, LocalPool
from tandem.local.plan import ProcessPlan
from tandem.local.ports import free_ports
from tandem.local.supervisor import Supervisor
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.discovery.sources import FileEndpoints

DEADLINE_S = 180.0


def sim_engine(role: Literal["prefill", "decode"], index: int, port: int) -> ProcessPlan:
    argv = (sys.executable, "-m", "tandem.cli", "sim", "--model", "Qwen/Qwen2.5-7B-Instruct",
            "--served-model-name", "qwen", "--host", "127.0.0.1", "--port", str(port))  # fmt: skip
    return ProcessPlan(name=f"{role}-{index}", role=role, argv=argv, port=port, probe="http")


async def until(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[LocalPool]:
    supervisor = Supervisor(log_dir=tmp_path / "logs")
    target = LocalPool(
        pool="decode",
        supervisor=supervisor,
        listed=LocalEndpoints(tmp_path / "endpoints.json"),
        new_engine=sim_engine,
        ports=free_ports(),
        next_index=0,
        startup_timeout_s=DEADLINE_S,
        drain_timeout_s=DEADLINE_S,
    )
    try:
        yield target
    finally:
        await target.close()
        supervisor.stop_all()


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_scale_up_lists_a_ready_engine_and_scale_down_drains_and_stops_it(pool: LocalPool) -> None:
    await pool.scale(1, reason="test: up")
    assert await pool.requested() == 1 and await pool.endpoints() == []  # starting, not listed yet
    await until(lambda: len(pool.ready) == 1, "the engine is ready")
    (url,) = await pool.endpoints()
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    router_side = FileEndpoints(FileDiscovery(path=str(pool.listed.path)))
    assert router_side.reload(registry) and [e.url for e in registry.endpoints("decode")] == [url]

    child = pool.ready[0]
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=DEADLINE_S) as client:
        body = {"model": "qwen", "prompt": "hello", "max_tokens": 300, "ignore_eos": True}
        request = asyncio.create_task(client.post("/v1/completions", json=body))
        await until(lambda: child.process.poll() is None and _running(url) > 0, "the request runs")
        await pool.scale(0, reason="test: down")
        assert await pool.endpoints() == [] and await pool.requested() == 0
        assert router_side.reload(registry) and registry.endpoints("decode") == ()
        assert child.process.poll() is None  # still serving its request while draining
        answer = await request
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 300
    await until(lambda: not pool.draining, "the drain ends")
    assert child.process.poll() is not None and gone(child.process.pid)
    assert pool.supervisor.children == []


async def test_an_engine_that_exits_on_its_own_leaves_the_file(pool: LocalPool) -> None:
    await pool.scale(1, reason="test: up")
    await until(lambda: len(pool.ready) == 1, "the engine is ready")
    child = pool.ready[0]
    child.process.kill()
    child.process.wait()
    assert await pool.endpoints() == [] and await pool.requested() == 0


def _running(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
