"""The KV pool's key layout: LMCache's Redis format, so the pool is shared with LMCache-configured vLLM.

A chunk of `chunk_size` prompt tokens is stored as two Redis strings (no separator before the suffix):
- `<key>kv_bytes`: the raw KV tensor bytes, written first;
- `<key>metadata`: 28 bytes, `struct.pack("=7i", length, memory_fmt, dtype_int, 2, layers, tokens, hidden)`,
  written second. A chunk exists when its metadata exists. A keyed writer (Tandem's connector with a
  pool key) appends a 32-byte tag: `chunk_mac(pool_key, key, first 28 bytes, kv_bytes)`, so the value
  is 60 bytes and the commit marker carries the proof; readers with the key load only chunks whose tag
  verifies (`check_chunk`). LMCache never reads keyed entries (their hashes are not its own).
with `key = f"{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"` (LMCache 0.5.6's
`CacheEngineKey.to_string()`; its `RedisConnector`, the one a `redis://` URL selects, appends the
suffixes), and for a LoRA adapter's or a salted request to LMCache engines their tags after the
dtype, `...@bfloat16@lora%sql@salt%<32 hex>` (`tandem.core.kvkeys.lmcache_tags`).
LMCache 0.3 (the default engine image's) wrote `f"vllm@{model}@{world_size}@{worker_id}@{chunk_hash:x}"`
instead: its key format (`vllm`) first, no dtype, and its own chain (`LMCache03Hash`).

Chunk hashes are `tandem.core.kvkeys`' (re-exported here): Tandem's chain (the simulator, Tandem's
connector; keyed with the pool key when there is one, rooted per scope) or LMCache's builtin-hash chain
(LMCache inside vLLM, which depends on the engines' PYTHONHASHSEED). Both chain over full chunks, so
chunk i identifies the whole prefix up to its end; both can be negative: keys look like
`qwen@1@0@-7cfefdccc681b183@bfloat16`. `PoolKeys` names a prompt's chunks as one writer does, in a
scope (`PoolScope`: vLLM's `cache_salt` and the LoRA adapter's `lora_name`;
`tandem.core.kvkeys.scope_root`). Tools that read keys they did not compute treat the hash as opaque:
`parse_key` reads only the fields every writer shares (model, world size, worker, dtype), which is
what stats and flush need.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tandem.core.kvkeys import (
    NONE_HASH,
    ChunkHashScheme,
    LMCache03Hash,
    LMCacheCborHash,
    LMCacheHash,
    PoolScope,
    Scope,
    TandemHash,
    chunk_hashes,
    keyed_chunk_hashes,
    lmcache_cbor_chunk_hashes,
    lmcache_cbor_none_hash,
    lmcache_chunk_hashes,
    lmcache_none_hash,
    lmcache_salt_tag,
    lmcache_tags,
    scope_root,
)

__all__ = [
    "DTYPE_TO_INT",
    "KV_BYTES_SUFFIX",
    "MAC_BYTES",
    "MEMORY_FORMAT_KV_2LTD",
    "METADATA_BYTES",
    "METADATA_SUFFIX",
    "NONE_HASH",
    "ChunkHashScheme",
    "ChunkMetadata",
    "LMCache03Hash",
    "LMCacheCborHash",
    "LMCacheHash",
    "ParsedKey",
    "PoolKeys",
    "PoolScope",
    "Scope",
    "TandemHash",
    "check_chunk",
    "chunk_hashes",
    "chunk_key",
    "chunk_mac",
    "decode_metadata",
    "encode_metadata",
    "keyed_chunk_hashes",
    "lmcache_cbor_chunk_hashes",
    "lmcache_cbor_none_hash",
    "lmcache_chunk_hashes",
    "lmcache_none_hash",
    "lmcache_salt_tag",
    "model_pattern",
    "model_patterns",
    "parse_key",
    "pool_key",
    "scope_root",
    "seal_metadata",
    "split_metadata",
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
#: LMCache's metadata value: one group's 7 int32s.
METADATA_BYTES = _METADATA.size
#: The tag a keyed writer appends to the metadata value.
MAC_BYTES = 32
_MAC_PERSON = b"tandem-kv-mac"
_POOL_KEY_PERSON = b"tandem-pool-key"
#: A chunk's tag check: verified, no tag where one is required, or a tag that does not verify.
ChunkCheck = Literal["ok", "untagged", "mac"]
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
    other ranks of an LMCache writer store theirs alongside, under their own worker ids; Tandem's
    connector stores one entry per KV head, world size = pipeline stages, worker = the head (of stage
    0): `tandem.kvpool.connector_plan.HeadGrid`).
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

    def chunk_keys(
        self, token_ids: Sequence[int], suffix: str = METADATA_SUFFIX, *, scope: Scope = None
    ) -> list[str]:
        """The key (with `suffix`) of every full chunk of `token_ids` in `scope` (`PoolScope`: the
        request's `cache_salt` and adapter; a bare salt; None: the shared base scope), in order.
        LMCache's chains ignore the scope, as LMCache does; LMCache 0.5.6's keys end with the
        adapter's and the salt's tags (`lmcache_tags`: the gateway tags such requests to LMCache
        engines)."""
        hashes = self.scheme.chunk_hashes(token_ids, self.chunk_size, scope=scope)
        if isinstance(self.scheme, LMCache03Hash):
            base = f"{LMCACHE03_FORMAT}@{self.model}@{self.world_size}@{self.worker_id}@"
            return [f"{base}{h:x}{suffix}" for h in hashes]
        tags = lmcache_tags(scope) if isinstance(self.scheme, LMCacheHash | LMCacheCborHash) else ""
        return [
            chunk_key(
                model=self.model,
                chunk_hash=h,
                world_size=self.world_size,
                worker_id=self.worker_id,
                dtype=self.dtype,
            )
            + tags
            + suffix
            for h in hashes
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
    """Inverse of `encode_metadata`, for LMCache's 28-byte value and a keyed writer's 28 + 32 (the tag
    is ignored here: `check_chunk` verifies it); raises ValueError for a value of another size."""
    header, _tag = split_metadata(raw)
    length, fmt, dtype_int, d0, d1, d2, d3 = _METADATA.unpack(header)
    return ChunkMetadata(length, fmt, dtype_int, (d0, d1, d2, d3))


def split_metadata(raw: bytes) -> tuple[bytes, bytes | None]:
    """A metadata value's 28-byte header and its tag (None for LMCache's untagged value); ValueError
    for any other size.

    >>> split_metadata(bytes(28))[1] is None
    True
    >>> len(split_metadata(bytes(60))[1] or b"")
    32
    """
    if len(raw) == METADATA_BYTES:
        return raw, None
    if len(raw) == METADATA_BYTES + MAC_BYTES:
        return raw[:METADATA_BYTES], raw[METADATA_BYTES:]
    raise ValueError(
        f"metadata must be {METADATA_BYTES} or {METADATA_BYTES + MAC_BYTES} bytes, got {len(raw)}"
    )


def pool_key(secret: str) -> bytes:
    """The 32-byte key of the pool's keyed hashes and tags from the secret `TANDEM_KV_POOL_KEY` holds
    (any string; the operator and `tandem up` generate 32 random bytes, hex): BLAKE2b-256 of its UTF-8
    bytes, personalised. A hash, not a slow KDF: the secret is machine-generated, not a password."""
    if not secret:
        raise ValueError("the pool secret is empty")
    return hashlib.blake2b(secret.encode(), digest_size=32, person=_POOL_KEY_PERSON).digest()


def chunk_mac(key: bytes, name: str, metadata: bytes, kv_bytes: bytes) -> bytes:
    """The 32-byte tag of one stored chunk: keyed BLAKE2b-256 (person `tandem-kv-mac`) over
    `be64(len(name)) || name || be64(len(metadata)) || metadata || kv_bytes`.

    `name` is the chunk's key without its suffix (`ChunkNamer.base`, `chunk_key`), so a valid chunk
    copied under another name (another scope, model or rank) fails; `metadata` is the 28-byte header
    (a tag never covers itself). Lengths are prefixed so no two (name, metadata) pairs share an input.
    """
    mac = hashlib.blake2b(key=key, digest_size=MAC_BYTES, person=_MAC_PERSON)
    encoded = name.encode()
    mac.update(len(encoded).to_bytes(8, "big"))
    mac.update(encoded)
    mac.update(len(metadata).to_bytes(8, "big"))
    mac.update(metadata)
    mac.update(kv_bytes)
    return mac.digest()


def seal_metadata(key: bytes, *, name: str, metadata: bytes, kv_bytes: bytes) -> bytes:
    """The metadata value a keyed writer stores: the 28-byte header followed by its tag."""
    if len(metadata) != METADATA_BYTES:
        raise ValueError(f"metadata must be {METADATA_BYTES} bytes, got {len(metadata)}")
    return metadata + chunk_mac(key, name, metadata, kv_bytes)


def check_chunk(key: bytes, *, name: str, metadata: bytes, kv_bytes: bytes) -> ChunkCheck:
    """Whether a chunk read back may be loaded by a reader holding `key`: `ok` when the metadata's tag
    is `chunk_mac` of the name, header and bytes (compared in constant time); `untagged` for a value
    without a tag (LMCache's, a writer without the key, or an attacker's); `mac` for a wrong tag or a
    value of another size (forged, corrupted, written under another key, or bytes of another write)."""
    try:
        header, tag = split_metadata(metadata)
    except ValueError:
        return "mac"
    if tag is None:
        return "untagged"
    return "ok" if hmac.compare_digest(tag, chunk_mac(key, name, header, kv_bytes)) else "mac"
