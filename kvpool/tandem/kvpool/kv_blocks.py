"""Whole blocks between a paged KV cache and a chunk's bytes, one KV head at a time.

Imports torch, not vLLM, so the round trip is tested on CPU tensors shaped like each backend's layout.

A chunk is stored per KV head (`tandem.kvpool.connector_plan.HeadGrid`): one head's bytes are, layer
after layer (in the order given), the chunk's blocks one after the other, each block being that
head's page of the layer's tensor at one index of its block axis (`KVLayout.head_block_shape`, other
axes in their order), C-contiguous. MLA's cache has no head axis: its one "head" is the whole block.
For vLLM 0.32's `(B, H, N, K|V)` (the CPU backend's) a head's block is `kv[block, head]`, the page the
attention kernel reads, so the bytes do not depend on how many heads a rank holds: a writer of any
tensor-parallel size and a reader of any other move the same pages. Bytes are portable only between
engines with the same layout, block size, dtype, head size and (on CPU) attention ISA.

Device-agnostic: gathers are made contiguous on the cache's device and copied to the CPU once per
layer; loads are copied to the cache's device and written with `index_copy_` into the head's view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.kvpool.kv_layout import KVLayout

#: One layer: its KV tensor and where its blocks and heads lie.
Layer = tuple[torch.Tensor, KVLayout]


def head_block_bytes(layers: Sequence[Layer]) -> int:
    """Bytes of one head's page of one block across all layers (a stored head holds `chunk_size //
    block_size` of them)."""
    return sum(layout.head_block_elements * kv.element_size() for kv, layout in layers)


def gather_heads(layers: Sequence[Layer], block_ids: Sequence[int], heads: Sequence[int]) -> list[bytes]:
    """The blocks `block_ids` of every layer, one chunk value per local head in `heads` (module
    docstring). MLA layers (no head axis) take `heads == [0]`."""
    parts: list[list[bytes]] = [[] for _ in heads]
    for kv, layout in layers:
        index = torch.tensor(list(block_ids), dtype=torch.long, device=kv.device)
        blocks = kv.index_select(layout.block_axis, index).movedim(layout.block_axis, 0)
        if layout.head_axis is None:
            data = blocks.contiguous().cpu().view(torch.uint8).numpy().tobytes()
            for part in parts:
                part.append(data)
            continue
        axis = layout.head_axis + (1 if layout.head_axis < layout.block_axis else 0)
        per_head = blocks.movedim(axis, 0).contiguous().cpu()
        for part, head in zip(parts, heads, strict=True):
            part.append(per_head[head].view(torch.uint8).numpy().tobytes())
    return [b"".join(part) for part in parts]


def scatter_head(
    layers: Sequence[Layer],
    value: bytes,
    block_ids: Sequence[int],
    *,
    head: int,
    blocks_per_chunk: int,
    skip_blocks: int,
) -> None:
    """Write one head's chunk value, its blocks from the `skip_blocks`-th on, into local head `head` of
    blocks `block_ids` of every layer (MLA: the whole blocks, `head == 0`).

    `value` holds `blocks_per_chunk` head pages per layer (`len(value) == head_block_bytes(layers) *
    blocks_per_chunk`, checked by the caller); `len(block_ids) == blocks_per_chunk - skip_blocks`.
    """
    raw = torch.frombuffer(bytearray(value), dtype=torch.uint8)
    offset = 0
    for kv, layout in layers:
        size = layout.head_block_elements * kv.element_size() * blocks_per_chunk
        pages = raw[offset : offset + size].view(kv.dtype).view(blocks_per_chunk, *layout.head_block_shape)
        offset += size
        target, block_axis = kv, layout.block_axis
        if layout.head_axis is not None:
            target = kv.select(layout.head_axis, head)
            block_axis -= 1 if layout.head_axis < layout.block_axis else 0
        source = pages[skip_blocks:].to(kv.device).movedim(0, block_axis)
        index = torch.tensor(list(block_ids), dtype=torch.long, device=kv.device)
        target.index_copy_(block_axis, index, source)
