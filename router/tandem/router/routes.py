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

from tandem.router.admission.headers import priority_from_headers, slo_from_headers
from tandem.router.catalog import list_models
from tandem.router.disconnect import until_disconnected
from tandem.router.errors import ClientDisconnected
from tandem.router.parsing import check_model, parse_json_object, validate_generation
from tandem.router.report import RequestReport
from tandem.router.runtime import Runtime
from tandem.router.types import POOLS, RequestView, Route
from tandem.router.usage import prompt_token_ids

router = APIRouter()


def get_runtime(request: Request) -> Runtime:
    runtime = getattr(request.state, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise RuntimeError("the router's lifespan has not run (serve the app with lifespan on)")
    return runtime


def get_report(request: Request) -> RequestReport:
    report = getattr(request.state, "report", None)
    if not isinstance(report, RequestReport):
        raise RuntimeError("RequestContextMiddleware is missing from the app")
    return report


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ReportDep = Annotated[RequestReport, Depends(get_report)]


@router.post("/v1/completions")
async def completions(request: Request, runtime: RuntimeDep, report: ReportDep) -> Response:
    return await _generate(Route.COMPLETIONS, request=request, runtime=runtime, report=report)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, runtime: RuntimeDep, report: ReportDep) -> Response:
    return await _generate(Route.CHAT, request=request, runtime=runtime, report=report)


async def _generate(route: Route, *, request: Request, runtime: Runtime, report: RequestReport) -> Response:
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientDisconnected("client disconnected while sending the request") from None
    body = parse_json_object(raw)
    validated = validate_generation(route, body)
    report.model, report.stream = validated.model, validated.stream
    check_model(validated.model, accepted=runtime.accepted_models)
    report.tenant = runtime.tenants.tenant(request.headers)
    view = RequestView(
        request_id=report.request_id,
        route=route,
        model=validated.model,
        tenant=report.tenant,
        stream=validated.stream,
        body=body,
        prompt_token_ids=prompt_token_ids(validated),
        priority=priority_from_headers(request.headers),
        slo=slo_from_headers(request.headers, default=runtime.default_slo),
    )
    return await until_disconnected(request.receive, runtime.gateway.generate(view, report=report))


@router.get("/v1/models")
async def models(runtime: RuntimeDep) -> JSONResponse:
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
