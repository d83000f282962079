"""Hand-built vLLM KV-event payloads, written with msgpack directly (not with our encoders), in the
layouts msgspec produces: `array_like=True` positional arrays with the tag first and trailing
defaults omitted, and tagged maps (vLLM PR #42892)."""

from __future__ import annotations

from collections.abc import Sequence

import msgpack  # type: ignore[import-untyped]


def pack(value: object) -> bytes:
    payload: bytes = msgpack.packb(value)
    return payload


def stored_array(
    hashes: Sequence[int | bytes],
    tokens: Sequence[int],
    *,
    parent: int | bytes | None = None,
    block_size: int = 4,
    medium: str | None = "GPU",
) -> list[object]:
    """A vLLM 0.10-0.x `BlockStored` (lora_id, medium, lora_name present; later fields omitted)."""
    return ["BlockStored", list(hashes), parent, list(tokens), block_size, None, medium, None]


def removed_array(hashes: Sequence[int | bytes], *, medium: str | None = "GPU") -> list[object]:
    return ["BlockRemoved", list(hashes), medium]


def stored_map(
    hashes: Sequence[int | bytes],
    tokens: Sequence[int],
    *,
    parent: int | bytes | None = None,
    block_size: int = 4,
    medium: str | None = "GPU",
) -> dict[str, object]:
    """A current vLLM `BlockStored` as a map, with the fields vLLM 0.26 sends."""
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed_map(hashes: Sequence[int | bytes], *, medium: str | None = "GPU") -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, "group_idx": 0}


def batch(*events: object, ts: float = 1.5, rank: int | None = 0) -> bytes:
    """`[ts, events, data_parallel_rank]`, the batch envelope of both encodings."""
    return pack([ts, list(events), rank])
