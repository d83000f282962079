"""Whole blocks between a paged KV cache and a chunk's bytes, along each layer's block axis.

Imports torch, not vLLM, so the round trip is tested on CPU tensors shaped like each backend's layout.

A chunk's bytes are, layer after layer (in the order given), the chunk's blocks one after the other,
each block being the layer's tensor at one index of its block axis (`KVLayout.block_shape`, other
axes in their order), C-contiguous. For layouts whose block axis is 0 (vLLM 0.32's `(B, H, N, K|V)`,
the CPU backend's) that is exactly `kv.index_select(0, ids)`'s bytes, the format stored before
layouts were read. Bytes are portable only between engines with the same layout, block size, dtype,
KV heads per rank and (on CPU) attention ISA.

Device-agnostic: gathers are made contiguous on the cache's device and copied to the CPU once; loads
are copied to the cache's device and written with `index_copy_`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.kvpool.kv_layout import KVLayout

#: One layer: its KV tensor and where its blocks lie.
Layer = tuple[torch.Tensor, KVLayout]


def block_bytes(layers: Sequence[Layer]) -> int:
    """Bytes of one block across all layers (a chunk holds `chunk_size // block_size` of them)."""
    return sum(layout.block_elements * kv.element_size() for kv, layout in layers)


def gather(layers: Sequence[Layer], block_ids: Sequence[int]) -> bytes:
    """The blocks `block_ids` of every layer, as a chunk's bytes (module docstring)."""
    parts: list[bytes] = []
    for kv, layout in layers:
        index = torch.tensor(list(block_ids), dtype=torch.long, device=kv.device)
        blocks = kv.index_select(layout.block_axis, index).movedim(layout.block_axis, 0)
        parts.append(blocks.contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def scatter(
    layers: Sequence[Layer],
    value: bytes,
    block_ids: Sequence[int],
    *,
    blocks_per_chunk: int,
    skip_blocks: int,
) -> None:
    """Write a chunk's blocks, from its `skip_blocks`-th on, into `block_ids` of every layer.

    `value` holds `blocks_per_chunk` blocks per layer (`len(value) == block_bytes(layers) *
    blocks_per_chunk`, checked by the caller); `len(block_ids) == blocks_per_chunk - skip_blocks`.
    """
    raw = torch.frombuffer(bytearray(value), dtype=torch.uint8)
    offset = 0
    for kv, layout in layers:
        size = layout.block_elements * kv.element_size() * blocks_per_chunk
        blocks = raw[offset : offset + size].view(kv.dtype).view(blocks_per_chunk, *layout.block_shape)
        offset += size
        source = blocks[skip_blocks:].to(kv.device).movedim(0, layout.block_axis)
        index = torch.tensor(list(block_ids), dtype=torch.long, device=kv.device)
        kv.index_copy_(layout.block_axis, index, source)
