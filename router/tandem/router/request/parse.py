"""Reading a client's generation request: JSON object → validated OpenAI request → served model.

Validation uses `tandem.core.openai_api`'s models, which keep unknown fields; the router forwards
the client's parsed JSON, not the model, so vLLM extensions pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, NoReturn

from pydantic import ValidationError

from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest, validation_message
from tandem.core.spec import ModelSpec
from tandem.router.errors import InvalidRequest, ModelNotFound
from tandem.router.types import Route

GenerationRequest = CompletionRequest | ChatCompletionRequest


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises `InvalidRequest` for invalid JSON (NaN and Infinity
    included: they are not JSON and engines reject them) or a non-object."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
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


#: Most characters of prompt text kept for the log line (`logPrompts`).
MAX_PROMPT_CHARS = 16_384


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt as one string for the request log line (only with `logPrompts`): the completion
    prompt, or the chat messages as JSON; cut to `MAX_PROMPT_CHARS`."""
    prompt = body.get("prompt", body.get("messages"))
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, default=str)
    return text[:MAX_PROMPT_CHARS]


def served_names(spec: ModelSpec) -> frozenset[str]:
    """The `model` values the gateway accepts: the served (public) name and the model name."""
    return frozenset({spec.public_name, spec.name})


def check_model(model: str, *, accepted: Collection[str]) -> None:
    """Raises `ModelNotFound` (404, vLLM's wording) unless `model` is served here."""
    if model not in accepted:
        raise ModelNotFound(model)
