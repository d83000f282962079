"""The engine's non-generating endpoints, in vLLM's shapes: models, tokenize, detokenize, health,
version and Prometheus metrics."""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request

from tandem.core.tokenizer import TokenizerError, decode, encode, render_chat
from tandem.sim.protocol import (
    APIError,
    DetokenizeRequest,
    TokenizeRequest,
    check_model,
    parse_json,
    validate,
)
from tandem.sim.state import sim_state

router = APIRouter()


def _version() -> str:
    try:
        return importlib.metadata.version("tandem")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the engine loop runs (empty body, as vLLM); 500 once it has failed."""
    runtime = sim_state(request).running()
    if runtime.task.done():
        raise APIError(500, "the engine loop has stopped")
    return Response(status_code=200)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": _version(), "engine": "tandem-sim"}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(sim_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    settings = sim_state(request).settings
    card = {
        "id": settings.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": settings.model,
        "parent": None,
        "max_model_len": settings.max_model_len,
    }
    return {"object": "list", "data": [card]}


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    """`{prompt}` or `{messages}` → `{count, max_model_len, tokens}`."""
    settings = sim_state(request).settings
    body = validate(TokenizeRequest, parse_json(await request.body()))
    check_model(body.model, served=settings.served_model_name)
    if body.messages is not None:
        text = render_chat(body.messages, add_generation_prompt=body.add_generation_prompt)
    elif body.prompt is not None:
        text = body.prompt
    else:
        raise APIError(400, "send either prompt or messages", param="prompt")
    tokens = encode(text)
    return JSONResponse(
        {"count": len(tokens), "max_model_len": settings.max_model_len, "tokens": tokens, "token_strs": None}
    )


@router.post("/detokenize")
async def detokenize(request: Request) -> JSONResponse:
    """`{tokens}` → `{prompt}`; an id no text encodes to is a 400."""
    settings = sim_state(request).settings
    body = validate(DetokenizeRequest, parse_json(await request.body()))
    check_model(body.model, served=settings.served_model_name)
    try:
        text = decode(body.tokens)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="tokens") from None
    return JSONResponse({"prompt": text})
