"""The local actuator: the autoscaler's `PoolTarget` for engine processes of `tandem up`.

- **Discovery** is the endpoint file the gateway follows (`LocalEndpoints`): an engine is listed once
  it answers `/health`, so the router and the autoscaler's collector see the same ready engines.
- **Scale up** starts engine processes (under the runtime's `Supervisor`, logs beside the others) on
  fresh loopback ports; each joins the file when ready. One that fails to start is stopped and
  forgotten (the next round asks again).
- **Failures**: an engine that exits on its own is removed from the file at the next round; the
  runtime does not stop for it (it was started with `watched=False`).
- **Scale down** drains: the newest engine leaves the file first (the router stops sending to it
  within its poll period), then the engine is watched until its `/metrics` show no running and no
  waiting request, or `drain_timeout_s` passes, and only then is its process stopped. Engines still
  starting are cancelled before ready ones are drained.

All methods run on the autoscaler's event loop; blocking waits go to worker threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from tandem.autoscaler.readings import parse_engine_metrics
from tandem.core.routerconfig import EndpointList, write_endpoint_file
from tandem.core.tasks import stop_tasks
from tandem.local.plan import EngineFactory
from tandem.local.supervisor import Child, ChildFailed, Supervisor

log = logging.getLogger(__name__)
EnginePool = Literal["prefill", "decode"]
#: Before reading an engine's queue, give the router time to see the file change (its poll is 0.5 s).
DRAIN_SETTLE_S = 1.5


class LocalEndpoints:
    """The endpoint file's contents, rewritten atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pools: dict[EnginePool, list[str]] = {"prefill": [], "decode": []}

    def urls(self, pool: EnginePool) -> list[str]:
        return list(self._pools[pool])

    def add(self, pool: EnginePool, url: str) -> None:
        if url not in self._pools[pool]:
            self._pools[pool].append(url)
            self._write()

    def remove(self, pool: EnginePool, url: str) -> None:
        if url in self._pools[pool]:
            self._pools[pool].remove(url)
            self._write()

    def save(self) -> None:
        """Write the file as it stands (also with no engine listed)."""
        self._write()

    def _write(self) -> None:
        write_endpoint_file(
            self.path, EndpointList(prefill=self._pools["prefill"], decode=self._pools["decode"])
        )


@dataclass(kw_only=True)
class LocalPool:
    """`tandem.autoscaler.control.PoolTarget` for one pool of local engine processes."""

    pool: EnginePool
    supervisor: Supervisor
    listed: LocalEndpoints
    new_engine: EngineFactory
    ports: Iterator[int]
    next_index: int
    startup_timeout_s: float = 120.0
    drain_timeout_s: float = 60.0
    client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(trust_env=False))
    on_change: Callable[[str], None] = lambda message: None
    ready: list[Child] = field(default_factory=list)
    #: By engine name (a `Child` is not hashable): the task bringing it up, or draining it.
    starting: dict[str, tuple[Child, asyncio.Task[None]]] = field(default_factory=dict)
    draining: dict[str, tuple[Child, asyncio.Task[None]]] = field(default_factory=dict)

    async def endpoints(self) -> list[str]:
        """The pool's engines in the endpoint file: discovery as the router sees it. An engine that
        exited on its own leaves the file (and the count) here."""
        for child in [c for c in self.ready if c.process.poll() is not None]:
            self.ready.remove(child)
            self.listed.remove(self.pool, child.plan.url)
            await asyncio.to_thread(self.supervisor.stop, child)
            self.on_change(f"{child.plan.name} exited with code {child.process.returncode}; removed")
        return self.listed.urls(self.pool)

    async def requested(self) -> int:
        return len(self.ready) + len(self.starting)

    async def scale(self, replicas: int, *, reason: str) -> None:
        while len(self.ready) + len(self.starting) < replicas:
            self._start_one(reason)
        while len(self.ready) + len(self.starting) > replicas:
            if self.starting:
                _, (child, task) = self.starting.popitem()
                task.cancel()
                await asyncio.to_thread(self.supervisor.stop, child)
                self.on_change(f"{child.plan.name} cancelled while starting ({reason})")
            else:
                self._drain_one(reason)

    def adopt(self, child: Child) -> None:
        """Take over an engine the runtime started before the autoscaler (already ready)."""
        self.ready.append(child)
        self.listed.add(self.pool, child.plan.url)

    async def close(self) -> None:
        """Cancel pending starts and drains (the runtime then stops every process)."""
        await stop_tasks(task for _, task in (*self.starting.values(), *self.draining.values()))
        await self.client.aclose()

    def _start_one(self, reason: str) -> None:
        index, self.next_index = self.next_index, self.next_index + 1
        plan = self.new_engine(self.pool, index, next(self.ports))
        child = self.supervisor.start(plan, watched=False)
        self.on_change(f"{plan.name} starting at {plan.url} ({reason})")
        task = asyncio.create_task(self._bring_up(child), name=f"start-{plan.name}")
        self.starting[plan.name] = (child, task)

    async def _bring_up(self, child: Child) -> None:
        try:
            took = await asyncio.to_thread(self.supervisor.wait_ready, child, timeout=self.startup_timeout_s)
        except ChildFailed as exc:
            self.starting.pop(child.plan.name, None)
            await asyncio.to_thread(self.supervisor.stop, child)
            log.warning("engine failed to start", extra={"engine": child.plan.name, "error": str(exc)})
            self.on_change(f"{child.plan.name} failed to start")
            return
        self.starting.pop(child.plan.name, None)
        self.ready.append(child)
        self.listed.add(self.pool, child.plan.url)
        self.on_change(f"{child.plan.name} ready in {took:.1f}s, in rotation")

    def _drain_one(self, reason: str) -> None:
        child = self.ready.pop()  # newest first
        self.listed.remove(self.pool, child.plan.url)
        self.on_change(f"{child.plan.name} draining ({reason})")
        task = asyncio.create_task(self._drain(child), name=f"drain-{child.plan.name}")
        self.draining[child.plan.name] = (child, task)

    async def _drain(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout_s
        await asyncio.sleep(DRAIN_SETTLE_S)
        idle = False
        while loop.time() < deadline:
            idle = await self._idle(child.plan.url)
            if idle:
                break
            await asyncio.sleep(0.25)
        code = await asyncio.to_thread(self.supervisor.stop, child)
        self.draining.pop(child.plan.name, None)
        how = "drained" if idle else f"drain timed out after {self.drain_timeout_s:g}s"
        self.on_change(f"{child.plan.name} {how}, stopped (exit {code})")

    async def _idle(self, url: str) -> bool:
        """True when the engine reports no running and no waiting request."""
        try:
            response = await self.client.get(f"{url}/metrics", timeout=2.0)
            response.raise_for_status()
            reading = parse_engine_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return False
        return (reading.running or 0.0) == 0.0 and (reading.waiting or 0.0) == 0.0
