"""Deterministic "sampling": which token a request generates next, and when its text must stop.

A request's tokens form a stream selected by a 64-bit `stream_seed`:
- greedy (temperature 0): the seed is a hash of the prompt tokens, so equal prompts give equal text;
- with a `seed`: a hash of (prompt, seed);
- otherwise: fresh entropy from the engine's random source, so repeated calls differ.
Under a LoRA adapter the greedy and seeded seeds also hash the adapter's name, so an adapter's text
differs from the base model's and from every other adapter's for the same prompt, and repeats itself.
Token i of a stream is drawn from `blake2b(stream_seed, i)`: it depends on nothing else (not on batching,
preemption or timing), so a recomputed or disaggregated request continues exactly the same text.

Each token is a word of `WORDS` (every word is at most 4 UTF-8 bytes including its leading space, so
it is exactly one token of `tandem.core.tokenizer`, and encoding the generated text gives back the
generated ids). EOS (`EOS_TOKEN_ID`) is drawn with probability `EOS_PROBABILITY` per token, except for
the first token and the first `min_tokens`, and never with `ignore_eos`; about 1 request in 500 ends
per token, so unbounded requests generate about 500 tokens on average.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from tandem.core.tokenizer import EOS_TOKEN_ID, encode

WORDS: tuple[str, ...] = (
    " the", " a", " of", " and", " to", " in", " is", " it", " on", " for", " was", " as",
    " at", " by", " be", " we", " an", " or", " not", " but", " all", " can", " one", " has",
    " had", " you", " are", " our", " new", " may", " way", " day", " now", " old", " two", " how",
    " its", " who", " sun", " sky", " sea", " red", " big", " cat", " dog", " fox", " owl", " run",
)  # fmt: skip
WORD_IDS: tuple[int, ...] = tuple(encode(word)[0] for word in WORDS)
EOS_PROBABILITY = 1 / 500
_EOS_THRESHOLD = int(EOS_PROBABILITY * 2**32)


def _digest64(*parts: bytes) -> int:
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        digest.update(part)
    return int.from_bytes(digest.digest(), "big")


def _tokens_bytes(token_ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(token_ids)}I", *(t & 0xFFFFFFFF for t in token_ids))


def stream_seed(
    prompt_token_ids: Sequence[int],
    *,
    temperature: float,
    seed: int | None,
    entropy: int,
    adapter: str | None = None,
) -> int:
    """The token stream of a request (module docstring). `entropy` is used only when the request is
    neither greedy nor seeded; greedy wins over a seed, as in vLLM. `adapter` is the LoRA adapter's
    name (None: the base model, whose seeds are unchanged)."""
    scope = b"" if adapter is None else b"lora:" + len(adapter.encode()).to_bytes(4, "big") + adapter.encode()
    if temperature == 0:
        return _digest64(b"greedy", scope, _tokens_bytes(prompt_token_ids))
    if seed is not None:
        seed_bytes = seed.to_bytes(16, "big", signed=True)
        return _digest64(b"seeded", scope, seed_bytes, _tokens_bytes(prompt_token_ids))
    return entropy & 0xFFFFFFFFFFFFFFFF


def garbled(seed: int) -> int:
    """The stream of a request whose prompt KV came partly from another KV generation
    (`tandem.sim.engine.kvlayout`, generations): a real engine computes garbage from such KV, so its
    answer is another text than the one its prompt gives (deterministically)."""
    return _digest64(b"foreign-kv", seed.to_bytes(8, "big"))


def sample_token(seed: int, index: int, *, allow_eos: bool) -> int:
    """Token `index` (0 = the first generated token) of stream `seed`."""
    value = _digest64(seed.to_bytes(8, "big"), index.to_bytes(8, "big"))
    if allow_eos and (value & 0xFFFFFFFF) < _EOS_THRESHOLD:
        return EOS_TOKEN_ID
    return WORD_IDS[(value >> 32) % len(WORD_IDS)]


def find_stop(text: str, stop: Sequence[str], *, new_chars: int) -> tuple[int, str] | None:
    """The earliest stop string that ends within the last `new_chars` characters of `text`, as
    (index where it starts, the string); None if none does. Only the tail is searched, because
    earlier text was searched when it arrived.
    Example: find_stop(" the cat", [" cat"], new_chars=4) == (4, " cat")."""
    best: tuple[int, str] | None = None
    for candidate in stop:
        if not candidate:
            continue
        start = max(0, len(text) - new_chars - len(candidate) + 1)
        index = text.find(candidate, start)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, candidate)
    return best


def stop_buffer(stop: Sequence[str]) -> int:
    """Characters to hold back while streaming so no client ever sees the start of a stop string that
    is then cut: the longest stop string's length minus one (vLLM does the same)."""
    return max((len(s) for s in stop), default=1) - 1


def visible_length(text: str, *, finished: bool, held_back: int) -> int:
    """How much of `text` may be sent: all of it once finished, else all but `held_back` chars."""
    return len(text) if finished else max(0, len(text) - held_back)
