"""What the simulator writes to and expects from the external KV pool: LMCache's Redis layout.

A prompt's full `chunk_size`-token chunks are stored under `tandem.kvpool.keys` keys (world size 1,
worker 0). Per chunk, `<key>kv_bytes` holds `payload_size` real bytes and `<key>metadata` the
28-byte header with the *true* KV shape [2, layers, chunk_size, kv_heads × head_dim] and `length` =
the stored byte count. The payload is scaled down by `bytes_scale` so a local Redis stays small:

    payload_size = round(chunk_size × kv_bytes_per_token × bytes_scale)

Example: Qwen2.5-7B (57,344 B/token), 256-token chunks, scale 1/64 → 256 × 57,344 / 64 = 229,376 B
per chunk instead of 14.7 MB. With scale 1 the values match what LMCache itself writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.kvpool.keys import (
    KV_BYTES_SUFFIX,
    METADATA_SUFFIX,
    chunk_hashes,
    chunk_key,
    decode_metadata,
    encode_metadata,
)
from tandem.sim.engine.profiles import ModelShape

DEFAULT_BYTES_SCALE = 1 / 64


@dataclass(frozen=True)
class ChunkRef:
    """One full chunk of a prompt: its index, chained hash and Redis keys."""

    index: int
    chunk_hash: int
    kv_bytes_key: str
    metadata_key: str


@dataclass(frozen=True)
class PoolLayout:
    """How one engine names and sizes its chunks in the pool (module docstring)."""

    model_name: str
    shape: ModelShape
    chunk_size: int = 256
    bytes_scale: float = DEFAULT_BYTES_SCALE

    @property
    def payload_size(self) -> int:
        """Bytes stored per chunk (at least 1)."""
        return max(1, round(self.chunk_size * self.shape.kv_bytes_per_token * self.bytes_scale))

    def chunks(self, token_ids: Sequence[int]) -> list[ChunkRef]:
        """The full chunks of `token_ids`, in order; a partial tail chunk is never stored."""
        refs = []
        for index, chunk_hash in enumerate(chunk_hashes(token_ids, self.chunk_size)):
            key = chunk_key(model=self.model_name, chunk_hash=chunk_hash, dtype=self.shape.dtype)
            refs.append(ChunkRef(index, chunk_hash, key + KV_BYTES_SUFFIX, key + METADATA_SUFFIX))
        return refs

    def metadata(self) -> bytes:
        return encode_metadata(
            length=self.payload_size,
            dtype=self.shape.dtype,
            layers=self.shape.layers,
            tokens=self.chunk_size,
            hidden=self.shape.kv_hidden,
        )

    def payload(self, chunk: ChunkRef) -> bytes:
        """Deterministic filler bytes for one chunk (its hash, repeated)."""
        pattern = (chunk.chunk_hash & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
        size = self.payload_size
        return (pattern * (size // 8 + 1))[:size]

    def is_complete(self, metadata: bytes | None, kv_bytes: bytes | None) -> bool:
        """A chunk is usable when its metadata decodes and `kv_bytes` has exactly `length` bytes."""
        if metadata is None or kv_bytes is None:
            return False
        try:
            return decode_metadata(metadata).length == len(kv_bytes)
        except ValueError:
            return False
