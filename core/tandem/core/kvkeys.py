"""The KV pool's key layout: LMCache's Redis format, so the pool is shared with LMCache-configured vLLM.

A chunk of `chunk_size` prompt tokens is stored as two Redis strings (no separator before the suffix):
- `<key>kv_bytes`: the raw KV tensor bytes, written first;
- `<key>metadata`: 28 bytes, `struct.pack("=7i", length, memory_fmt, dtype_int, 2, layers, tokens, hidden)`,
  written second. A chunk exists when its metadata exists.
with `key = f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"`.

Chunk hashes chain over full chunks only, so chunk i identifies the whole prefix up to its end:
`h_i = H(h_{i-1}, tokens[i*C:(i+1)*C])`, `h_{-1} = 0`, with H the first 8 bytes (big-endian, signed) of
SHA-256 over the parent as 8 signed big-endian bytes followed by the tokens as little-endian uint32
(ids above 2**32-1 are reduced mod 2**32). Like LMCache's builtin hash it can be negative:
keys look like `qwen@1@0@-7cfefdccc681b183@bfloat16`. Real LMCache hashes differently (Python's `hash`,
seeded by PYTHONHASHSEED), so treat keys written by real engines as opaque.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

KV_BYTES_SUFFIX = "kv_bytes"
METADATA_SUFFIX = "metadata"
#: LMCache MemoryFormat.KV_2LTD: a tensor shaped [2 (K and V), layers, tokens, kv_heads * head_dim].
MEMORY_FORMAT_KV_2LTD = 1
#: LMCache's DTYPE_TO_INT table.
DTYPE_TO_INT = {
    "half": 1,
    "float16": 2,
    "bfloat16": 3,
    "float": 4,
    "float32": 4,
    "double": 5,
    "uint8": 6,
    "fp8_e4m3fn": 7,
    "fp8_e5m2": 8,
}
_METADATA = struct.Struct("=7i")
NONE_HASH = 0


@dataclass(frozen=True)
class ChunkMetadata:
    """The decoded `<key>metadata` value."""

    length: int
    memory_format: int
    dtype_int: int
    shape: tuple[int, int, int, int]


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


def chunk_key(
    *, model: str, chunk_hash: int, world_size: int = 1, worker_id: int = 0, dtype: str = "bfloat16"
) -> str:
    """LMCache's `CacheEngineKey.to_string()` for one chunk (without the kv_bytes/metadata suffix)."""
    return f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"


def model_pattern(model: str) -> str:
    """A Redis SCAN pattern matching every key of one model (`*` and `?` in names escaped)."""
    escaped = model.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?").replace("[", "\\[")
    return f"{escaped}@*"


def encode_metadata(*, length: int, dtype: str, layers: int, tokens: int, hidden: int) -> bytes:
    """The 28-byte metadata value for a KV_2LTD chunk of `length` bytes."""
    return _METADATA.pack(length, MEMORY_FORMAT_KV_2LTD, DTYPE_TO_INT[dtype], 2, layers, tokens, hidden)


def decode_metadata(raw: bytes) -> ChunkMetadata:
    """Inverse of `encode_metadata`; raises ValueError for a value of the wrong size."""
    if len(raw) != _METADATA.size:
        raise ValueError(f"metadata must be {_METADATA.size} bytes, got {len(raw)}")
    length, fmt, dtype_int, d0, d1, d2, d3 = _METADATA.unpack(raw)
    return ChunkMetadata(length, fmt, dtype_int, (d0, d1, d2, d3))
