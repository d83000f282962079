"""The HTTP surface: OpenAI generation routes, `/v1/models`, `/health`, `/metrics`.

Handlers only parse, call the gateway or a reader, and render; everything they need comes from
the `Runtime` built in the app's lifespan.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from tandem.router.errors import ClientDisconnected, RequestTooLarge
from tandem.router.http.catalog import list_models
from tandem.router.http.disconnect import until_disconnected
from tandem.router.identity.headers import priority_from_headers, slo_from_headers
from tandem.router.observe.report import RequestReport
from tandem.router.request.parse import check_model, parse_json_object, prompt_text, validate_generation
from tandem.router.runtime import Runtime
from tandem.router.types import POOLS, RequestView, Route
from tandem.router.upstream.usage import prompt_token_ids

router = APIRouter()

# The dependencies below are `async def` on purpose: FastAPI runs a plain `def` dependency in a worker
# thread, three thread hops per request for what are attribute and dict look-ups.


async def get_runtime(request: Request) -> Runtime:
    runtime = getattr(request.state, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the router's lifespan has not run (serve the app with lifespan on)")
    return runtime


async def get_report(request: Request) -> RequestReport:
    report = getattr(request.state, "report", None)
    if not isinstance(report, RequestReport):
        raise RuntimeError("RequestContextMiddleware is missing from the app")
    return report


async def get_tenant(request: Request, runtime: Annotated[Runtime, Depends(get_runtime)]) -> str:
    """The caller's tenant: from its API key when auth is on (401 without a valid one, before the
    body is read), else from the tenant header."""
    tenant = runtime.tenants.tenant(request.headers)
    report = getattr(request.state, "report", None)
    if isinstance(report, RequestReport):
        report.tenant = tenant
    return tenant


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ReportDep = Annotated[RequestReport, Depends(get_report)]
TenantDep = Annotated[str, Depends(get_tenant)]


@router.post("/v1/completions")
async def completions(
    request: Request, runtime: RuntimeDep, report: ReportDep, tenant: TenantDep
) -> Response:
    return await _generate(Route.COMPLETIONS, request=request, runtime=runtime, report=report, tenant=tenant)


@router.post("/v1/chat/completions")
async def chat_completions(
    request: Request, runtime: RuntimeDep, report: ReportDep, tenant: TenantDep
) -> Response:
    return await _generate(Route.CHAT, request=request, runtime=runtime, report=report, tenant=tenant)


async def read_body(request: Request, *, limit: int) -> bytes:
    """The request body, refused with 413 once it is longer than `limit` bytes (before reading it
    all when `content-length` says so)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected("client disconnected while sending the request") from None
    return b"".join(chunks)


async def _generate(
    route: Route, *, request: Request, runtime: Runtime, report: RequestReport, tenant: str
) -> Response:
    raw = await read_body(request, limit=runtime.settings.access.max_request_bytes)
    body = parse_json_object(raw)
    validated = validate_generation(route, body)
    report.model, report.stream = validated.model, validated.stream
    check_model(validated.model, accepted=runtime.accepted_models)
    prompt_ids = prompt_token_ids(validated)
    if runtime.log_prompts:
        report.prompt = prompt_text(body)
    runtime.access.admit(tenant, prompt_tokens=len(prompt_ids))  # 429 over a rate limit
    view = RequestView(
        request_id=report.request_id,
        route=route,
        model=validated.model,
        tenant=tenant,
        stream=validated.stream,
        body=body,
        prompt_token_ids=prompt_ids,
        priority=priority_from_headers(request.headers),
        slo=slo_from_headers(request.headers, default=runtime.default_slo),
    )
    return await until_disconnected(request.receive, runtime.gateway.generate(view, report=report))


@router.get("/v1/models")
async def models(runtime: RuntimeDep, tenant: TenantDep) -> JSONResponse:
    registry = runtime.registry
    endpoints = [s.endpoint for pool in ("decode", "prefill") for s in registry.candidates(pool)]
    listing = await list_models(
        upstream=runtime.upstream,
        endpoints=endpoints,
        model=runtime.config.spec.model,
        created=runtime.started_unix,
        timeout_s=runtime.settings.proxy.models_timeout_seconds,
    )
    return JSONResponse(listing)


@router.get("/health")
async def health(runtime: RuntimeDep) -> JSONResponse:
    """200 while at least one decode endpoint is in rotation, else 503 with the reason."""
    pools = {
        pool: {
            "endpoints": len(snaps := runtime.registry.snapshots(pool)),
            "in_rotation": sum(s.in_rotation for s in snaps),
        }
        for pool in POOLS
    }
    decode = pools["decode"]
    if decode["in_rotation"]:
        return JSONResponse({"status": "ok", "pools": pools})
    reason = (
        "no decode endpoint known"
        if not decode["endpoints"]
        else f"no decode endpoint in rotation (all {decode['endpoints']} cooling down after failures)"
    )
    return JSONResponse({"status": "unavailable", "reason": reason, "pools": pools}, status_code=503)


@router.get("/metrics")
async def metrics(runtime: RuntimeDep) -> Response:
    return Response(generate_latest(runtime.prometheus), media_type=CONTENT_TYPE_LATEST)
