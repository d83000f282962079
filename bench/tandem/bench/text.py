"""Filler text of an exact length in Tandem's tokenizer (`tandem.core.tokenizer.encode`).

Benchmarks need prompts of a known token count without shipping a vocabulary, so prompts are built
from English words whose cost is known: every word is written with a leading space, which makes it
one pre-token of its own, and the tokenizer splits a pre-token's UTF-8 bytes into runs of at most 4
bytes. So `" the"` (4 bytes) is 1 token, `" about"` (6 bytes) is 2, `" understand"` (11 bytes) is 3,
and a full stop `"."` after a word is 1 more. Costs add up exactly because pre-tokens never merge
across a space or a symbol: `len(encode(words(rng, n))) == n` for every `n >= 0`.

Real tokenizers (Qwen, Llama) give English about one token per 4 characters, close to this scheme's
one per 3-4, so a prompt of N tokens here is roughly N tokens for a real engine too (the simulator
uses this tokenizer, so there it is exact).
"""

from __future__ import annotations

import random

from tandem.core.tokenizer import encode

#: Common English words; their costs with a leading space range from 1 to 3 tokens.
WORDS: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "is", "it", "for", "on", "was", "as", "with", "be", "at", "by",
    "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you",
    "were", "all", "we", "her", "she", "there", "would", "their", "will", "when", "who", "him",
    "been", "has", "more", "if", "no", "out", "so", "said", "what", "up", "its", "about", "into",
    "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may",
    "then", "first", "any", "like", "now", "my", "such", "make", "over", "our", "even", "most",
    "after", "also", "made", "many", "before", "must", "through", "back", "years", "where", "much",
    "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how",
    "too", "little", "state", "good", "very", "world", "still", "own", "see", "men", "work", "long",
    "here", "between", "both", "life", "being", "under", "never", "same", "another", "know",
    "while", "last", "might", "great", "since", "against", "right", "three", "system", "request",
    "cache", "model", "server", "memory", "answer", "question", "service", "network", "schedule",
    "understand", "information", "development", "government", "important", "experience",
)  # fmt: skip
#: A full stop ends a sentence after this many words on average (one token each).
SENTENCE_WORDS = 12


def word_cost(word: str) -> int:
    """Tokens of `" " + word`: ceil((len(word) + 1) / 4) for ASCII words, e.g. " about" → 2."""
    return len(encode(" " + word))


def words(rng: random.Random, n_tokens: int) -> str:
    """A string of exactly `n_tokens` tokens: words with leading spaces and occasional full stops.

    Deterministic given the state of `rng` (which it advances). `n_tokens` must be >= 0.
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0 (got {n_tokens})")
    parts: list[str] = []
    remaining = n_tokens
    since_stop = 0
    while remaining > 0:
        if since_stop >= SENTENCE_WORDS and rng.random() < 0.5:
            parts.append(".")
            remaining -= 1
            since_stop = 0
            continue
        word, cost = rng.choice(_WORD_COSTS)
        if cost > remaining:
            word = rng.choice(_ONE_TOKEN_WORDS)
            cost = 1
        parts.append(" " + word)
        remaining -= cost
        since_stop += 1
    return "".join(parts)


_WORD_COSTS: tuple[tuple[str, int], ...] = tuple((w, word_cost(w)) for w in WORDS)
_ONE_TOKEN_WORDS: tuple[str, ...] = tuple(w for w, cost in _WORD_COSTS if cost == 1)
