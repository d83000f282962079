"""Where the block axis lies in a layer's paged KV tensor, for each attention backend's layout.

Pure: shapes are tuples of ints; nothing here imports torch or vLLM, so the rules are tested in the
default venv. The connector (`tandem.kvpool.vllm_connector`) asks the backend first and falls back on
the tensor's shape; `tandem.kvpool.kv_blocks` then moves whole blocks along `KVLayout.block_axis`.

Layouts placed (B = blocks, N = tokens per block, H = KV heads on this rank, D = head size):

=====================================  ===========================  ==========  =========  ==============
Backend                                Per-layer shape              Block axis  Head axis  K and V
=====================================  ===========================  ==========  =========  ==============
vLLM 0.32, every backend (CPU, FA, …)  ``(B, H, N, 2·D)``           0           1          one tensor, K|V
FlashAttention (earlier vLLM v1)       ``(2, B, N, H, D)``          1           3          axis 0
FlashInfer (earlier vLLM v1)           ``(B, 2, N, H, D)``          0           3          axis 1
MLA (one latent vector per token)      ``(B, N, D)``                0           none       one latent
=====================================  ===========================  ==========  =========  ==============

The head axis (by the number of axes, both ways) lets the connector store each KV head of a block on
its own, so engines of different tensor-parallel sizes read each other's KV (`tandem.kvpool.kv_blocks`).

From the backend (`layout_from_backend`): the backend's `get_kv_cache_shape` is asked for two
different block counts; the one axis whose length follows the count is the block axis, so no table of
backend names is needed. From the shape (`infer_layout`): the table above, by rank, with the K/V axis
(length 2) telling FlashAttention from FlashInfer, and the tokens-per-block axis checked against the
scheduler's block size. A shape neither can place is a `KVLayoutError` naming the shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

#: Two block counts to ask the backend about; any two distinct counts would do.
PROBE_BLOCK_COUNTS = (7, 11)


class KVLayoutError(ValueError):
    """A layer's KV tensor whose block axis cannot be placed, or disagrees with the backend."""


@dataclass(frozen=True)
class KVLayout:
    """One layer's KV tensor: its shape and which axis indexes blocks.

    Invariant: `0 <= block_axis < len(shape)`; `kv_count` is 2 when the tensor holds K and V
    (as two halves of an axis, or one K|V axis) and 1 for MLA's single latent cache; `head_axis` is
    the KV-head axis (None for MLA: one latent, no heads), never the block axis.
    """

    shape: tuple[int, ...]
    block_axis: int
    kv_count: Literal[1, 2]
    source: Literal["backend", "shape"]
    head_axis: int | None = None

    @property
    def num_heads(self) -> int:
        """KV heads on this rank (1 for MLA's latent)."""
        return 1 if self.head_axis is None else self.shape[self.head_axis]

    @property
    def head_block_shape(self) -> tuple[int, ...]:
        """One head's page of one block: the block's shape without the head axis (MLA: the block)."""
        if self.head_axis is None:
            return self.block_shape
        shape = [n for axis, n in enumerate(self.shape) if axis not in (self.block_axis, self.head_axis)]
        return tuple(shape)

    @property
    def head_block_elements(self) -> int:
        """Elements of one head's page of one block, e.g. ``(B, 2, 128, 128)``: 128·128 = 16384."""
        return math.prod(self.head_block_shape)

    @property
    def num_blocks(self) -> int:
        return self.shape[self.block_axis]

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The shape of one block: the tensor's shape without the block axis, other axes in order."""
        return self.shape[: self.block_axis] + self.shape[self.block_axis + 1 :]

    @property
    def block_elements(self) -> int:
        """Elements in one block of this layer, e.g. H=2, N=128, 2·D=128: 2·128·128 = 32768."""
        return math.prod(self.block_shape)

    def hidden(self, block_size: int) -> int:
        """KV heads × head size (LMCache's metadata `hidden`): a block's elements per token per K or V.

        Example: FlashAttention ``(2, B, 16, 8, 128)``: 2·16·8·128 / (16 · 2) = 1024 = 8 heads × 128.
        """
        return self.block_elements // (block_size * self.kv_count)


def _kv_count(shape: Sequence[int]) -> Literal[1, 2]:
    """MLA's cache is 3-D (one latent per token); every K/V layout has four or five axes."""
    return 1 if len(shape) == 3 else 2


