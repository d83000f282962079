"""The composition root of one simulated engine: `create_app(settings) -> FastAPI`.

`create_app` builds what lives as long as the app (settings, the Prometheus registry and metrics, the
clock, the random source); the lifespan builds what lives as long as one run (the engine core and its
loop task, the Redis client) and tears it down, so an app can be served, stopped and served again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.requests import Request

from tandem.sim import generate, routes
from tandem.sim.engine.blocks import KVEventSink
from tandem.sim.engine.clock import Clock, ScaledClock
from tandem.sim.engine.core import EngineCore
from tandem.sim.engine.loop import EngineDead, EngineLoop
from tandem.sim.kvpool import KVPool, connect
from tandem.sim.metrics import SimMetrics
from tandem.sim.middleware import RequestContextMiddleware
from tandem.sim.protocol import APIError
from tandem.sim.settings import SimSettings
from tandem.sim.state import Runtime, SimApp

logger = logging.getLogger("tandem.sim")


def create_app(
    settings: SimSettings,
    *,
    clock: Clock | None = None,
    kv_events: KVEventSink | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """A simulated vLLM engine as an ASGI app.

    `clock` defaults to `ScaledClock(settings.time_scale)` (pass a `VirtualClock` to run as fast as
    possible); `kv_events` receives the block pool's stored/removed events; `registry` defaults to a
    fresh one owned by the app.
    """
    metrics = SimMetrics(
        registry or CollectorRegistry(),
        model_name=settings.served_model_name,
        block_size=settings.block_size,
        num_gpu_blocks=settings.total_gpu_blocks,
    )
    state = SimApp(
        settings=settings,
        metrics=metrics,
        clock=clock or ScaledClock(settings.time_scale),
        rng=random.Random(settings.seed),
        kv_events=kv_events,
    )
    app = FastAPI(title="tandem sim", lifespan=_lifespan, docs_url=None, redoc_url=None)
    app.state.sim = state
    app.add_middleware(RequestContextMiddleware)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(EngineDead, _engine_dead)
    app.include_router(routes.router)
    app.include_router(generate.router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: SimApp = app.state.sim
    settings = state.settings
    core = EngineCore(settings.engine_config(), on_kv_event=state.kv_events)
    loop = EngineLoop(core, clock=state.clock, sink=state.metrics)
    pool = None
    if settings.kv_pool is not None and settings.kv_role != "none":
        pool = KVPool(connect(settings.kv_pool), layout=settings.pool_layout(), metrics=state.metrics)
    task = asyncio.create_task(loop.run(), name="tandem-sim-engine")
    state.runtime = Runtime(loop=loop, task=task, pool=pool)
    logger.info(
        "engine ready",
        extra={
            "profile": settings.profile,
            "served_model_name": settings.served_model_name,
            "num_gpu_blocks": settings.total_gpu_blocks,
            "time_scale": settings.time_scale,
            "kv_role": settings.kv_role,
        },
    )
    try:
        yield
    finally:
        runtime, state.runtime = state.runtime, None
        assert runtime is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if runtime.background:
            await asyncio.gather(*runtime.background, return_exceptions=True)
        if pool is not None:
            await pool.aclose()


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _engine_dead(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(APIError(500, f"engine unavailable: {exc}").body(), status_code=500)
