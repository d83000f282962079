"""The parts of the OpenAI API (as vLLM serves it) that Tandem's gateway and simulator validate.

Requests keep unknown fields (`extra="allow"`): vLLM accepts many extensions (`kv_transfer_params`,
`ignore_eos`, `min_tokens`, ...) and the gateway forwards bodies unchanged. Errors use OpenAI's shape:
`{"error": {"message", "type", "param", "code"}}`, with the HTTP status also in `code` as vLLM does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: OpenAI error `type` for each HTTP status Tandem returns.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "TimeoutError",
    413: "BadRequestError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def error_body(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    """OpenAI's JSON error object for an HTTP status."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "APIError"),
            "param": param,
            "code": status,
        }
    }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=128)
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`. `prompt` may be a string or a list of token ids (one prompt only)."""

    prompt: str | list[int] | list[str]
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`. `continue_final_message` (vLLM's): the last message is continued
    rather than answered; it needs `add_generation_prompt: false`."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _one_way_to_end_the_prompt(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return self


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the offending parameter for a request that failed validation."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return f"{param}: {first['msg']}" if param else str(first["msg"]), param
