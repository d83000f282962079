"""The side routes: `GET /v1/models`, `/health`, `/metrics` and `/openapi.json`, a FastAPI app that
also runs the gateway's lifespan and answers every path the gateway shell does not take (unknown
paths 404, wrong methods 405, in OpenAI's error shape).

Handlers read what they need from `Operations`, built by the composition root and found in the
lifespan state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope

from tandem.core.openai_api import error_body
from tandem.core.spec import ModelSpec
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import RouterError
from tandem.router.http.catalog import Listed, list_many, list_models
from tandem.router.http.middleware import SideRouteMiddleware
from tandem.router.http.openapi import openapi_builder
from tandem.router.identity.headers import TenantResolver
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.types import POOLS, Endpoint
from tandem.router.upstream.client import HTTPUpstream
from tandem.router.workers.bus import Bus

log = logging.getLogger("tandem.router")


@dataclass(frozen=True, slots=True, kw_only=True)
class Operations:
    """What the side routes read: the engines, the tenant check, the metrics, the model."""

    registry: EndpointRegistry
    upstream: HTTPUpstream
    prometheus: CollectorRegistry
    metrics: RouterMetrics
    tenants: TenantResolver
    bus: Bus
    model: ModelSpec
    started_unix: int
    models_timeout_s: float
    #: The model's LoRA adapters the gateway accepts now (`/v1/models` lists them under the model).
    adapters: ServiceAdapters | None = None
    #: The decode pool may be at zero by design (autoscaling from min 0) and the gateway holds
    #: requests meanwhile (`spec.router.coldStart.maxHeldRequests` > 0): an empty pool is ready.
    scales_from_zero: bool = False
    #: Why the service is not ready yet while its declared adapters load at start-up (None: it is).
    warming: Callable[[], str | None] | None = None
    #: In front of many services: each one's model and engines, and the aliases (then `registry`,
    #: `model` and `scales_from_zero` are unused).
    many: ManyModels | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServedModel:
    """One service of a gateway in front of many, as `/v1/models` and `/health` see it."""

    model: ModelSpec
    registry: EndpointRegistry
    upstream: HTTPUpstream
    scales_from_zero: bool
    adapters: ServiceAdapters | None = None
    warming: Callable[[], str | None] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ManyModels:
    """The services (in order) and the aliases (alias → its targets' served names)."""

    services: Sequence[ServedModel]
    aliases: Mapping[str, Sequence[str]]


router = APIRouter()


async def get_operations(request: Request) -> Operations:
    operations = getattr(request.state, "operations", None)
    if not isinstance(operations, Operations):
        raise RuntimeError("the router's lifespan has not run (serve the app with lifespan on)")
    return operations


OperationsDep = Annotated[Operations, Depends(get_operations)]


@router.get("/v1/models")
async def models(request: Request, ops: OperationsDep) -> JSONResponse:
    ops.tenants.tenant(request.headers)  # 401 without a valid key when auth is on
    if ops.many is not None:
        listed = [
            Listed(
                model=s.model,
                upstream=s.upstream,
                endpoints=_endpoints(s.registry),
                adapters=_ordered(s.adapters),
            )
            for s in ops.many.services
        ]
        return JSONResponse(
            await list_many(
                services=listed,
                aliases=ops.many.aliases,
                created=ops.started_unix,
                timeout_s=ops.models_timeout_s,
            )
        )
    endpoints = _endpoints(ops.registry)()
    listing = await list_models(
        upstream=ops.upstream,
        endpoints=endpoints,
        model=ops.model,
        created=ops.started_unix,
        timeout_s=ops.models_timeout_s,
        adapters=_ordered(ops.adapters),
    )
    return JSONResponse(listing)


def _ordered(adapters: ServiceAdapters | None) -> tuple[str, ...]:
    """The adapters served now, in order."""
    return () if adapters is None else adapters.ordered


def _endpoints(registry: EndpointRegistry) -> Callable[[], list[Endpoint]]:
    """The engines in rotation, decode first, as `/v1/models` asks them."""
    return lambda: [s.endpoint for pool in ("decode", "prefill") for s in registry.candidates(pool)]


@router.get("/health")
async def health(ops: OperationsDep) -> JSONResponse:
    """200 while at least one decode endpoint is in rotation, or while a decode pool that scales
    from zero has no member (`cold_start`: the gateway holds requests until its first engine is
    ready, so it must stay in its Service); else 503 with the reason. 503 `warming` too while the
    declared adapters load onto the engines at start-up (`AdapterWarmer.warming`). In front of many
    services: 200 while any service is ready so (the others' 404s or 503s are theirs), each one's
    state under `models`."""
    if ops.many is None:
        status, answer = pool_health(ops.registry, scales_from_zero=ops.scales_from_zero, warming=ops.warming)
        return JSONResponse(answer, status_code=status)
    states = {
        s.model.public_name: pool_health(s.registry, scales_from_zero=s.scales_from_zero, warming=s.warming)
        for s in ops.many.services
    }
    ready = any(status == 200 for status, _ in states.values())
    answer = {"status": "ok" if ready else "unavailable", "models": {m: a for m, (_, a) in states.items()}}
    return JSONResponse(answer, status_code=200 if ready else 503)


def pool_health(
    registry: EndpointRegistry,
    *,
    scales_from_zero: bool,
    warming: Callable[[], str | None] | None = None,
) -> tuple[int, dict[str, Any]]:
    """One service's health: its status code and answer (`health`)."""
    pools = {
        pool: {
            "endpoints": len(snaps := registry.snapshots(pool)),
            "in_rotation": sum(s.in_rotation for s in snaps),
        }
        for pool in POOLS
    }
    decode = pools["decode"]
    if decode["in_rotation"]:
        why = warming() if warming is not None else None
        if why is not None:
            return 503, {"status": "warming", "reason": why, "pools": pools}
        return 200, {"status": "ok", "pools": pools}
    if not decode["endpoints"] and scales_from_zero:
        reason = "no decode engine yet (scaled to zero): requests are held until the first is ready"
        return 200, {"status": "cold_start", "reason": reason, "pools": pools}
    reason = (
        "no decode endpoint known"
        if not decode["endpoints"]
        else f"no decode endpoint in rotation (all {decode['endpoints']} cooling down after failures)"
    )
    return 503, {"status": "unavailable", "reason": reason, "pools": pools}


@router.get("/metrics")
async def metrics(ops: OperationsDep) -> Response:
    """This process's metrics; with several workers, every worker's, labelled `worker`."""
    text = await ops.bus.gather(lambda: generate_latest(ops.prometheus))
    return Response(text, media_type=CONTENT_TYPE_LATEST)


def side_app(
    *,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[dict[str, Any]]],
    served: frozenset[str],
    auth: bool,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The FastAPI app of the side routes, running `lifespan`."""
    app = FastAPI(title="Tandem router", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(SideRouteMiddleware, clock=clock, metrics_for=_metrics_for)
    app.add_exception_handler(RouterError, _router_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.include_router(router)
    app.openapi = openapi_builder(app, served=served, auth=auth)  # type: ignore[method-assign]
    return app


def _metrics_for(scope: Scope) -> RouterMetrics | None:
    operations = scope.get("state", {}).get("operations")
    return operations.metrics if isinstance(operations, Operations) else None


async def _router_error(request: Request, exc: Exception) -> JSONResponse:
    """Every `RouterError` as OpenAI's JSON error with the error's status."""
    if not isinstance(exc, RouterError):  # registered for RouterError only
        raise exc
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
    return JSONResponse(error_body(500, "internal router error"), status_code=500)
