"""The engine's non-generating endpoints, in vLLM's shapes: models, tokenize, detokenize, the render
routes, health, version and Prometheus metrics."""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request

from tandem.core.logs import REQUEST_ID
from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest
from tandem.core.tokenizer import TokenizerError, decode, encode, render_chat
from tandem.sim.middleware import log_fields
from tandem.sim.protocol import (
    APIError,
    DetokenizeRequest,
    TokenizeRequest,
    parse_json,
    prepare,
    validate,
)
from tandem.sim.render import RenderFields, generate_request, render_id
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
    """The base model, then every served LoRA adapter (`id` its name, `root` its path, `parent` the
    base model), as vLLM's `show_available_models`."""
    sim = sim_state(request)
    settings = sim.settings
    created = int(time.time())
    card = {
        "id": settings.served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": settings.model,
        "parent": None,
        "max_model_len": settings.max_model_len,
    }
    return {"object": "list", "data": [card, *sim.adapters.cards(created=created)]}


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    """`{prompt}` or `{messages}` → `{count, max_model_len, tokens}`."""
    sim = sim_state(request)
    settings = sim.settings
    body = validate(TokenizeRequest, parse_json(await request.body()))
    sim.resolve_model(body.model)
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
    body = validate(DetokenizeRequest, parse_json(await request.body()))
    sim_state(request).resolve_model(body.model)
    try:
        text = decode(body.tokens)
    except TokenizerError as exc:
        raise APIError(400, str(exc), param="tokens") from None
    return JSONResponse({"prompt": text})


@router.post("/v1/completions/render")
async def render_completion(request: Request) -> JSONResponse:
    """A completion request → `[GenerateRequest]` (one prompt: a list of one), as vLLM's render route."""
    return JSONResponse([await _render(request, chat=False)])


@router.post("/v1/chat/completions/render")
async def render_chat_completion(request: Request) -> JSONResponse:
    """A chat request → `GenerateRequest`: the templated prompt's ids and the resolved sampling."""
    return JSONResponse(await _render(request, chat=True))


async def _render(request: Request, *, chat: bool) -> dict[str, Any]:
    """What `/v1/(chat/)completions` would run for this body (`protocol.prepare`, same errors), in
    vLLM's `GenerateRequest` shape (`tandem.sim.render`); nothing reaches the engine."""
    sim = sim_state(request)
    settings = sim.settings
    body = parse_json(await request.body())
    parsed = validate(ChatCompletionRequest, body) if chat else validate(CompletionRequest, body)
    lora = sim.resolve_model(parsed.model)
    gen = prepare(
        parsed,
        served_model=settings.served_model_name,
        max_model_len=settings.max_model_len,
        adapter=lora.name if lora is not None else None,
    )
    fields = validate(RenderFields, body)
    log_fields(request).update(prompt_tokens=len(gen.prompt_token_ids))
    request_id = render_id(
        "chatcmpl" if chat else "cmpl",
        header_id=request.headers.get("x-request-id"),
        body_id=fields.request_id,
        fallback=REQUEST_ID.get() or uuid.uuid4().hex,
    )
    return generate_request(gen, request=parsed, fields=fields, request_id=request_id)
