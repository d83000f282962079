"""Counting an answer's tokens for fair-queue charges as it streams (pure).

- **Prompt**: counted by the gateway's prompt encoder (the request context); the charge made with it
  at dispatch is corrected with the engine's `usage.prompt_tokens` when the answer carries usage.
- **Streamed output**: `SSETap` reads a copy of the SSE bytes as they pass. Each `data:` event with
  a non-empty `delta.content` (chat) or `text` (completions) counts as one generated token per choice
  (vLLM sends one event per token); the final usage event gives the exact total. A chunk of whole
  events (every token chunk vLLM and the simulator send) is counted from its bytes in one go
  (`quick_tokens`: the rules of `_tokens_without_parsing`, which are sound because a `"` inside a
  JSON string is always escaped), without splitting it into events; a stream's last read, whose
  token events come with the usage event and `[DONE]`, is counted that way up to them (`_tail_start`).
  Anything else (a usage event, an event split across chunks, `[DONE]`, the text kept for the log
  line) goes event by event, decoding JSON where the bytes cannot tell. Both ways count the same.
- **Usage always on**: `request_usage` adds `stream_options.include_usage: true` to a streaming body
  that did not ask for it; the tap then drops that usage-only event (`"choices": []`) from the
  client's stream, so the client sees the stream it asked for. Only then does the tap hold back the
  unfinished tail of an event between chunks; the bytes it forwards are the engine's bytes.
- **Buffered answers**: `usage_from_body` reads `usage` from a JSON answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from tandem.router.types import Usage

_EVENT_END = re.compile(rb"\r?\n\r?\n")
#: An unfinished event larger than this is not parsed (counting stops; bytes still flow).
MAX_EVENT_BYTES = 1 << 20


def request_usage(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """`body` with `stream_options.include_usage: true` when it streams without asking for usage,
    and whether it was added (then strip the usage event from the client's stream)."""
    options = body.get("stream_options")
    asked = isinstance(options, Mapping) and bool(options.get("include_usage"))
    if not body.get("stream") or asked:
        return dict(body), False
    kept = dict(options) if isinstance(options, Mapping) else {}
    return {**body, "stream_options": {**kept, "include_usage": True}}, True


def _usage(value: object) -> Usage | None:
    if not isinstance(value, Mapping):
        return None

    def count(key: str) -> int | None:
        n = value.get(key)
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None

    return Usage(count("prompt_tokens"), count("completion_tokens"))


def usage_from_body(body: bytes) -> Usage | None:
    """The `usage` of a non-streaming JSON answer, or None."""
    try:
        answer = orjson.loads(body)
    except ValueError:
        return None
    return _usage(answer.get("usage")) if isinstance(answer, Mapping) else None


#: Most characters of output text kept for the log line (`logPrompts`).
MAX_TEXT_CHARS = 16_384


def _texts_in(choices: object) -> list[str]:
    """The generated text pieces of one event's (or one answer's) choices."""
    if not isinstance(choices, list):
        return []
    texts: list[str] = []
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        holder = choice.get("delta") or choice.get("message")
        text = holder.get("content") if isinstance(holder, Mapping) else choice.get("text")
        if isinstance(text, str) and text:
            texts.append(text)
    return texts


def output_text_from_body(body: bytes) -> str | None:
    """The generated text of a non-streaming JSON answer (choices joined), or None."""
    try:
        answer = orjson.loads(body)
    except ValueError:
        return None
    if not isinstance(answer, Mapping):
        return None
    return "".join(_texts_in(answer.get("choices")))[:MAX_TEXT_CHARS]


def _tokens_without_parsing(payload: bytes) -> int | None:
    """The tokens `_tokens_in` would count in this `data:` payload, read from the bytes, or None
    when only decoding can tell. Sound because a `"` inside a JSON string is always escaped, so
    `"content"` followed by `:` is a key wherever it occurs; decoding is left to cases where the key
    also occurs otherwise (a value `"content"`, a `null` or list value, other spacing), where both
    keys occur, where a chat event (`delta`) has `text`, or where the event has a `usage` that is
    not `null`."""
    if not (payload.startswith(b"{") and payload.endswith(b"}")):
        return None
    count = payload.count
    # Compact JSON (vLLM's and the simulator's) has no `": ` anywhere: then the spaced forms of the
    # keys below cannot occur and are not looked for.
    spaced = b'": ' in payload
    usages = count(b'"usage"')
    if usages and _both(payload, spaced, b'"usage":null', b'"usage": null') != usages:
        return None
    contents, texts = count(b'"content"'), count(b'"text"')
    if contents and texts:
        return None
    if contents:
        strings = _both(payload, spaced, b'"content":"', b'"content": "')
        if strings != contents or b'"delta"' not in payload:
            return None
        return strings - _both(payload, spaced, b'"content":""', b'"content": ""')
    if texts:
        strings = _both(payload, spaced, b'"text":"', b'"text": "')
        if strings != texts or b'"delta"' in payload:
            return None
        return strings - _both(payload, spaced, b'"text":""', b'"text": ""')
    return 0


def _both(payload: bytes, spaced: bool, compact: bytes, with_space: bytes) -> int:
    """Occurrences of a key's compact form, plus its spaced form where the payload has any `": `."""
    return payload.count(compact) + payload.count(with_space) if spaced else payload.count(compact)


def _tail_start(chunk: bytes) -> int:
    """Where the event that holds a chunk's first non-null usage or `[DONE]` begins, when whole events
    come before it; else 0. Example: 3 token events, the usage event, `[DONE]` → the usage event's
    first byte."""
    marks = [
        i for i in (chunk.find(b"data: [DONE]"), chunk.find(b'"usage":{'), chunk.find(b'"usage": {')) if i > 0
    ]
    if not marks:
        return 0
    end = chunk.rfind(b"\n\n", 0, min(marks))
    return end + 2 if end > 0 else 0


def quick_tokens(chunk: bytes) -> int | None:
    """Generated tokens of a chunk of whole `data: {...}` events, read from its bytes with the rules
    of `_tokens_without_parsing` (module docstring), or None when only decoding can tell. Example:
    `data: {"choices":[{"delta":{"content":"Hi"}}]}\\n\\n` → 1."""
    if not (chunk.startswith(b"data: {") and chunk.endswith(b"}\n\n")):
        return None
    return _tokens_without_parsing(chunk[6:-2])


def _tokens_in(choices: object) -> int:
    if not isinstance(choices, list):
        return 0
    tokens = 0
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, Mapping) else choice.get("text")
        tokens += 1 if isinstance(text, str) and text else 0
    return tokens


