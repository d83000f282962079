"""What the simulator writes to and expects from the external KV pool: LMCache's Redis layout.

A prompt's full `chunk_size`-token chunks are stored under `tandem.kvpool.keys` keys (world size 1,
worker 0), hashed with Tandem's chain in the request's scope (its `cache_salt` and LoRA adapter) and,
with a pool key (`TANDEM_KV_POOL_KEY`), keyed: `TandemHash(key).chunk_hashes(tokens, chunk_size,
scope=PoolScope(cache_salt=salt, lora_name=adapter))`, as Tandem's connector does. Per
chunk, `<key>kv_bytes` holds `payload_size` real bytes and `<key>metadata` the 28-byte header with the
*true* KV shape [2, layers, chunk_size, kv_heads × head_dim] and `length` = the stored byte count; a
keyed writer appends the 32-byte tag `chunk_mac(pool_key, key, header, kv_bytes)` (`seal_metadata`,
as Tandem's connector writes it), and a keyed reader loads a chunk only if its tag verifies. The
payload is scaled down by `bytes_scale` so a local Redis stays small:

    payload_size = round(chunk_size × kv_bytes_per_token × bytes_scale)

Example: Qwen2.5-7B (57,344 B/token), 256-token chunks, scale 1/64 → 256 × 57,344 / 64 = 229,376 B
per chunk instead of 14.7 MB. With scale 1 the values match what LMCache itself writes.

**Generations** (`generation`, `--kv-generation`): engines of another image or KV-relevant argument
write KV that is garbage to each other under the *same* keys (the keys carry the model, world size
and dtype, not the image). A simulated engine with a generation fills its chunks with bytes of its
generation (the chunk hash XOR a hash of the generation), and as a reader it loads a chunk of another
generation as a real engine would, since nothing in the layout tells them apart, but knows it did:
`foreign(chunk, kv_bytes)`. Without a generation the bytes are the chunk hash and nothing is foreign.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tandem.kvpool.keys import (
    KV_BYTES_SUFFIX,
    METADATA_SUFFIX,
    Scope,
    TandemHash,
    check_chunk,
    chunk_key,
    decode_metadata,
    encode_metadata,
    seal_metadata,
)
from tandem.sim.engine.profiles import ModelShape

DEFAULT_BYTES_SCALE = 1 / 64
#: A chunk read back: usable, absent or incomplete (missing or short bytes, unreadable metadata), or
#: refused by a keyed reader: no tag (`untagged`) or a tag that does not verify (`mac`).
ChunkVerdict = Literal["ok", "incomplete", "untagged", "mac"]


@dataclass(frozen=True)
class ChunkRef:
    """One full chunk of a prompt: its index, chained hash, Redis key (`name`, no suffix) and the
    two keys stored under it."""

    index: int
    chunk_hash: int
    name: str

    @property
    def kv_bytes_key(self) -> str:
        return self.name + KV_BYTES_SUFFIX

    @property
    def metadata_key(self) -> str:
        return self.name + METADATA_SUFFIX


@dataclass(frozen=True)
class PoolLayout:
    """How one engine names, sizes and seals its chunks in the pool (module docstring). `key` is the
    pool key (`tandem.kvpool.client.pool_key_from_env`), None for an unkeyed pool."""

    model_name: str
    shape: ModelShape
    chunk_size: int = 256
    bytes_scale: float = DEFAULT_BYTES_SCALE
    key: bytes | None = field(default=None, repr=False)
    generation: str | None = None

    @property
    def payload_size(self) -> int:
        """Bytes stored per chunk (at least 1)."""
        return max(1, round(self.chunk_size * self.shape.kv_bytes_per_token * self.bytes_scale))

    def chunks(self, token_ids: Sequence[int], *, scope: Scope = None) -> list[ChunkRef]:
        """The full chunks of `token_ids` in `scope` (`PoolScope` of the request's `cache_salt` and
        adapter), in order; a partial tail chunk is never stored."""
        hashes = TandemHash(key=self.key).chunk_hashes(token_ids, self.chunk_size, scope=scope)
        return [
            ChunkRef(
                index,
                chunk_hash,
                chunk_key(model=self.model_name, chunk_hash=chunk_hash, dtype=self.shape.dtype),
            )
            for index, chunk_hash in enumerate(hashes)
        ]

    def header(self) -> bytes:
        """LMCache's 28-byte metadata header, the same for every chunk."""
        return encode_metadata(
            length=self.payload_size,
            dtype=self.shape.dtype,
            layers=self.shape.layers,
            tokens=self.chunk_size,
            hidden=self.shape.kv_hidden,
        )

    def metadata(self, chunk: ChunkRef, payload: bytes) -> bytes:
        """The metadata value of `chunk` holding `payload`: the header, sealed with its tag when keyed."""
        if self.key is None:
            return self.header()
        return seal_metadata(self.key, name=chunk.name, metadata=self.header(), kv_bytes=payload)

    def payload(self, chunk: ChunkRef) -> bytes:
        """Deterministic filler bytes for one chunk: its hash (XOR its generation's), repeated."""
        pattern = self._pattern(chunk)
        size = self.payload_size
        return (pattern * (size // 8 + 1))[:size]

    def foreign(self, chunk: ChunkRef, kv_bytes: bytes) -> bool:
        """Whether `kv_bytes`, read back for `chunk`, were written by another generation (module
        docstring); always False without a generation."""
        if self.generation is None:
            return False
        return kv_bytes[:8] != self._pattern(chunk)[: len(kv_bytes)]

    def _pattern(self, chunk: ChunkRef) -> bytes:
        value = chunk.chunk_hash & 0xFFFFFFFFFFFFFFFF
        if self.generation is not None:
            digest = hashlib.blake2b(self.generation.encode(), digest_size=8).digest()
            value ^= int.from_bytes(digest, "big")
        return value.to_bytes(8, "big")

    def check(self, chunk: ChunkRef, metadata: bytes | None, kv_bytes: bytes | None) -> ChunkVerdict:
        """Whether a chunk read back may be loaded: its metadata decodes and `kv_bytes` has exactly
        `length` bytes, and, for a keyed reader, its tag verifies over its name, header and bytes."""
        if metadata is None or kv_bytes is None:
            return "incomplete"
        try:
            complete = decode_metadata(metadata).length == len(kv_bytes)
        except ValueError:
            return "incomplete"
        if not complete:
            return "incomplete"
        if self.key is None:
            return "ok"
        return check_chunk(self.key, name=chunk.name, metadata=metadata, kv_bytes=kv_bytes)
