"""The composition root of one simulated engine: `create_app(settings) -> FastAPI`.

`create_app` builds what lives as long as the app (settings, the Prometheus registry and metrics, the
clock, the random source); the lifespan builds what lives as long as one run (the engine core and its
loop task, the Redis client, the KV-event publisher) and tears it down, so an app can be served,
stopped and served again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.requests import Request

from tandem.core.tasks import stop_tasks
from tandem.kvpool.client import password_from_env, pool_key_from_env
from tandem.sim import generate, lora_routes, routes
from tandem.sim.engine.blocks import KVEvent, KVEventSink
from tandem.sim.engine.clock import Clock, ScaledClock
from tandem.sim.engine.core import EngineCore
from tandem.sim.engine.loop import EngineDead, EngineLoop
from tandem.sim.kvevents_publisher import KVEventPublisher
from tandem.sim.kvpool import KVPool, connect
from tandem.sim.lora import AdapterRegistry, LoRAEnv, LoRAError
from tandem.sim.metrics import SimMetrics
from tandem.sim.middleware import ApiKeyMiddleware, RequestContextMiddleware
from tandem.sim.protocol import APIError
from tandem.sim.settings import SimSettings
from tandem.sim.state import Runtime, SimApp
from tandem.sim.tracing import SimTracer

logger = logging.getLogger("tandem.sim")


def create_app(
    settings: SimSettings,
    *,
    clock: Clock | None = None,
    kv_events: KVEventSink | None = None,
    registry: CollectorRegistry | None = None,
    environ: Mapping[str, str] | None = None,
) -> FastAPI:
    """A simulated vLLM engine as an ASGI app.

    `clock` defaults to `ScaledClock(settings.time_scale)` (pass a `VirtualClock` to run as fast as
    possible); `kv_events` receives the block pool's stored/removed events (in addition to the ZMQ
    publisher that `settings.kv_events_endpoint` turns on); `registry` defaults to a fresh one owned
    by the app; `environ` (default `os.environ`) holds vLLM's LoRA variables (`lora.LoRAEnv`).
    Raises ValueError, as vLLM fails to start, for a `--lora-modules` adapter that does not load or a
    resolver directory that is not one.
    """
    lora = settings.lora_config()
    lora_env = LoRAEnv.from_environ(os.environ if environ is None else environ)
    metrics = SimMetrics(
        registry or CollectorRegistry(),
        model_name=settings.served_model_name,
        block_size=settings.block_size,
        num_gpu_blocks=settings.total_gpu_blocks,
        max_loras=lora.max_loras if lora is not None else None,
    )
    state = SimApp(
        settings=settings,
        metrics=metrics,
        clock=clock or ScaledClock(settings.time_scale),
        rng=random.Random(settings.seed),
        adapters=_static_adapters(settings),
        lora_env=lora_env,
        kv_events=kv_events,
        tracer=(
            SimTracer(
                settings.otlp_traces_endpoint,
                environ=os.environ if environ is None else environ,
                service=f"vllm-{settings.served_model_name}",
            )
            if settings.otlp_traces_endpoint
            else None
        ),
    )
    app = FastAPI(title="tandem sim", lifespan=_lifespan, docs_url=None, redoc_url=None)
    app.state.sim = state
    if settings.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    app.add_middleware(RequestContextMiddleware)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(EngineDead, _engine_dead)
    app.include_router(routes.router)
    app.include_router(generate.router)
    if lora_env.runtime_updating:  # vLLM attaches the LoRA routes only then
        logger.warning("LoRA dynamic loading & unloading is enabled in the API server")
        app.include_router(lora_routes.router)
    return app


def _static_adapters(settings: SimSettings) -> AdapterRegistry:
    """The adapter registry with `--lora-modules` checked and registered (vLLM's `init_static_loras`)."""
    lora = settings.lora_config()
    adapters = AdapterRegistry(
        base_model=settings.model,
        served_model=settings.served_model_name,
        max_lora_rank=lora.max_lora_rank if lora is not None else None,
        bytes_per_rank=settings.engine_profile.model.lora_bytes_per_rank,
    )
    for module in settings.lora_modules:
        try:
            adapters.load(module.name, module.path, core=None, base_model_name=module.base_model_name)
        except LoRAError as exc:
            raise ValueError(exc.message) from None
    return adapters


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: SimApp = app.state.sim
    settings = state.settings
    publisher = await _start_publisher(settings)
    sinks = [s for s in (state.kv_events, publisher.collect if publisher else None) if s is not None]
    core = EngineCore(settings.engine_config(), on_kv_event=_fan_out(sinks))
    for adapter in state.adapters.adapters():  # loaded before serving, as vLLM's static adapters
        core.add_lora(adapter.ref, charge=False)
    loop = EngineLoop(
        core, clock=state.clock, sink=state.metrics, on_step_end=publisher.flush if publisher else None
    )
    pool = None
    if settings.kv_pool is not None and settings.kv_role != "none":
        # TANDEM_KVPOOL_PASSWORD (from a Secret in a cluster) unless the URL carries a password, and
        # the pool key TANDEM_KV_POOL_KEY (keyed chunk hashes and tags) as Tandem's connector reads it.
        client = connect(settings.kv_pool, password=password_from_env(os.environ))
        layout = settings.pool_layout(key=pool_key_from_env(os.environ))
        pool = KVPool(client, layout=layout, metrics=state.metrics)
    task = asyncio.create_task(loop.run(), name="tandem-sim-engine")
    state.runtime = Runtime(loop=loop, task=task, pool=pool, kv_publisher=publisher)
    logger.info(
        "engine ready",
        extra={
            "profile": settings.profile,
            "served_model_name": settings.served_model_name,
            "num_gpu_blocks": settings.total_gpu_blocks,
            "time_scale": settings.time_scale,
            "kv_role": settings.kv_role,
            "kv_events_endpoint": publisher.endpoint if publisher else None,
        },
    )
    try:
        yield
    finally:
        runtime, state.runtime = state.runtime, None
        assert runtime is not None
        await stop_tasks([task])
        if runtime.background:
            await asyncio.gather(*runtime.background, return_exceptions=True)
        if pool is not None:
            await pool.aclose()
        if publisher is not None:
            await publisher.aclose()
        if state.tracer is not None:
            state.tracer.shutdown()


async def _start_publisher(settings: SimSettings) -> KVEventPublisher | None:
    """The KV-event publisher when `--kv-events-endpoint` is set, bound and running."""
    if settings.kv_events_endpoint is None:
        return None
    publisher = KVEventPublisher(
        endpoint=settings.kv_events_endpoint,
        replay_endpoint=settings.kv_events_replay_endpoint,
        topic=settings.kv_events_topic,
        encoding=settings.kv_events_encoding,
        buffer_steps=settings.kv_events_buffer_steps,
    )
    await publisher.start()
    return publisher


def _fan_out(sinks: list[KVEventSink]) -> KVEventSink | None:
    """One block-pool callback that feeds every sink, or None when there is none."""
    if not sinks:
        return None
    if len(sinks) == 1:
        return sinks[0]

    def emit(event: KVEvent) -> None:
        for sink in sinks:
            sink(event)

    return emit


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _engine_dead(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(APIError(500, f"engine unavailable: {exc}").body(), status_code=500)
