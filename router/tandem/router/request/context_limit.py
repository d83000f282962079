"""A prompt longer than the model's context, refused before it costs the gateway anything.

An engine refuses a prompt of `max_model_len` tokens or more (400, "This model's maximum context
length is N tokens..."). Left to the engine, such a prompt is first read, tokenized, hashed into
prefix keys and charged by the gateway: a 4 MiB prompt is a million tokens, about 200 MiB of the
gateway's memory and a second of its CPU, for an answer that was always going to be a 400. So the
gateway learns the context length and applies the engine's rule itself, cheapest test first:

1. **Characters** (no tokenizing): a token covers at most `max_token_chars` characters of text
   (`ModelTokenizer.max_token_chars`: 4 for Tandem's tokenizer, the longest vocabulary entry for a
   Hugging Face one), so a prompt of `c` characters has at least `c // max_token_chars` tokens. A
   prompt whose bound reaches the limit is refused unread. Token-id prompts are counted exactly.
2. **Tokens**: a prompt that passes is tokenized (off the event loop, `tandem.router.pipeline.stages.
   Parse`); one whose exact count reaches the limit is refused then, before any prefix key.

Both tests need the model's own tokenizer (`engine.kind: sim`, or `tokenizerPath`). A gateway that
only estimates tokens (a vLLM engine whose tokenizer files it was not given) would refuse prompts the
engine takes, so it applies the character test alone, with `ESTIMATE_TOKEN_CHARS` characters a token
(no vocabulary has longer tokens in practice; a 4 MiB prompt still has at least 65,536 tokens), and
leaves the exact count to the engine.

Each prompt of a batch (`prompt` as a list) is checked on its own, as the engine checks them. The
limit is `max_model_len` from the engines' `/v1/models` (the smallest any engine states, learned as
engines join: `learn`); until one states it, nothing is refused here (the engine still is).

Worked example: limit 2,048, Tandem's tokenizer (4 characters a token at most): a 9,000-character
prompt has at least 2,250 tokens → refused unread; a 6,000-character one (at least 1,500) is
tokenized: 2,100 tokens → refused; 1,900 → served.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from tandem.router.errors import InvalidRequest

#: Characters a token covers at most when the gateway's tokenizer is an estimate (module docstring).
ESTIMATE_TOKEN_CHARS = 64


class ContextLimit:
    """The model's context length as its engines state it, and the two tests of the module docstring.
    `exact`: the tokenizer is the model's own (else an estimate: the character test alone)."""

    def __init__(self, *, max_token_chars: int, model_names: Collection[str], exact: bool = True) -> None:
        if max_token_chars < 1:
            raise ValueError("max_token_chars must be positive")
        self.exact = exact
        self.max_token_chars = max_token_chars if exact else max(max_token_chars, ESTIMATE_TOKEN_CHARS)
        self._names = frozenset(model_names)
        self._stated: dict[str, int] = {}

    @property
    def tokens(self) -> int | None:
        """The smallest `max_model_len` an engine stated; None before any did."""
        return min(self._stated.values(), default=None)

    def knows(self, url: str) -> bool:
        return url in self._stated

    def learn(self, url: str, entries: Iterable[Mapping[str, Any]]) -> None:
        """An engine's `/v1/models` entries: the `max_model_len` of the entry for this model."""
        for entry in entries:
            stated = entry.get("max_model_len")
            ours = entry.get("id") in self._names or entry.get("root") in self._names
            if ours and isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
                self._stated[url] = stated
                return

    def forget(self, keep: Collection[str]) -> None:
        """Engines that left discovery no longer bound the limit."""
        for url in [u for u in self._stated if u not in keep]:
            del self._stated[url]

    def check_unread(self, body: Mapping[str, Any]) -> None:
        """Test 1: raises `InvalidRequest` when a prompt of `body` must have `tokens` or more."""
        limit = self.tokens
        if limit is None:
            return
        for chars, exact in prompt_sizes(body):
            at_least = chars if exact else chars // self.max_token_chars
            if at_least >= limit:
                raise too_long(limit, at_least, exact=exact)

    def check_tokens(self, count: int) -> None:
        """Test 2, for one prompt tokenized: raises `InvalidRequest` at `tokens` or more."""
        limit = self.tokens
        if self.exact and limit is not None and count >= limit:
            raise too_long(limit, count, exact=True)


def too_long(limit: int, tokens: int, *, exact: bool) -> InvalidRequest:
    """The engine's 400, in its words (vLLM's), with "at least" when the count is a bound."""
    count = f"{tokens}" if exact else f"at least {tokens}"
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens. However, your request has {count} "
        "input tokens. Please reduce the length of the input messages.",
        param="messages",
    )


def prompt_sizes(body: Mapping[str, Any]) -> list[tuple[int, bool]]:
    """Per prompt of `body`: (characters, False), or (tokens, True) for a token-id prompt. A chat
    is one prompt: the characters of every message's text. Example: `{"prompt": ["ab", [1, 2, 3]]}`
    → [(2, False), (3, True)]."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [(len(prompt), False)]
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) for t in prompt):
            return [(len(prompt), True)]
        return [_one(part) for part in prompt if isinstance(part, str | list)]
    messages = body.get("messages")
    if isinstance(messages, list):
        return [(sum(_message_chars(m) for m in messages if isinstance(m, Mapping)), False)]
    return []


def _one(part: str | Sequence[Any]) -> tuple[int, bool]:
    return (len(part), False) if isinstance(part, str) else (len(part), True)


def _message_chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        texts = (p.get("text") for p in content if isinstance(p, Mapping))
        return sum(len(t) for t in texts if isinstance(t, str))
    return 0