class SSETap:
    """Counts tokens in an SSE stream passing through (see the module docstring).

    `feed(chunk)` returns the bytes to forward now and the tokens newly counted; `flush()` returns
    the bytes still held back (only when stripping the usage event). `usage` is the final usage event's
    counts once seen. With `collect_text`, `text` is the generated text so far (at most
    `MAX_TEXT_CHARS`), for the request log line.
    """

    def __init__(self, *, strip_usage: bool, collect_text: bool = False) -> None:
        self.strip_usage = strip_usage
        self.collect_text = collect_text
        self.usage: Usage | None = None
        self.tokens = 0
        self._text: list[str] = []
        self._text_chars = 0
        self._pending = b""
        self._parsing = True

    def feed(self, chunk: bytes) -> tuple[bytes, int]:
        if not self._pending and self._parsing and not self.collect_text:
            quick = quick_tokens(chunk)
            if quick is not None:
                self.tokens += quick
                return chunk, quick
            # A stream's last read often carries its last token events with the usage event and
            # `[DONE]`: the token events before them are counted in one go, the rest event by event.
            cut = _tail_start(chunk)
            head = quick_tokens(chunk[:cut]) if cut else None
            if head is not None:
                self.tokens += head
                rest, tokens = self._by_event(chunk[cut:])
                return (chunk[:cut] + rest if self.strip_usage else chunk), head + tokens
        return self._by_event(chunk)

    def _by_event(self, chunk: bytes) -> tuple[bytes, int]:
        if not self._parsing:
            out = self._pending + chunk if self.strip_usage else chunk
            self._pending = b""
            return out, 0
        data = self._pending + chunk if self._pending else chunk
        forward: list[bytes] = []
        counted = 0
        start = 0
        for end in _EVENT_END.finditer(data):
            event = data[start : end.end()]
            start = end.end()
            tokens, usage_only = self._read_event(event)
            counted += tokens
            if not (self.strip_usage and usage_only):
                forward.append(event)
        self._pending = data[start:]
        if len(self._pending) > MAX_EVENT_BYTES:
            # Not SSE as we know it: stop counting, keep relaying (held bytes go out now).
            self._parsing = False
            forward.append(self._pending)
            self._pending = b""
        self.tokens += counted
        return (b"".join(forward) if self.strip_usage else chunk), counted

    @property
    def text(self) -> str:
        return "".join(self._text)

    def flush(self) -> bytes:
        """Bytes held back at the end of the stream (an unfinished last event); forward them."""
        held, self._pending = self._pending, b""
        return held if self.strip_usage else b""

    def _read_event(self, event: bytes) -> tuple[int, bool]:
        """(tokens in the event, whether it is a usage-only event)."""
        tokens, usage_only = 0, False
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            quick = None if self.collect_text else _tokens_without_parsing(payload)
            if quick is not None:
                tokens += quick
                continue
            try:
                obj = orjson.loads(payload)
            except ValueError:
                continue
            if not isinstance(obj, Mapping):
                continue
            tokens += _tokens_in(obj.get("choices"))
            if self.collect_text:
                self._keep_text(obj.get("choices"))
            usage = _usage(obj.get("usage"))
            if usage is not None:
                self.usage = usage
                usage_only = usage_only or obj.get("choices") == []
        return tokens, usage_only

    def _keep_text(self, choices: object) -> None:
        for piece in _texts_in(choices):
            room = MAX_TEXT_CHARS - self._text_chars
            if room <= 0:
                return
            self._text.append(piece[:room])
            self._text_chars += min(len(piece), room)
