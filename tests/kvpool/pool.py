"""Helpers that write real chunk pairs into a real Redis, the way the pool's writers do."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tandem.kvpool.keys import KV_BYTES_SUFFIX, METADATA_SUFFIX, chunk_hashes, chunk_key, encode_metadata

CHUNK = 16
PAYLOAD = 64


def prompt(n_tokens: int, *, start: int = 1) -> list[int]:
    return list(range(start, start + n_tokens))


def store_prompt(
    client: redis.Redis, model: str, tokens: Sequence[int], *, metadata: bool = True, kv_bytes: bool = True
) -> list[str]:
    """Write every full chunk of `tokens` (bytes first, then metadata); returns the chunks' base keys."""
    bases = []
    for h in chunk_hashes(tokens, CHUNK):
        base = chunk_key(model=model, chunk_hash=h)
        if kv_bytes:
            client.set(base + KV_BYTES_SUFFIX, b"x" * PAYLOAD)
        if metadata:
            meta = encode_metadata(length=PAYLOAD, dtype="bfloat16", layers=1, tokens=CHUNK, hidden=1)
            client.set(base + METADATA_SUFFIX, meta)
        bases.append(base)
    return bases
