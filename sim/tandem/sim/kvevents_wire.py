"""Encode the block pool's KV events as vLLM's msgpack `EventBatch`. Pure: bytes in, bytes out.

The batch is `[ts, events, data_parallel_rank]` (ts: wall seconds since the epoch; rank 0). Each event
is, per `encoding`:

- `"array"` (vLLM before PR #42892, msgspec `array_like=True`): a positional array, tag first,
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]`
  and `["BlockRemoved", block_hashes, medium]`;
- `"map"` (vLLM PR #42892 and later): a map of named fields tagged under `"type"`, carrying also the
  hybrid-cache fields current vLLM sends: `{"type": "BlockStored", "block_hashes": [...],
  "parent_block_hash": None, "token_ids": [...], "block_size": 16, "lora_id": None, "medium": "GPU",
  "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}`,
  `{"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU", "group_idx": 0}`.

A salted request's `BlockStored` also carries `extra_keys`, one entry per block, as vLLM's msgspec
writes a `list[tuple | None]`: the 9th array item, or the `"extra_keys"` field right after
`"lora_name"`. The first block of a sequence has `["<salt>"]` (vLLM's `(cache_salt,)` without LoRA,
multimodal inputs or prompt embeddings; a tuple is a msgpack array), every other block nil. An
unsalted request's events leave the field out, as msgspec omits a None default.

A `BlockStored` of a sequence under a LoRA adapter carries its `lora_id` (the API server's integer id)
and `lora_name`, and the name first in every block's `extra_keys` (`["sql"]`, `["sql", "<salt>"]` on
a salted sequence's first block), as vLLM 0.32 publishes them.

Block hashes are sent as unsigned 64-bit ints, as vLLM does with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
(its default): the simulator's signed hashes are taken modulo 2**64 (-1 is sent as 2**64 - 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgpack  # type: ignore[import-untyped]

from tandem.sim.engine.blocks import BlockRemoved, BlockStored, KVEvent

Encoding = Literal["array", "map"]
MEDIUM_GPU = "GPU"
MASK64 = (1 << 64) - 1


def external_hash(block_hash: int) -> int:
    """The simulator's signed 64-bit block hash as the unsigned int vLLM would publish."""
    return block_hash & MASK64


def encode_batch(
    events: Sequence[KVEvent], *, ts: float, encoding: Encoding, data_parallel_rank: int = 0
) -> bytes:
    """One msgpack `EventBatch` holding `events` in order (module docstring)."""
    encode = _map_event if encoding == "map" else _array_event
    payload: bytes = msgpack.packb([ts, [encode(e) for e in events], data_parallel_rank])
    return payload


def _array_event(event: KVEvent) -> list[object]:
    hashes = [external_hash(h) for h in event.block_hashes]
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return [
            "BlockStored",
            hashes,
            None if parent is None else external_hash(parent),
            list(event.token_ids),
            event.block_size,
            event.lora_id,
            MEDIUM_GPU,
            event.lora_name,
            *([] if event.extra_keys is None else [_extra_keys(event.extra_keys)]),
        ]
    assert isinstance(event, BlockRemoved)
    return ["BlockRemoved", hashes, MEDIUM_GPU]


def _map_event(event: KVEvent) -> dict[str, object]:
    hashes = [external_hash(h) for h in event.block_hashes]
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        extra = {} if event.extra_keys is None else {"extra_keys": _extra_keys(event.extra_keys)}
        return {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": None if parent is None else external_hash(parent),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": MEDIUM_GPU,
            "lora_name": event.lora_name,
            **extra,
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    assert isinstance(event, BlockRemoved)
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU, "group_idx": 0}


def _extra_keys(extra_keys: Sequence[tuple[str, ...] | None]) -> list[list[str] | None]:
    return [None if keys is None else list(keys) for keys in extra_keys]
