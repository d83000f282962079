"""What a client's body may hold: its size in elements, its shape, and which fields reach an engine.

A body within the byte limit can still cost the gateway far more than its bytes: four MiB of `{},`
parse into 1.4 million dicts (144 MiB), and a 25 MiB chat of 900,000 one-letter messages, validated,
rendered and tokenized, drove a gateway past 4 GB. So, in this order, each check before the work it
guards (400 `invalid_request_error` naming the limit, or 413 for the element count):

1. **Elements, before parsing** (`json_elements` ≤ `max_json_elements`): commas, `[` and `{` in the
   raw bytes bound the values the parser would build (strings with commas in them count too, so it
   is an upper bound; prose has about one comma in 80 bytes). Parsed memory is then at most about
   100 bytes an element beside the strings themselves.
2. **Shape, before validation** (`check_shape`): `messages` ≤ `max_messages`; content parts over all
   messages ≤ `max_content_parts`; sequences, `n` × (`best_of`) × the prompts of a batched
   completion, ≤ `max_sequences`: a request holds one unit of the gateway's capacity, and the
   engine runs it as that many sequences.
3. **Fields, after validation** (`check_fields`): vLLM's request extensions that reach past
   sampling are refused unless the operator enables them (`allowed_extensions`): `vllm_xargs`
   (arbitrary engine arguments), `chat_template` (a template the engine renders), `prompt_embeds`
   (tensors deserialized by the engine; a vLLM CVE on some versions), `logits_processors` (names the
   engine imports), `mm_processor_kwargs` and `media_io_kwargs`; and media given by URL (`image_url`,
   `audio_url`, `video_url` parts whose URL is not `data:`), which an engine would
   fetch from inside the cluster, unless `allow_media_urls`. `cache_salt` is the gateway's to set
   (per tenant) and is dropped from client bodies with the other steering fields.

Example: `{"messages": [...3000 messages...]}` → 400 "at most 2048 messages"; `{"prompt": ["a", "b",
"c"], "n": 8}` → 24 sequences → 400 with the default of 16.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from tandem.router.errors import InvalidRequest, RequestTooLarge
from tandem.router.settings import AccessSettings, EngineExtension
from tandem.router.types import Route

#: Request extensions an engine acts on beyond sampling: refused unless enabled (module docstring).
GUARDED_EXTENSIONS: tuple[str, ...] = get_args(EngineExtension)
#: Content part types whose media an engine fetches when given a URL.
_MEDIA_PARTS = {"image_url": "url", "audio_url": "url", "video_url": "url"}


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The limits of the module docstring (defaults: the gateway's settings)."""

    max_json_elements: int = 262_144
    max_messages: int = 2048
    max_content_parts: int = 4096
    max_sequences: int = 16
    allowed_extensions: frozenset[str] = field(default_factory=frozenset)
    allow_media_urls: bool = False

    @classmethod
    def of(cls, access: AccessSettings) -> BodyLimits:
        """The limits the gateway's `access` settings name."""
        return cls(
            max_json_elements=access.max_json_elements,
            max_messages=access.max_messages,
            max_content_parts=access.max_content_parts,
            max_sequences=access.max_sequences,
            allowed_extensions=frozenset(access.allowed_extensions),
            allow_media_urls=access.allow_media_urls,
        )


def json_elements(raw: bytes) -> int:
    """An upper bound on the values a JSON text holds beyond one per container: its commas, `[` and
    `{` (a C-speed count of the raw bytes).

    >>> json_elements(b'{"a": [1, 2, 3]}')
    4
    """
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def check_elements(raw: bytes, limits: BodyLimits) -> None:
    """Step 1: raises `RequestTooLarge` (413) above `max_json_elements`."""
    count = json_elements(raw)
    if count > limits.max_json_elements:
        raise RequestTooLarge(
            f"request body holds about {count} JSON elements; the limit is {limits.max_json_elements}"
        )


def check_shape(route: Route, body: Mapping[str, Any], limits: BodyLimits) -> None:
    """Step 2 on a parsed body (before validation); raises `InvalidRequest` (400)."""
    if route is Route.CHAT:
        messages = body.get("messages")
        if isinstance(messages, list):
            if len(messages) > limits.max_messages:
                raise InvalidRequest(
                    f"{len(messages)} messages; at most {limits.max_messages} per request", param="messages"
                )
            parts = sum(len(m["content"]) for m in messages if _parts(m))
            if parts > limits.max_content_parts:
                raise InvalidRequest(
                    f"{parts} content parts; at most {limits.max_content_parts} per request",
                    param="messages",
                )
    sequences = _count(body.get("n")) * _count(body.get("best_of")) * _prompts(route, body)
    if sequences > limits.max_sequences:
        raise InvalidRequest(
            f"the request asks for {sequences} sequences (n × best_of × prompts); at most "
            f"{limits.max_sequences} per request",
            param="n",
        )


def check_fields(route: Route, body: Mapping[str, Any], limits: BodyLimits) -> None:
    """Step 3 on a validated body; raises `InvalidRequest` (400) naming the field."""
    for name in GUARDED_EXTENSIONS:
        if name in body and name not in limits.allowed_extensions:
            raise InvalidRequest(
                f"'{name}' is not enabled on this gateway (router access setting allowed_extensions)",
                param=name,
            )
    if route is Route.CHAT and not limits.allow_media_urls:
        for message in body.get("messages") or ():
            for part in message.get("content") if _parts(message) else ():
                url = _media_url(part)
                if url is not None and not url.startswith("data:"):
                    raise InvalidRequest(
                        "media by URL is not enabled on this gateway; send it inline as a data: URL",
                        param="messages",
                    )


def _parts(message: object) -> bool:
    return isinstance(message, dict) and isinstance(message.get("content"), list)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _prompts(route: Route, body: Mapping[str, Any]) -> int:
    """A batched completion's prompts: a list of strings or of token lists (a flat list of ints is one
    prompt)."""
    prompt = body.get("prompt") if route is Route.COMPLETIONS else None
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


def _media_url(part: object) -> str | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    key = _MEDIA_PARTS.get(kind) if isinstance(kind, str) else None
    inner = part.get(kind) if key is not None and isinstance(kind, str) else None
    if isinstance(inner, dict):
        url = inner.get(key)
        return url if isinstance(url, str) else ""
    if isinstance(inner, str):
        return inner
    return None


class ReadingBudget:
    """Bytes of request bodies being read and parsed at once, across requests: a body takes its
    declared length (or the size limit, when undeclared) until it is parsed, and is refused when the
    budget has no room (one body is always let in, so a limit above the budget still serves)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used and self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used = max(0, self.used - size)
