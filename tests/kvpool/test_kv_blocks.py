"""Whole blocks from a paged KV cache to a chunk's per-head bytes and back, on tensors shaped like
each layout, and across tensor-parallel splits of the same cache.

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


def heads_of(layers: list[kv_blocks.Layer]) -> list[int]:
    return list(range(layers[0][1].num_heads))


def gather(layers: list[kv_blocks.Layer], ids: list[int]) -> list[bytes]:
    return kv_blocks.gather_heads(layers, ids, heads_of(layers))


def scatter(layers: list[kv_blocks.Layer], values: list[bytes], ids: list[int], *, skip: int = 0) -> None:
    for head, value in enumerate(values):
        kv_blocks.scatter_head(layers, value, ids, head=head, blocks_per_chunk=2, skip_blocks=skip)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_blocks_gathered_from_one_cache_land_in_the_named_blocks_of_another(
    shape: tuple[int, ...], device: str
) -> None:
    source = [cache(shape, device=device), cache(shape, torch.float32, device)]
    target = [(torch.zeros_like(kv), layout) for kv, layout in source]
    values = gather(source, [3, 7])
    assert len(values) == source[0][1].num_heads
    assert [len(v) for v in values] == [2 * kv_blocks.head_block_bytes(source)] * len(values)

    scatter(target, values, [1, 5])

    for (src, layout), (dst, _) in zip(source, target, strict=True):
        assert torch.equal(blocks_of((dst, layout), [1, 5]), blocks_of((src, layout), [3, 7]))
        others = [b for b in range(BLOCKS) if b not in (1, 5)]
        assert not blocks_of((dst, layout), others).any()


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_a_heads_chunk_is_its_blocks_one_after_the_other(shape: tuple[int, ...], device: str) -> None:
    layer = cache(shape, device=device)
    one_block = kv_blocks.head_block_bytes([layer])
    for head, value in enumerate(gather([layer], [4, 2])):
        assert value[:one_block] == gather([layer], [4])[head]
        assert value[one_block:] == gather([layer], [2])[head]


def test_the_cpu_layout_stores_each_heads_pages_as_the_cache_holds_them() -> None:
    """(B, H, N, K|V): head h of blocks [6, 0] is `kv[[6, 0], h]`'s bytes; with one head per rank
    that is exactly what one value per rank held before heads were stored apart."""
    layer = cache((BLOCKS, H, N, 2 * D))
    kv = layer[0]
    picked = kv.index_select(0, torch.tensor([6, 0]))
    expected = [picked[:, h].contiguous().view(torch.uint8).numpy().tobytes() for h in range(H)]
    assert gather([layer], [6, 0]) == expected
    one_head = cache((BLOCKS, 1, N, 2 * D))
    whole = one_head[0].index_select(0, torch.tensor([6, 0])).contiguous().view(torch.uint8).numpy().tobytes()
    assert gather([one_head], [6, 0]) == [whole]


def test_a_strided_view_gathers_the_same_bytes_as_its_contiguous_copy(device: str) -> None:
    """vLLM 0.32 on CUDA FlashAttention: the logical (B, H, N, K|V) view of memory laid out (B, N, H, K|V)."""
    size = BLOCKS * N * H * 2 * D
    physical = torch.arange(size, dtype=torch.float32, device=device).reshape(BLOCKS, N, H, 2 * D)
    strided = physical.transpose(1, 2)
    assert not strided.is_contiguous()
    layout = infer_layout(tuple(strided.shape), block_size=N)
    values = gather([(strided, layout)], [2, 9])
    assert values == gather([(strided.contiguous(), layout)], [2, 9])

    target = torch.zeros_like(physical).transpose(1, 2)
    scatter([(target, layout)], values, [0, 1])
    assert torch.equal(target[:2], strided[[2, 9]])


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_blocks_already_cached_locally_are_skipped(shape: tuple[int, ...], device: str) -> None:
    source = cache(shape, device=device)
    kv, layout = source
    target = (torch.zeros_like(kv), layout)
    values = gather([source], [3, 7])

    scatter([target], values, [8], skip=1)

    assert torch.equal(blocks_of(target, [8]), blocks_of(source, [7]))
    assert not blocks_of(target, [b for b in range(BLOCKS) if b != 8]).any()


def test_bytes_per_head_and_block_count_every_layer_in_its_own_dtype() -> None:
    layers = [cache((BLOCKS, H, N, 2 * D)), cache((2, BLOCKS, N, H, D), torch.float32)]
    assert kv_blocks.head_block_bytes(layers) == N * 2 * D * 2 + 2 * N * D * 4
    assert kv_blocks.head_block_bytes(layers) * H == H * N * 2 * D * 2 + 2 * N * H * D * 4


# --------------------------------------------------------------------------- across TP splits

TOTAL_HEADS = 4
TP_SHAPES = {
    "vLLM 0.32 (B, H, N, K|V)": ((BLOCKS, TOTAL_HEADS, N, 2 * D), 1),
    "FlashAttention (2, B, N, H, D)": ((2, BLOCKS, N, TOTAL_HEADS, D), 3),
    "FlashInfer (B, 2, N, H, D)": ((BLOCKS, 2, N, TOTAL_HEADS, D), 3),
}


def split(kv: Any, head_axis: int, tp: int) -> list[kv_blocks.Layer]:
    """Rank r's cache of a TP-`tp` engine: its heads' slice of the whole cache, as its own tensor."""
    per_rank = TOTAL_HEADS // tp
    parts = [kv.narrow(head_axis, r * per_rank, per_rank).contiguous() for r in range(tp)]
    return [(part, infer_layout(tuple(part.shape), block_size=N)) for part in parts]


@pytest.mark.parametrize(("shape", "head_axis"), TP_SHAPES.values(), ids=TP_SHAPES.keys())
@pytest.mark.parametrize(("writer_tp", "reader_tp"), [(1, 2), (2, 1), (2, 4), (4, 1), (1, 1)])
def test_heads_written_at_one_tp_load_byte_exact_at_another(
    shape: tuple[int, ...], head_axis: int, writer_tp: int, reader_tp: int, device: str
) -> None:
    """Writer ranks store each of their heads under its global index; reader ranks load their global
    heads into their local ones: every reader rank ends up with exactly its slice of the writer's KV,
    and the bytes moved are the same whatever the two TPs."""
    whole, _ = cache(shape, device=device)
    pool: dict[int, bytes] = {}
    writers = split(whole, head_axis, writer_tp)
    for rank, layer in enumerate(writers):
        first = rank * TOTAL_HEADS // writer_tp
        for local, value in enumerate(gather([layer], [3, 7])):
            pool[first + local] = value
    assert sorted(pool) == list(range(TOTAL_HEADS))
    assert sum(map(len, pool.values())) == 2 * kv_blocks.head_block_bytes([cache(shape)]) * TOTAL_HEADS

    readers = [(torch.zeros_like(kv), layout) for kv, layout in split(whole, head_axis, reader_tp)]
    for rank, layer in enumerate(readers):
        first = rank * TOTAL_HEADS // reader_tp
        scatter([layer], [pool[first + local] for local in range(layer[1].num_heads)], [1, 5])

    for (read, layout), (expected, _) in zip(readers, split(whole, head_axis, reader_tp), strict=True):
        assert torch.equal(blocks_of((read, layout), [1, 5]), blocks_of((expected, layout), [3, 7]))
