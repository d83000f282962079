"""Whole blocks from a paged KV cache to a chunk's bytes and back, on tensors shaped like each layout.

Real torch (skipped where torch is not importable: the default venv has none; `.venv-vllm` has it).
The caches are plain tensors of each backend's shape, filled with distinct values; no vLLM. Each test
runs on CPU tensors, and again on CUDA tensors where a CUDA device is present (a GPU machine; skipped
elsewhere).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tandem.kvpool import kv_blocks  # noqa: E402 -- needs torch, skipped above without it
from tandem.kvpool.kv_layout import infer_layout  # noqa: E402

BLOCKS, N, H, D = 10, 16, 2, 8
SHAPES = {
    "vLLM 0.32 (B, H, N, K|V)": (BLOCKS, H, N, 2 * D),
    "FlashAttention (2, B, N, H, D)": (2, BLOCKS, N, H, D),
    "FlashInfer (B, 2, N, H, D)": (BLOCKS, 2, N, H, D),
    "MLA (B, N, D)": (BLOCKS, N, 4 * D),
}


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def cache(shape: tuple[int, ...], dtype: Any = torch.bfloat16, device: str = "cpu") -> kv_blocks.Layer:
    kv = torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).to(device, dtype)
    return kv, infer_layout(shape, block_size=N)


def blocks_of(layer: kv_blocks.Layer, ids: list[int]) -> Any:
    kv, layout = layer
    return kv.index_select(layout.block_axis, torch.tensor(ids, device=kv.device))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_blocks_gathered_from_one_cache_land_in_the_named_blocks_of_another(
    shape: tuple[int, ...], device: str
) -> None:
    source = [cache(shape, device=device), cache(shape, torch.float32, device)]
    target = [(torch.zeros_like(kv), layout) for kv, layout in source]
    value = kv_blocks.gather(source, [3, 7])
    assert len(value) == 2 * kv_blocks.block_bytes(source)

    kv_blocks.scatter(target, value, [1, 5], blocks_per_chunk=2, skip_blocks=0)

    for (src, layout), (dst, _) in zip(source, target, strict=True):
        assert torch.equal(blocks_of((dst, layout), [1, 5]), blocks_of((src, layout), [3, 7]))
        others = [b for b in range(BLOCKS) if b not in (1, 5)]
        assert not blocks_of((dst, layout), others).any()


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_chunk_is_its_blocks_one_after_the_other(shape: tuple[int, ...], device: str) -> None:
    layer = cache(shape, device=device)
    one_block = kv_blocks.block_bytes([layer])
    value = kv_blocks.gather([layer], [4, 2])
    assert value[:one_block] == kv_blocks.gather([layer], [4])
    assert value[one_block:] == kv_blocks.gather([layer], [2])


def test_the_cpu_layout_keeps_the_byte_format_of_index_select_on_dimension_0() -> None:
    layer = cache((BLOCKS, H, N, 2 * D))
    kv = layer[0]
    expected = kv.index_select(0, torch.tensor([6, 0])).contiguous().view(torch.uint8).numpy().tobytes()
    assert kv_blocks.gather([layer], [6, 0]) == expected


def test_a_strided_view_gathers_the_same_bytes_as_its_contiguous_copy(device: str) -> None:
    """vLLM 0.32 on CUDA FlashAttention: the logical (B, H, N, K|V) view of memory laid out (B, N, H, K|V)."""
    size = BLOCKS * N * H * 2 * D
    physical = torch.arange(size, dtype=torch.float32, device=device).reshape(BLOCKS, N, H, 2 * D)
    strided = physical.transpose(1, 2)
    assert not strided.is_contiguous()
    layout = infer_layout(tuple(strided.shape), block_size=N)
    value = kv_blocks.gather([(strided, layout)], [2, 9])
    assert value == kv_blocks.gather([(strided.contiguous(), layout)], [2, 9])

    target = torch.zeros_like(physical).transpose(1, 2)
    kv_blocks.scatter([(target, layout)], value, [0, 1], blocks_per_chunk=2, skip_blocks=0)
    assert torch.equal(target[:2], strided[[2, 9]])


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_blocks_already_cached_locally_are_skipped(shape: tuple[int, ...], device: str) -> None:
    source = cache(shape, device=device)
    kv, layout = source
    target = (torch.zeros_like(kv), layout)
    value = kv_blocks.gather([source], [3, 7])

    kv_blocks.scatter([target], value, [8], blocks_per_chunk=2, skip_blocks=1)

    assert torch.equal(blocks_of(target, [8]), blocks_of(source, [7]))
    assert not blocks_of(target, [b for b in range(BLOCKS) if b != 8]).any()


def test_bytes_per_block_count_every_layer_in_its_own_dtype() -> None:
    layers = [cache((BLOCKS, H, N, 2 * D)), cache((2, BLOCKS, N, H, D), torch.float32)]
    assert kv_blocks.block_bytes(layers) == H * N * 2 * D * 2 + 2 * N * H * D * 4
