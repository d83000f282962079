"""Per-app state: what the HTTP handlers reach through `request.app.state.sim`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tandem.sim.engine.blocks import KVEventSink
from tandem.sim.engine.clock import Clock
from tandem.sim.engine.loop import EngineDead, EngineLoop
from tandem.sim.kvevents_publisher import KVEventPublisher
from tandem.sim.kvpool import KVPool
from tandem.sim.metrics import SimMetrics
from tandem.sim.settings import SimSettings


@dataclass
class Runtime:
    """What one serving run owns; `background` holds KV-pool writes still in flight."""

    loop: EngineLoop
    task: asyncio.Task[None]
    pool: KVPool | None
    kv_publisher: KVEventPublisher | None = None
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task


@dataclass
class SimApp:
    """The per-app state handlers reach through `request.app.state.sim`."""

    settings: SimSettings
    metrics: SimMetrics
    clock: Clock
    rng: random.Random
    kv_events: KVEventSink | None = None
    runtime: Runtime | None = None

    def running(self) -> Runtime:
        if self.runtime is None:
            raise EngineDead("the engine is not running")
        return self.runtime


def sim_state(request: Request) -> SimApp:
    state: SimApp = request.app.state.sim
    return state
