"""The OpenAI/vLLM wire format: request checks and response bodies, as pure functions.

Request rules (vLLM's, where the simulator serves one choice per request):
- unknown model → 404; `n` other than 1 → 400; malformed JSON or wrong types → 400;
- `/v1/completions`: `prompt` is a string or a list of token ids; `max_tokens` defaults to 16 as in
  vLLM and OpenAI (an explicit null means "the rest of the context");
- `/v1/chat/completions`: the prompt is `render_chat(messages)`; `max_completion_tokens` wins over
  `max_tokens`; with neither, the rest of the context;
- prompt + max_tokens above `max_model_len` → 400 naming the limit;
- `cache_salt` (vLLM's), when sent, is a non-empty string of at most 1024 characters, else 400; it
  scopes the request's prefix cache (`tandem.sim.engine.requests.prompt_block_hashes`).
Responses have vLLM's fields; streams are `data: {json}\\n\\n` events ending with `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tandem.core.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    validation_message,
)
from tandem.core.tokenizer import VOCAB_SIZE, encode, render_chat

COMPLETION_DEFAULT_MAX_TOKENS = 16
CACHE_SALT_MAX_CHARS = 1024
SSE_DONE = b"data: [DONE]\n\n"
Kind = Literal["completion", "chat"]
M = TypeVar("M", bound=BaseModel)


class APIError(Exception):
    """A request the API rejects: HTTP `status`, a message for the client, the offending parameter."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param)


class TokenizeRequest(BaseModel):
    """vLLM's `POST /tokenize`: a `prompt` or chat `messages`."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """vLLM's `POST /detokenize`."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int] = Field(default_factory=list)


@dataclass(frozen=True)
class Generation:
    """A checked generation request, ready for the engine. `max_tokens` is resolved (>= 1);
    `cache_salt` is None when the client sent none."""

    kind: Kind
    prompt_token_ids: tuple[int, ...]
    prompt_text: str | None
    max_tokens: int
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    min_tokens: int
    stream: bool
    include_usage: bool
    echo: bool
    cache_salt: str | None = None


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from None


def validate(model: type[M], body: Any) -> M:
    """`model.model_validate(body)`, with a validation failure as a 400 naming the parameter."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


def check_model(requested: str | None, *, served: str, adapter: str | None = None) -> None:
    """404 unless the request names the served model, the LoRA `adapter` it resolved to, or none."""
    if requested and requested != served and requested != adapter:
        raise unknown_model(requested)


def unknown_model(requested: str) -> APIError:
    return APIError(404, f"The model `{requested}` does not exist.", param="model")


def completion_prompt(request: CompletionRequest) -> tuple[tuple[int, ...], str | None]:
    """The prompt's token ids (and its text, when it came as text)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return tuple(encode(prompt)), prompt
    if prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise APIError(
                400, "send one prompt per request (batched prompts are not supported)", param="prompt"
            )
        text = str(prompt[0])
        return tuple(encode(text)), text
    ids = tuple(int(p) for p in prompt)
    bad = next((t for t in ids if not 0 < t < VOCAB_SIZE), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of vocabulary (1..{VOCAB_SIZE - 1})", param="prompt")
    return ids, None


def prepare(
    request: CompletionRequest | ChatCompletionRequest,
    *,
    served_model: str,
    max_model_len: int,
    adapter: str | None = None,
) -> Generation:
    """Check a parsed request against the engine and resolve its defaults (module docstring).
    `adapter` is the LoRA adapter the request's `model` resolved to (None: the base model)."""
    check_model(request.model, served=served_model, adapter=adapter)
    if request.n != 1:
        raise APIError(
            400, f"n must be 1 (the simulator generates one choice per request), got {request.n}", param="n"
        )
    kind: Kind = "chat" if isinstance(request, ChatCompletionRequest) else "completion"
    prompt_text: str | None
    if isinstance(request, ChatCompletionRequest):
        prompt_text = render_chat(
            [m.model_dump() for m in request.messages],
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
        )
        prompt = tuple(encode(prompt_text))
        requested = request.max_completion_tokens or request.max_tokens
    else:
        prompt, prompt_text = completion_prompt(request)
        default = None if "max_tokens" in request.model_fields_set else COMPLETION_DEFAULT_MAX_TOKENS
        requested = request.max_tokens if request.max_tokens is not None else default
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt" if kind == "completion" else "messages")
    max_tokens = check_context(len(prompt), requested, max_model_len=max_model_len)
    return Generation(
        kind=kind,
        prompt_token_ids=prompt,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        temperature=request.temperature,
        seed=request.seed,
        stop=tuple(request.stop_strings),
        ignore_eos=request.ignore_eos,
        min_tokens=_min_tokens(request),
        stream=request.stream,
        include_usage=request.include_usage,
        echo=isinstance(request, CompletionRequest) and request.echo,
        cache_salt=_cache_salt(request),
    )


def check_context(prompt_len: int, max_tokens: int | None, *, max_model_len: int) -> int:
    """The resolved max_tokens, or a 400 when the request cannot fit the context.
    Example: limit 2048, prompt 2000, max_tokens 100 → 400 ("you requested 2100 tokens")."""
    if prompt_len >= max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )
    if max_tokens is None:
        return max_model_len - prompt_len
    if prompt_len + max_tokens > max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens",
        )
    return max_tokens


def _min_tokens(request: CompletionRequest | ChatCompletionRequest) -> int:
    value = (request.model_extra or {}).get("min_tokens", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise APIError(400, "min_tokens must be a non-negative integer", param="min_tokens")
    return value


def _cache_salt(request: CompletionRequest | ChatCompletionRequest) -> str | None:
    value = (request.model_extra or {}).get("cache_salt")
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= CACHE_SALT_MAX_CHARS:
        raise APIError(
            400,
            f"cache_salt must be a non-empty string of at most {CACHE_SALT_MAX_CHARS} characters",
            param="cache_salt",
        )
    return value


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }
