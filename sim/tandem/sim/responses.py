"""Response bodies and stream chunks in vLLM's shapes, for completions and chat completions.

Non-streaming bodies carry `usage`. Streams send one chunk per token with the text it made visible
(chat streams open with a `{"role": "assistant", "content": ""}` delta, sent with the first token as
vLLM sends it); the chunk of the last token carries `finish_reason`; with
`stream_options.include_usage` every chunk has `"usage": null` and a last chunk has empty `choices`
and the `usage`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.sim.protocol import Kind, usage


@dataclass(frozen=True)
class ResponseMeta:
    """What every body and chunk of one response repeats. `created` is Unix seconds (wall clock)."""

    kind: Kind
    response_id: str
    created: int
    model: str
    include_usage: bool = False

    def envelope(self, *, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}


def full_body(
    meta: ResponseMeta,
    *,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """The whole non-streaming response."""
    choice: dict[str, Any] = {"index": 0}
    if meta.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text, "refusal": None, "tool_calls": []}
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
    else:
        choice.update(text=text, logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
    body = meta.envelope(chunk=False)
    body.update(
        choices=[choice],
        usage=usage(prompt_tokens, completion_tokens),
        prompt_logprobs=None,
        kv_transfer_params=None,
    )
    return body


def chunk(
    meta: ResponseMeta,
    *,
    text: str,
    finish_reason: str | None = None,
    stop_reason: str | None = None,
    role: bool = False,
) -> dict[str, Any]:
    """One streamed chunk; `role` makes it the opening assistant delta of a chat stream."""
    choice: dict[str, Any] = {"index": 0}
    if meta.kind == "chat":
        choice["delta"] = {"role": "assistant", "content": text} if role else {"content": text}
        choice.update(logprobs=None, finish_reason=finish_reason)
    else:
        choice.update(text=text, logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
    body = meta.envelope(chunk=True)
    body["choices"] = [choice]
    if meta.include_usage:
        body["usage"] = None
    return body


def usage_chunk(meta: ResponseMeta, *, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The closing chunk of a stream with `include_usage`: no choices, the usage."""
    body = meta.envelope(chunk=True)
    body.update(choices=[], usage=usage(prompt_tokens, completion_tokens))
    return body
