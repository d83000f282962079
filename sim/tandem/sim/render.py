"""The body of vLLM's render routes, `POST /v1/completions/render` and `POST /v1/chat/completions/render`,
as pure functions.

vLLM (0.32, `vllm.entrypoints.scale_out.render`) answers a completion or chat request there with the
`GenerateRequest` its token-in/token-out `POST /inference/v1/generate` takes: the prompt's `token_ids`
after the chat template and the tokenizer, and the resolved `sampling_params`. The chat route returns
one object; the completions route a list with one object per prompt. Routers that score prefix caches
on token ids (vllm-router's `kv_aware`) call them before they pick a worker.

The simulator renders what its own generation routes would run: the `Generation` from
`protocol.prepare`, so `token_ids` are the ids its engine sees and the errors are those routes' errors.
Fields the simulator has no use for carry vLLM's values for a plain text request (`features`,
`token_offsets`, `content_parts`, `kv_transfer_params` and the reasoning fields are null,
`output_mode` is `"tokens"`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest
from tandem.sim.protocol import Generation

#: vLLM's `RequestOutputKind`: a stream sends deltas (1), anything else only the final output (2).
OUTPUT_KIND_DELTA = 1
OUTPUT_KIND_FINAL_ONLY = 2
#: `SamplingParams.max_tokens`'s default; vLLM's encoder leaves the field out at that value.
SAMPLING_DEFAULT_MAX_TOKENS = 16
#: Below this temperature vLLM samples greedily and resets `top_p` and `min_p` to their defaults.
GREEDY_TEMPERATURE = 1e-5


class RenderStreamOptions(BaseModel):
    """vLLM's `StreamOptions`, as the render body repeats it."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class RenderFields(BaseModel):
    """The request fields the render body repeats that the generation routes do not read."""

    model_config = ConfigDict(extra="ignore")
    request_id: str | None = None
    priority: int = Field(default=0, ge=-(2**63), le=2**63 - 1)
    stream_options: RenderStreamOptions | None = None


def render_id(kind_prefix: str, *, header_id: str | None, body_id: str | None, fallback: str) -> str:
    """vLLM's render id: the `x-request-id` header, else the body's `request_id`, else a fresh id,
    after `cmpl-` or `chatcmpl-`. Example: header `abc` on a chat request → `chatcmpl-abc`."""
    return f"{kind_prefix}-{header_id or body_id or fallback}"


def generate_request(
    gen: Generation,
    *,
    request: CompletionRequest | ChatCompletionRequest,
    fields: RenderFields,
    request_id: str,
) -> dict[str, Any]:
    """One `GenerateRequest` body, keys in vLLM's order."""
    stream_options = None
    if gen.stream and fields.stream_options is not None:
        stream_options = fields.stream_options.model_dump()
    return {
        "request_id": request_id,
        "token_ids": list(gen.prompt_token_ids),
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling_params(gen, top_p=request.top_p),
        "model": request.model,
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": gen.stream,
        "stream_options": stream_options,
        "cache_salt": gen.cache_salt,
        "priority": fields.priority,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def sampling_params(gen: Generation, *, top_p: float) -> dict[str, Any]:
    """vLLM's `SamplingParams` as its encoder writes them: the float fields always; `seed`,
    `ignore_eos`, `max_tokens` and `min_tokens` only away from their defaults (None, false, 16, 0);
    `top_p` and `min_p` not at all for a greedy request. Penalties are vLLM's defaults (the simulator
    does not model them).

    Example: a chat request, temperature 0, 12 prompt tokens, limit 2048 → `temperature` 0.0, no
    `top_p`, `max_tokens` 2036 (the rest of the context), `output_kind` 2.
    """
    out: dict[str, Any] = {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": float(gen.temperature),
    }
    if gen.temperature >= GREEDY_TEMPERATURE:
        out |= {"top_p": float(top_p), "min_p": 0.0}
    if gen.seed is not None:
        out["seed"] = gen.seed
    out |= {"stop": list(gen.stop), "stop_token_ids": []}
    if gen.ignore_eos:
        out["ignore_eos"] = True
    if gen.max_tokens != SAMPLING_DEFAULT_MAX_TOKENS:
        out["max_tokens"] = gen.max_tokens
    if gen.min_tokens:
        out["min_tokens"] = gen.min_tokens
    out |= {
        "output_kind": OUTPUT_KIND_DELTA if gen.stream else OUTPUT_KIND_FINAL_ONLY,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    return out
