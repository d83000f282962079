"""The KV pool's key layout: LMCache's Redis format, so the pool is shared with LMCache-configured vLLM.

A chunk of `chunk_size` prompt tokens is stored as two Redis strings (no separator before the suffix):
- `<key>kv_bytes`: the raw KV tensor bytes, written first;
- `<key>metadata`: 28 bytes, `struct.pack("=7i", length, memory_fmt, dtype_int, 2, layers, tokens, hidden)`,
  written second. A chunk exists when its metadata exists.
with `key = f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"` (LMCache 0.5.6's
`CacheEngineKey.to_string()` without `@tag%value` parts; its `RedisConnector`, the one a
`redis://` URL selects, appends the suffixes).
LMCache 0.3 (the default engine image's) wrote `f"vllm@{model}@{world_size}@{worker_id}@{chunk_hash:x}"`
instead: its key format (`vllm`) first, no dtype, and its own chain (`LMCache03Hash`).

Chunk hashes are `tandem.core.kvkeys`' (re-exported here): Tandem's SHA-256 chain (the simulator,
Tandem's connector) or LMCache's builtin-hash chain (LMCache inside vLLM, which depends on the engines'
PYTHONHASHSEED). Both chain over full chunks, so chunk i identifies the whole prefix up to its end;
both can be negative: keys look like `qwen@1@0@-7cfefdccc681b183@bfloat16`. `PoolKeys` names a
prompt's chunks as one writer does. Tools that read keys they did not compute treat the hash as
opaque: `parse_key` reads only the fields every writer shares (model, world size, worker, dtype),
which is what stats and flush need.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.core.kvkeys import (
    NONE_HASH,
    ChunkHashScheme,
    LMCache03Hash,
    LMCacheHash,
    TandemHash,
    chunk_hashes,
    lmcache_chunk_hashes,
    lmcache_none_hash,
)

__all__ = [
    "DTYPE_TO_INT",
    "KV_BYTES_SUFFIX",
    "MEMORY_FORMAT_KV_2LTD",
    "METADATA_SUFFIX",
    "NONE_HASH",
    "ChunkHashScheme",
    "ChunkMetadata",
    "LMCache03Hash",
    "LMCacheHash",
    "ParsedKey",
    "PoolKeys",
    "TandemHash",
    "chunk_hashes",
    "chunk_key",
    "decode_metadata",
    "encode_metadata",
    "lmcache_chunk_hashes",
    "lmcache_none_hash",
    "model_pattern",
    "model_patterns",
    "parse_key",
]

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
#: `model@world_size@worker_id@chunk_hash@dtype[@tag%value...]` + suffix. The model part is matched
#: lazily, so a model name containing `@` still parses when the fields after it are well formed.
_KEY = re.compile(
    r"^(?P<model>.+?)@(?P<world_size>\d+)@(?P<worker_id>\d+)@(?P<chunk_hash>-?[0-9a-f]+)"
    r"@(?P<rest>.+?)(?P<suffix>kv_bytes|metadata)$",
    re.DOTALL,
)
#: LMCache 0.3's `vllm@model@world_size@worker_id@chunk_hash[@tag%value...]` + suffix (no dtype).
LMCACHE03_FORMAT = "vllm"
_KEY03 = re.compile(
    r"^vllm@(?P<model>.+?)@(?P<world_size>\d+)@(?P<worker_id>\d+)@(?P<chunk_hash>-?[0-9a-f]+)"
    r"(?P<rest>(?:@[^@%]*%[^@]*)*)(?P<suffix>kv_bytes|metadata)$",
    re.DOTALL,
)


@dataclass(frozen=True)
class ChunkMetadata:
    """The decoded `<key>metadata` value."""

    length: int
    memory_format: int
    dtype_int: int
    shape: tuple[int, int, int, int]


@dataclass(frozen=True)
class ParsedKey:
    """One pool key split into its fields; `base` is the key without its suffix (shared by the pair)."""

    model: str
    world_size: int
    worker_id: int
    chunk_hash: str  # hex as written (LMCache's may be negative); opaque
    dtype: str  # the dtype, followed by any `@tag%value` parts LMCache appends
    suffix: str  # KV_BYTES_SUFFIX or METADATA_SUFFIX
    base: str


def chunk_key(
    *, model: str, chunk_hash: int, world_size: int = 1, worker_id: int = 0, dtype: str = "bfloat16"
) -> str:
    """LMCache's `CacheEngineKey.to_string()` for one chunk (without the kv_bytes/metadata suffix)."""
    return f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolKeys:
    """How one writer names a prompt's chunks: its hash scheme and the key's other fields.

    A reader that asks whether a writer stored a prompt computes the writer's keys: the same model
    part, world size, dtype and hash scheme. Worker 0 by default: its keys stand for the chunk (the
    other ranks of a tensor-parallel writer store theirs alongside, under their own worker ids).
    """

    model: str
    chunk_size: int
    dtype: str = "bfloat16"
    world_size: int = 1
    worker_id: int = 0
    scheme: ChunkHashScheme = field(default_factory=TandemHash)

    def __post_init__(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")

    def chunk_keys(self, token_ids: Sequence[int], suffix: str = METADATA_SUFFIX) -> list[str]:
        """The key (with `suffix`) of every full chunk of `token_ids`, in order."""
        if isinstance(self.scheme, LMCache03Hash):
            base = f"{LMCACHE03_FORMAT}@{self.model}@{self.world_size}@{self.worker_id}@"
            return [f"{base}{h:x}{suffix}" for h in self.scheme.chunk_hashes(token_ids, self.chunk_size)]
        return [
            chunk_key(
                model=self.model,
                chunk_hash=h,
                world_size=self.world_size,
                worker_id=self.worker_id,
                dtype=self.dtype,
            )
            + suffix
            for h in self.scheme.chunk_hashes(token_ids, self.chunk_size)
        ]


def parse_key(key: str) -> ParsedKey | None:
    """The fields of a chunk key (`...kv_bytes` or `...metadata`); None for any other key. LMCache
    0.3's layout is read where the current one does not fit; its dtype is "" (not in its keys).

    >>> parse_key("qwen@1@0@-7cfe@bfloat16metadata").model
    'qwen'
    >>> parse_key("vllm@qwen@1@0@2f7fkv_bytes").model
    'qwen'
    """
    match = _KEY.match(key)
    legacy = _KEY03.match(key) if match is None else None
    found = match or legacy
    if found is None:
        return None
    suffix = found["suffix"]
    return ParsedKey(
        model=found["model"],
        world_size=int(found["world_size"]),
        worker_id=int(found["worker_id"]),
        chunk_hash=found["chunk_hash"],
        dtype=found["rest"] if match is not None else "",
        suffix=suffix,
        base=key[: -len(suffix)],
    )


def model_pattern(model: str) -> str:
    """A Redis SCAN pattern matching every key of one model (`*` and `?` in names escaped)."""
    escaped = model.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?").replace("[", "\\[")
    return f"{escaped}@*"


def model_patterns(model: str) -> tuple[str, str]:
    """`model_pattern` and the same for LMCache 0.3's layout (`vllm@<model>@*`)."""
    return model_pattern(model), f"{LMCACHE03_FORMAT}@{model_pattern(model)}"


def encode_metadata(*, length: int, dtype: str, layers: int, tokens: int, hidden: int) -> bytes:
    """The 28-byte metadata value for a KV_2LTD chunk of `length` bytes."""
    return _METADATA.pack(length, MEMORY_FORMAT_KV_2LTD, DTYPE_TO_INT[dtype], 2, layers, tokens, hidden)


def decode_metadata(raw: bytes) -> ChunkMetadata:
    """Inverse of `encode_metadata`; raises ValueError for a value of the wrong size."""
    if len(raw) != _METADATA.size:
        raise ValueError(f"metadata must be {_METADATA.size} bytes, got {len(raw)}")
    length, fmt, dtype_int, d0, d1, d2, d3 = _METADATA.unpack(raw)
    return ChunkMetadata(length, fmt, dtype_int, (d0, d1, d2, d3))
