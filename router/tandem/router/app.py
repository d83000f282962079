"""The composition root: `create_app(config)` returns the gateway as a FastAPI app.

Everything with a lifetime (the HTTP client, discovery, the registry, metrics, the gateway) is
built in the lifespan and handed to requests as lifespan state (`request.state.runtime`); nothing
lives at module level, so two apps in one process share nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from tandem.core.openai_api import error_body
from tandem.core.routerconfig import RouterConfig
from tandem.router.admission.access import load_key_file
from tandem.router.admission.policy import TTFTPredictor
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.sources import Discovery, discovery_for
from tandem.router.errors import RouterError
from tandem.router.http.middleware import RequestContextMiddleware
from tandem.router.http.openapi import openapi_builder
from tandem.router.http.routes import router
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.observe.report import RequestReport
from tandem.router.request.parse import served_names
from tandem.router.runtime import Runtime, build_runtime
from tandem.router.settings import ProxySettings, RouterSettings

log = logging.getLogger("tandem.router")


def create_app(
    config: RouterConfig,
    *,
    settings: RouterSettings | None = None,
    client: httpx.AsyncClient | None = None,
    clock: Callable[[], float] = time.monotonic,
    predictor: TTFTPredictor | None = None,
    prefix: PrefixSource | None = None,
    discovery: Discovery | None = None,
) -> FastAPI:
    """The gateway for `config`.

    `client`: the upstream HTTP client; when given, the caller owns (and closes) it, else the app
    creates one in its lifespan. `clock`: monotonic seconds for durations, cool-downs and queue
    deadlines. `predictor`: TTFT predictions for early rejection (default: none, never rejects
    early). `prefix`: decode endpoints' prefix caches for the P/D decision (default: unknown).
    `discovery`: replaces the one `config.discovery` names (tests).
    Raises `ConfigurationError` at once for a configuration this build cannot serve.
    """
    settings = settings or RouterSettings()
    key_file = load_key_file(config, settings)
    lifespan = _lifespan(
        config=config,
        settings=settings,
        key_file=key_file,
        discovery=discovery
        or discovery_for(
            config.discovery, environ=os.environ, kube_api_server=settings.discovery.kube_api_server
        ),
        client=client,
        clock=clock,
        predictor=predictor,
        prefix=prefix,
    )
    app = FastAPI(
        title="Tandem router",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.add_middleware(RequestContextMiddleware, clock=clock, metrics_for=_metrics_for)
    app.add_exception_handler(RouterError, _router_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.include_router(router)
    app.openapi = openapi_builder(  # type: ignore[method-assign]
        app, served=served_names(config.spec.model), auth=key_file is not None
    )
    return app


def _lifespan(
    *,
    config: RouterConfig,
    settings: RouterSettings,
    key_file: KeyFile | None,
    discovery: Discovery,
    client: httpx.AsyncClient | None,
    clock: Callable[[], float],
    predictor: TTFTPredictor | None,
    prefix: PrefixSource | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]]:
    """Builds the runtime at start-up (discovery filled before the first request) and tears down
    in reverse order at shutdown: discovery stopped, then the client the app created closed."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            http, scrapes = client, client
            if http is None:
                http = await stack.enter_async_context(default_client(settings.proxy))
                scrapes = await stack.enter_async_context(scrape_client())
            runtime = build_runtime(
                config=config,
                settings=settings,
                client=http,
                scrape_client=scrapes,
                clock=clock,
                predictor=predictor,
                prefix=prefix,
                key_file=key_file,
            )
            await runtime.loop_lag.start()
            stack.push_async_callback(runtime.loop_lag.stop)
            if key_file is not None:
                await key_file.start()  # follows Secret updates
                stack.push_async_callback(key_file.stop)
            if runtime.kv_pool is not None:
                stack.push_async_callback(runtime.kv_pool.aclose)
            await discovery.start(runtime.registry)
            stack.push_async_callback(discovery.stop)
            await runtime.routing.start()  # the metrics collector (and KV-event subscribers)
            stack.push_async_callback(runtime.routing.stop)
            log.info(
                "router ready",
                extra={
                    "service": config.service,
                    "model": config.spec.model.public_name,
                    "disaggregation": config.spec.disaggregation.mode,
                    "decode": [e.name for e in runtime.registry.endpoints("decode")],
                    "prefill": [e.name for e in runtime.registry.endpoints("prefill")],
                },
            )
            yield {"runtime": runtime}

    return lifespan


def default_client(settings: ProxySettings) -> httpx.AsyncClient:
    """The upstream client the app makes when none is injected: no proxies from the environment,
    no pool cap below what long streams need, and idle connections dropped after 2 s: engines (vLLM's
    and the simulator's uvicorn) close idle keep-alive connections after 5 s, and a connection reused
    just as the engine closes it breaks before any answer with nothing to retry on a one-engine pool."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(settings.read_timeout_seconds, connect=settings.connect_timeout_seconds),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0),
        trust_env=False,
    )


def scrape_client() -> httpx.AsyncClient:
    """The engines' `/metrics` are read through a client of their own: httpcore scans every
    connection of a pool whenever a request starts or ends, and the upstream pool holds one per open
    stream (1,000 in the soak), which made each of the collector's scrapes cost as much as a request.
    Timeouts are the collector's own (`CollectorSettings`)."""
    return httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=64), trust_env=False)


def _metrics_for(scope: Scope) -> RouterMetrics | None:
    runtime = scope.get("state", {}).get("runtime")
    return runtime.metrics if isinstance(runtime, Runtime) else None


def _note_error(request: Request, message: str) -> None:
    report = getattr(request.state, "report", None)
    if isinstance(report, RequestReport):
        report.error = message


async def _router_error(request: Request, exc: Exception) -> JSONResponse:
    """Every `RouterError` as OpenAI's JSON error with the error's status."""
    if not isinstance(exc, RouterError):  # registered for RouterError only
        raise exc
    _note_error(request, exc.message)
    body = error_body(exc.status, exc.message, param=exc.param)
    if exc.openai_type is not None:
        body["error"]["type"] = exc.openai_type
    if exc.openai_code is not None:
        body["error"]["code"] = exc.openai_code
    return JSONResponse(body, status_code=exc.status, headers=exc.response_headers())


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Routing errors (unknown path 404, wrong method 405) in the same shape."""
    if not isinstance(exc, StarletteHTTPException):
        raise exc
    return JSONResponse(
        error_body(exc.status_code, str(exc.detail)),
        status_code=exc.status_code,
        headers=dict(exc.headers or {}),
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Top-level boundary: a bug must still answer in OpenAI's shape and leave a traceback.
    log.error("unexpected error", exc_info=exc)
    _note_error(request, f"internal error: {type(exc).__name__}")
    return JSONResponse(error_body(500, "internal router error"), status_code=500)
