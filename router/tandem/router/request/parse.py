"""Reading a client's generation request: its JSON body, parsed once, validated, and cleaned of the
fields only the gateway may set.

1. **Body**: at most `max_request_bytes` (413 beyond, before reading it all when `content-length`
   says so), a JSON object (`orjson`: invalid JSON, `NaN`/`Infinity` and non-objects are 400).
2. **Validation**: `tandem.core.openai_api`'s models, which keep unknown fields; the gateway forwards
   the client's parsed JSON, not the model, so vLLM extensions pass through untouched.
3. **Model**: the served name or the model name, else 404 in vLLM's words.
4. **Hygiene**: `STEERING_FIELDS` are dropped from the body. They steer an engine's internals (the
   P/D handoff's `kv_transfer_params`, vLLM's scheduler `priority`, the engine's own `request_id`)
   and only the gateway sets them: a client's `kv_transfer_params` would otherwise reach a decode
   engine on the decode-only paths, a client `priority` would jump the engine's queue past the
   tenant bands of the gateway's fair queue, and a client `cache_salt` would choose whose cached
   prompts it shares.

Limits on the body's elements, shape and engine extensions apply between these steps
(`tandem.router.request.limits`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest, validation_message
from tandem.router.errors import ClientDisconnected, InvalidRequest, ModelNotFound, RequestTooLarge
from tandem.router.request.limits import BodyLimits, check_elements, check_fields, check_shape
from tandem.router.types import Route

GenerationRequest = CompletionRequest | ChatCompletionRequest
#: Fields only the gateway sets; dropped from client bodies (module docstring).
STEERING_FIELDS = ("kv_transfer_params", "priority", "request_id", "cache_salt")
#: Most characters of prompt text kept for the log line (`logPrompts`).
MAX_PROMPT_CHARS = 16_384


@dataclass(frozen=True, slots=True)
class Parsed:
    """A generation request's cleaned body, its model and whether it streams."""

    body: dict[str, Any]
    model: str
    stream: bool


def parse_generation(
    route: Route, raw: bytes, *, accepted: Collection[str] | None, limits: BodyLimits | None = None
) -> Parsed:
    """Steps 1-4 of the module docstring for a body already read, with `limits`' checks each before
    the work it guards (`tandem.router.request.limits`); raises `InvalidRequest` (400),
    `RequestTooLarge` (413), `ModelNotFound` (404). `accepted` None: the model is checked later (a
    gateway of many services resolves it, `tandem.router.request.names`)."""
    limits = limits or BodyLimits()
    check_elements(raw, limits)
    body = parse_json_object(raw)
    check_shape(route, body, limits)
    validated = validate_generation(route, body)
    check_fields(route, body, limits)
    if accepted is not None:
        check_model(validated.model, accepted=accepted)
    for name in STEERING_FIELDS:
        body.pop(name, None)
    return Parsed(body, validated.model, validated.stream)


def body_limit_error(declared: str | None, limit: int) -> RequestTooLarge | None:
    """The 413 for a `content-length` over `limit` bytes, before anything is read."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return RequestTooLarge(f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes")
    return None


def too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"request body exceeds the limit of {limit} bytes")


def disconnected() -> ClientDisconnected:
    return ClientDisconnected("client disconnected while sending the request")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises `InvalidRequest` for invalid JSON (NaN and Infinity
    included: they are not JSON and engines reject them) or a non-object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {type(body).__name__}")
    return body


def validate_generation(route: Route, body: dict[str, Any]) -> GenerationRequest:
    """Validate `body` for `route`; raises `InvalidRequest` naming the first bad parameter."""
    model = CompletionRequest if route is Route.COMPLETIONS else ChatCompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise InvalidRequest(message, param=param) from None


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt as one string for the request log line (only with `logPrompts`): the completion
    prompt, or the chat messages as JSON; cut to `MAX_PROMPT_CHARS`."""
    prompt = body.get("prompt", body.get("messages"))
    text = prompt if isinstance(prompt, str) else orjson.dumps(prompt, default=str).decode()
    return text[:MAX_PROMPT_CHARS]


def check_model(model: str, *, accepted: Collection[str]) -> None:
    """Raises `ModelNotFound` (404, vLLM's wording) unless `model` is served here."""
    if model not in accepted:
        raise ModelNotFound(model)
