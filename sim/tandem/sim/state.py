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
from tandem.sim.engine.lora import LoRARef
from tandem.sim.kvevents_publisher import KVEventPublisher
from tandem.sim.kvpool import KVPool
from tandem.sim.lora import AdapterRegistry, LoRAEnv, LoRAError
from tandem.sim.metrics import SimMetrics
from tandem.sim.protocol import APIError, unknown_model
from tandem.sim.settings import SimSettings
from tandem.sim.tracing import SimTracer


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
    """The per-app state handlers reach through `request.app.state.sim`. `adapters` are the LoRA
    adapters served (they outlive a serving run, as the app's settings do)."""

    settings: SimSettings
    metrics: SimMetrics
    clock: Clock
    rng: random.Random
    adapters: AdapterRegistry
    lora_env: LoRAEnv = field(default_factory=LoRAEnv)
    kv_events: KVEventSink | None = None
    runtime: Runtime | None = None
    #: vLLM's request spans (`--otlp-traces-endpoint`), None when off.
    tracer: SimTracer | None = None

    def running(self) -> Runtime:
        if self.runtime is None:
            raise EngineDead("the engine is not running")
        return self.runtime

    def resolve_model(self, requested: str | None) -> LoRARef | None:
        """The adapter a request's `model` names, None for the base model (or no model), else vLLM's
        404. An unknown name goes to the filesystem resolver first when runtime updating is on, as
        vLLM's `_check_model` does (a found adapter that does not load is its 400)."""
        if not requested or requested == self.settings.served_model_name:
            return None
        ref = self.adapters.get(requested)
        if ref is None and self.lora_env.runtime_updating:
            core = self.running().loop.core
            try:
                ref = self.adapters.resolve(requested, resolver_dir=self.lora_env.resolver_dir, core=core)
            except LoRAError as exc:
                raise APIError(exc.status, exc.message) from None
        if ref is None:
            raise unknown_model(requested)
        return ref


def sim_state(request: Request) -> SimApp:
    state: SimApp = request.app.state.sim
    return state