def _head_axis(shape: Sequence[int]) -> int | None:
    """The KV-head axis by the number of axes (module docstring's table): none for MLA's 3-D cache."""
    return {3: None, 4: 1, 5: 3}.get(len(shape))


def layout_from_backend(shape: Sequence[int], *, backend_shape: Callable[[int], Sequence[int]]) -> KVLayout:
    """The layout the backend reports: `backend_shape(num_blocks)` is its `get_kv_cache_shape` with the
    layer's block size, KV heads and head size bound.

    The block axis is the one axis whose length follows the block count asked for; `shape` must equal
    the backend's shape on every other axis (a tensor with a different kernel block size, or one the
    backend did not shape, does not). Raises `KVLayoutError` otherwise; exceptions from
    `backend_shape` itself propagate (the caller decides whether to fall back).
    """
    shape = tuple(int(n) for n in shape)
    first, second = (tuple(int(n) for n in backend_shape(count)) for count in PROBE_BLOCK_COUNTS)
    if len(first) != len(second) or len(first) != len(shape):
        raise KVLayoutError(
            f"KV tensor of shape {shape}: the attention backend reports shapes {first} and {second}"
        )
    moving = [axis for axis, (a, b) in enumerate(zip(first, second, strict=True)) if a != b]
    if len(moving) != 1 or first[moving[0]] != PROBE_BLOCK_COUNTS[0]:
        raise KVLayoutError(
            f"KV tensor of shape {shape}: no single block axis in the backend's shapes {first}, {second}"
        )
    axis = moving[0]
    if shape[:axis] + shape[axis + 1 :] != first[:axis] + first[axis + 1 :]:
        raise KVLayoutError(
            f"KV tensor of shape {shape} differs from the attention backend's {first} (block axis {axis}) "
            "outside the block axis: kernel blocks of another size than the scheduler's?"
        )
    head_axis = _head_axis(shape)
    if head_axis == axis:
        raise KVLayoutError(f"KV tensor of shape {shape}: block axis {axis} where the KV heads should lie")
    return KVLayout(
        shape=shape, block_axis=axis, kv_count=_kv_count(shape), source="backend", head_axis=head_axis
    )


def infer_layout(shape: Sequence[int], *, block_size: int, num_blocks: int | None = None) -> KVLayout:
    """The layout read from the tensor's shape alone (the module docstring's table).

    `num_blocks`, when known (the KV cache config's count), must fit on the block axis (vLLM may
    allocate more blocks than the scheduler hands out, never fewer). The tokens-per-block axis must
    equal `block_size`. A five-axis cache of exactly two blocks, `(2, 2, N, H, D)`, is ambiguous and
    refused (the backend's shape settles it).
    """
    shape = tuple(int(n) for n in shape)
    if len(shape) == 5:
        # (2, B, N, H, D) or (B, 2, N, H, D): the block axis is the one of the first two that is not K/V.
        candidates = [axis for axis in (0, 1) if shape[1 - axis] == 2]
        if num_blocks is not None:
            candidates = [axis for axis in candidates if shape[axis] >= num_blocks]
        if len(candidates) != 1:
            raise KVLayoutError(
                f"KV tensor of shape {shape}: neither (2, blocks, block_size, heads, head_size) "
                "(FlashAttention) nor (blocks, 2, block_size, heads, head_size) (FlashInfer), or both"
            )
        axis, token_axis = candidates[0], 2
    elif len(shape) == 4:  # (B, H, N, K|V)
        axis, token_axis = 0, 2
    elif len(shape) == 3:  # MLA (B, N, D)
        axis, token_axis = 0, 1
    else:
        raise KVLayoutError(
            f"KV tensor of shape {shape}: {len(shape)} axes; known layouts have 3 (MLA), "
            "4 (blocks, heads, block_size, K|V) or 5 (FlashAttention, FlashInfer)"
        )
    if shape[token_axis] != block_size:
        raise KVLayoutError(
            f"KV tensor of shape {shape}: {shape[token_axis]} tokens per block on axis {token_axis}, "
            f"but the scheduler's block size is {block_size} (kernel blocks of another size are not "
            "supported)"
        )
    if num_blocks is not None and shape[axis] < num_blocks:
        raise KVLayoutError(
            f"KV tensor of shape {shape}: {shape[axis]} blocks on axis {axis}, fewer than the "
            f"{num_blocks} the KV cache holds"
        )
    return KVLayout(
        shape=shape, block_axis=axis, kv_count=_kv_count(shape), source="shape", head_axis=_head_axis(shape)
    )
