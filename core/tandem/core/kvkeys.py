"""The chained chunk hash shared by the simulator's block hashes and the KV pool's keys.

Chunk hashes chain over full chunks only, so chunk i identifies the whole prefix up to its end:
`h_i = H(h_{i-1}, tokens[i*C:(i+1)*C])`, `h_{-1} = 0`, with H the first 8 bytes (big-endian, signed) of
SHA-256 over the parent as 8 signed big-endian bytes followed by the tokens as little-endian uint32
(ids above 2**32-1 are reduced mod 2**32). Like LMCache's builtin hash it can be negative.

The pool's key layout built on it (LMCache's `model@world_size@worker_id@chunk_hash@dtype` plus the
`kv_bytes`/`metadata` pair) lives in `tandem.kvpool.keys`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

NONE_HASH = 0


def chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, parent: int = NONE_HASH) -> list[int]:
    """Chained hashes of every *full* chunk of `token_ids`; a partial tail chunk has none.

    `parent` continues a chain: `chunk_hashes(b, C, parent=chunk_hashes(a, C)[-1])` equals the tail of
    `chunk_hashes(a + b, C)` when `len(a)` is a multiple of `C` (the simulator extends block hashes
    this way as a sequence grows, instead of rehashing it from the start).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    hashes: list[int] = []
    for start in range(0, len(token_ids) - chunk_size + 1, chunk_size):
        chunk = token_ids[start : start + chunk_size]
        digest = hashlib.sha256(parent.to_bytes(8, "big", signed=True))
        digest.update(struct.pack(f"<{len(chunk)}I", *(t & 0xFFFFFFFF for t in chunk)))
        parent = int.from_bytes(digest.digest()[:8], "big", signed=True)
        hashes.append(parent)
    return hashes
