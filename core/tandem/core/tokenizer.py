"""Tandem's deterministic tokenizer and chat template (the simulator's "model vocabulary").

The simulator and anything that must predict its token counts (benchmarks, the router's estimators) use
this one documented scheme, so token counts agree everywhere without shipping a vocabulary file.

Encoding, in two steps:
1. Pre-tokenise with a GPT-2-like regex: an optional leading space plus a run of letters, a single digit,
   an optional leading space plus one other symbol, or a run of whitespace.
2. Split each piece's UTF-8 bytes into runs of at most `MAX_TOKEN_BYTES` (4) bytes; a run
   `b0..bk-1` becomes the id `sum((b_i + 1) * 257**i)`, which is reversible and never 0.

Worked example: "Hi there" → pieces ["Hi", " there"] → runs [b"Hi", b" the", b"re"]
→ ids [73 + 106*257, ...]: 3 tokens. English text averages about 3 characters per token.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAX_TOKEN_BYTES = 4
_BASE = 257
#: Ids are below this bound (4 bytes of base-257 digits); reported as the vocabulary size.
VOCAB_SIZE = _BASE**MAX_TOKEN_BYTES
#: End of sequence: the id of the single byte 0xFF. No UTF-8 text contains that byte, so `encode` never
#: produces it; the simulator emits it to end a generation and leaves it out of the text, as engines
#: skip special tokens.
EOS_TOKEN_ID = 0xFF + 1
_PIECE = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\s\w]|\s+(?!\S)|\s+|_", re.UNICODE)
#: `_PIECE` for ASCII text, with the classes spelt out (about 1.5 times as fast: Unicode classes are looked
#: up per character). `\s` of a `str` pattern also matches the separators U+001C..U+001F, so `_WS` does.
_WS = r"\t\n\x0b\x0c\r\x1c-\x1f "
_PIECE_ASCII = re.compile(rf" ?[A-Za-z]+| ?[0-9]| ?[^{_WS}A-Za-z0-9_]|[{_WS}]+(?![^{_WS}])|[{_WS}]+|_")

CHAT_START = "<|im_start|>"
CHAT_END = "<|im_end|>"


class TokenizerError(ValueError):
    """An id that no text encodes to (e.g. 0, negative, or a malformed digit string)."""


def encode(text: str) -> list[int]:
    """Text → token ids. `decode(encode(t)) == t` for every string."""
    ids: list[int] = []
    for piece in (_PIECE_ASCII if text.isascii() else _PIECE).findall(text):
        ids.extend(_piece_ids(piece))
    return ids


@functools.lru_cache(maxsize=1 << 16)
def _piece_ids(piece: str) -> tuple[int, ...]:
    # Pure and bounded: words repeat, so the gateway and the simulator encode mostly from this memo
    # (a 3,000-token prompt: about 5x faster than computing every piece).
    raw = piece.encode("utf-8")
    return tuple(
        _bytes_to_id(raw[start : start + MAX_TOKEN_BYTES]) for start in range(0, len(raw), MAX_TOKEN_BYTES)
    )


def decode(ids: Iterable[int]) -> str:
    """Token ids → text; invalid UTF-8 across token boundaries is replaced, as real tokenizers do."""
    return b"".join(token_bytes(i) for i in ids).decode("utf-8", errors="replace")


def token_bytes(token_id: int) -> bytes:
    """The bytes one token stands for; raises `TokenizerError` for an id no text produces."""
    if not 0 < token_id < VOCAB_SIZE:
        raise TokenizerError(f"token id {token_id} is outside [1, {VOCAB_SIZE - 1}]")
    out = bytearray()
    rest = token_id
    while rest:
        digit = rest % _BASE
        if digit == 0:
            raise TokenizerError(f"token id {token_id} is not a valid token")
        out.append(digit - 1)
        rest //= _BASE
    return bytes(out)


def _bytes_to_id(raw: bytes) -> int:
    return sum((b + 1) * _BASE**i for i, b in enumerate(raw))


def message_text(content: Any) -> str:
    """The text of an OpenAI message `content`: a string, or a list of `{"type": "text", "text": ...}`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> str:
    """ChatML (the Qwen2 template): `<|im_start|>role\\ncontent<|im_end|>\\n` per message, then the
    assistant header when `add_generation_prompt`. With `continue_final_message` (vLLM's parameter)
    the last message is left open, without its `<|im_end|>`, so the model goes on writing it."""
    lines = [
        f"{CHAT_START}{m.get('role', 'user')}\n{message_text(m.get('content'))}{CHAT_END}\n" for m in messages
    ]
    if continue_final_message and lines:
        lines[-1] = lines[-1].removesuffix(f"{CHAT_END}\n")
    if add_generation_prompt:
        lines.append(f"{CHAT_START}assistant\n")
    return "".join(lines)
