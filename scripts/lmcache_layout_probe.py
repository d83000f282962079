"""LMCache's in-process GPU connector (VLLMPagedMemGPUConnectorV2) on vLLM 0.26's per-layer KV view:
(num_blocks, num_kv_heads, block_size, 2*head_size), a permuted view of (NB, BS, NH, 2*HS) memory.

Saves two blocks of a 'producer' cache through `from_gpu` and loads them into two other blocks of a
zeroed 'consumer' cache through `to_gpu`, with the buffer width LMCache up to 0.5.6 computes for a model
(num_kv_heads*head_size) and with twice that, and prints per layer how many tokens arrive equal and how
many tokens outside the target blocks were written. Needs CUDA and LMCache (its compiled ops); run on
a CUDA machine (docs/vllm.md, "CUDA runs"): `python3 scripts/lmcache_layout_probe.py`.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from lmcache.v1.gpu_connector.gpu_connectors import VLLMPagedMemGPUConnectorV2
from lmcache.v1.memory_management import MemoryFormat

# The tiny model (tandem dev tiny-model): 2 layers, 2 KV heads, head size 64; vLLM's CUDA block size 16.
NB, BS, NH, HS, NL = 64, 16, 2, 64, 2


def say(line: str) -> None:
    sys.stdout.write(line + "\n")


def packed_view(raws: list[torch.Tensor]) -> list[torch.Tensor]:
    """What vLLM 0.26 hands connectors: (NB, NH, BS, 2*HS) over (NB, BS, NH, 2*HS) memory."""
    return [raw.permute(0, 2, 1, 3) for raw in raws]


def round_trip(width: int, producer: list[torch.Tensor], consumer: list[torch.Tensor]) -> None:
    """Producer blocks 1-2 through LMCache's connector into consumer blocks 5-6, at buffer `width`."""
    for raw in consumer:
        raw.zero_()
    saved, loaded = torch.arange(1 * BS, 3 * BS), torch.arange(5 * BS, 7 * BS)
    buffer = torch.zeros(2, NL, saved.numel(), width, dtype=torch.bfloat16, device="cuda")
    memory = SimpleNamespace(tensor=buffer, metadata=SimpleNamespace(fmt=MemoryFormat.KV_2LTD))
    saver = VLLMPagedMemGPUConnectorV2(hidden_dim_size=width, num_layers=NL, use_gpu=False)
    saver.from_gpu(memory, 0, saved.numel(), kvcaches=packed_view(producer), slot_mapping=saved.cuda())
    torch.cuda.synchronize()
    say(f"[width {width}] format {saver.engine_kv_format}, block size {saver.block_size}")
    loader = VLLMPagedMemGPUConnectorV2(hidden_dim_size=width, num_layers=NL, use_gpu=False)
    loader.to_gpu(memory, 0, saved.numel(), kvcaches=packed_view(consumer), slot_mapping=loaded.cuda())
    torch.cuda.synchronize()
    for layer in range(NL):
        want = producer[layer].reshape(NB * BS, -1)[saved.cuda()]
        tokens = consumer[layer].reshape(NB * BS, -1)
        equal = int((tokens[loaded.cuda()] == want).all(dim=1).sum())
        written = (tokens != 0).any(dim=1)
        outside = int(written.sum()) - int(written[loaded.cuda()].sum())
        say(f"[width {width}] layer {layer}: {equal}/{saved.numel()} equal, {outside} written elsewhere")


def main() -> None:
    torch.manual_seed(0)
    producer = [torch.randn(NB, BS, NH, 2 * HS, dtype=torch.bfloat16, device="cuda") for _ in range(NL)]
    consumer = [torch.zeros_like(raw) for raw in producer]
    for width in (NH * HS, NH * 2 * HS):  # LMCache's sizing, then K|V's
        try:
            round_trip(width, producer, consumer)
        except Exception as error:  # noqa: BLE001 (a diagnostic: report and go on)
            say(f"[width {width}] {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
