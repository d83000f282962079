"""How the scheduler gets a request's prompt tokens: a `Tokenize` callable chosen at composition.

Prefix matching hashes blocks of prompt tokens, and the TTFT predictor counts uncached ones.

- `engine.kind: sim`: `request_tokens`, Tandem's own tokenizer (`tandem.core.tokenizer`; chat
  messages through its ChatML template first), which **is** the simulator's, so the router's blocks
  are the engine's blocks. The gateway already encodes every prompt once for fair-queue charges
  (`RequestView.prompt_token_ids`); those ids are used as they are, and encoded here only when a view
  arrives without them.
- `engine.kind: vllm`: the same ids, as an **estimate**. The approximate index needs only
  *consistency* (the same prompt prefix gives the same leading tokens, which any deterministic
  tokenizer of the text provides; SGLang's approximate tree matches raw characters for the same
  reason), and the TTFT predictor learns its rates in these units, so their scale against the real
  tokenizer's (about 3 against 4 characters per token) cancels out. What does not work with estimated
  ids is the precise index, whose keys come from the engine's real token ids in KV events: use it with
  engines whose tokenizer is Tandem's (the simulator), or add an exact tokenizer at this seam.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tandem.core.tokenizer import encode, render_chat
from tandem.router.types import RequestView, Route

Tokenize = Callable[[RequestView], Sequence[int]]


def request_tokens(request: RequestView) -> Sequence[int]:
    """The prompt's token ids: `request.prompt_token_ids`, else `body_tokens(route, body)`."""
    return request.prompt_token_ids or body_tokens(request.route, request.body)


def body_tokens(route: Route, body: Mapping[str, Any]) -> list[int]:
    """Tandem-tokenizer ids of a validated body's prompt: chat `messages` rendered with ChatML (with
    the generation prompt); a completions `prompt` that is a string, a list of strings (joined), or
    token ids (kept). Anything else: []."""
    if route is Route.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return []
        return encode(render_chat([m for m in messages if isinstance(m, Mapping)]))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return encode(prompt)
    ids: list[int] = []
    if isinstance(prompt, list):
        for part in prompt:
            if isinstance(part, str):
                ids.extend(encode(part))
            elif isinstance(part, int):
                ids.append(part)
    return ids


def tokenizer_for(engine_kind: str) -> Tokenize:
    """The `Tokenize` for an `engine.kind` (module docstring: the same function, exact for `sim`)."""
    if engine_kind not in ("sim", "vllm"):
        raise ValueError(f"unknown engine kind {engine_kind!r}")
    return request_tokens
