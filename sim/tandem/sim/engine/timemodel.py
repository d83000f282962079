"""The roofline time model: how long one engine step takes, in simulated seconds.

A step runs every scheduled sequence's new tokens through the model once. It is bound either by
compute or by memory traffic, whichever is slower, plus a fixed per-step overhead:

    compute_s = 2 × params × new_tokens / (peak_flops × mfu)
    memory_s  = (weight_bytes + context_tokens × kv_bytes_per_token) / memory_bandwidth
    load_s    = loaded_tokens × kv_bytes_per_token / pool_bandwidth
    step_s    = max(compute_s, memory_s) + step_overhead_s + load_s

`context_tokens` sums, over the sequences in the step, the tokens whose KV the step reads (the tokens
already computed plus the new ones). `load_s` is the synchronous load of KV from the external pool for
requests admitted in this step (LMCache loads before the forward pass that needs it).

Worked example, `qwen2.5-7b-h100` (2 × 7.6e9 = 1.52e10 FLOPs per token; 989e12 × 0.5 = 4.945e14 FLOP/s):
- prefill of one 2048-token prompt: compute = 1.52e10 × 2048 / 4.945e14 = 62.95 ms; memory =
  (15.2e9 + 2048 × 57,344) / 3.35e12 = 4.57 ms; step = 62.95 + 2 = 64.95 ms (compute-bound);
- decode of one sequence at 1000 tokens of context: compute = 1.52e10 / 4.945e14 = 0.03 ms; memory =
  (15.2e9 + 1000 × 57,344) / 3.35e12 = 4.55 ms; step = 4.55 + 2 = 6.55 ms (memory-bound, and the
  weights are 99.6% of the bytes);
- the two bounds meet at about 148 new tokens per step when context is short: below it batching
  decode sequences is nearly free, above it the step grows linearly with tokens.
Attention FLOPs (which grow with context) are not modelled; nor are CUDA graphs or kernel efficiency.

LoRA adapters (`engine/lora.py`) add to a step: every distinct adapter of the batch has its weights
read once (`adapter_bytes` in the memory term) and makes the multi-adapter kernels slower by
`lora_adapter_overhead` of the roofline time; adapters moved before the step cost their transfer:

    roofline_s = max(compute_s, memory_s) × (1 + lora_adapter_overhead × num_adapters)
    lora_load_s = host_bytes / lora_host_bandwidth
                + disk_bytes / lora_disk_bandwidth + disk_loads × lora_disk_overhead_s
    step_s     = roofline_s + step_overhead_s + load_s + lora_load_s

Example, `qwen2.5-7b-h100`, decode of 64 sequences at 1000 tokens under 4 rank-16 adapters (80.7 MB
each) already on the GPU: memory = 5.63 + 4 × 80.7e6 / 3.35e12 = 5.73 ms; × (1 + 0.05 × 4) = 6.87 ms;
step = 8.87 ms (7.63 ms without LoRA). Copying one of them from the CPU tier first adds
80.7e6 / 25e9 = 3.23 ms; reading it from disk adds 80.7e6 / 2e9 + 50 ms = 90.4 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.sim.engine.lora import AdapterMoves
from tandem.sim.engine.profiles import Profile


@dataclass(frozen=True)
class BatchShape:
    """What one step computes. All counts are tokens; `num_seqs` is the number of sequences."""

    num_seqs: int
    new_tokens: int
    context_tokens: int
    loaded_tokens: int = 0
    num_adapters: int = 0
    adapter_bytes: float = 0.0
    moves: AdapterMoves = field(default_factory=AdapterMoves)


@dataclass(frozen=True)
class StepTime:
    """The parts of one step's duration, in simulated seconds."""

    compute_s: float
    memory_s: float
    overhead_s: float
    load_s: float
    lora_factor: float = 1.0
    lora_load_s: float = 0.0

    @property
    def total_s(self) -> float:
        """max(compute, memory) × lora_factor + overhead + load + lora_load."""
        roofline = max(self.compute_s, self.memory_s) * self.lora_factor
        return roofline + self.overhead_s + self.load_s + self.lora_load_s

    @property
    def bound(self) -> str:
        """Which roofline limits the step: "compute" or "memory"."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def step_time(profile: Profile, batch: BatchShape) -> StepTime:
    """The duration of one step of `batch` on `profile` (module docstring: formulas and examples).
    An empty batch takes no time, unless it had adapters to load (an idle engine loading one)."""
    lora_load = _lora_load_s(profile, batch.moves)
    if batch.num_seqs == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0, lora_load_s=lora_load)
    model, device = profile.model, profile.accelerator
    compute = 2.0 * model.params * batch.new_tokens / (device.peak_flops * profile.mfu)
    memory_bytes = model.weight_bytes + batch.context_tokens * model.kv_bytes_per_token + batch.adapter_bytes
    memory = memory_bytes / device.memory_bandwidth
    load = batch.loaded_tokens * model.kv_bytes_per_token / profile.pool_bandwidth
    return StepTime(
        compute_s=compute,
        memory_s=memory,
        overhead_s=profile.step_overhead_s,
        load_s=load,
        lora_factor=1.0 + profile.lora_adapter_overhead * batch.num_adapters,
        lora_load_s=lora_load,
    )


def _lora_load_s(profile: Profile, moves: AdapterMoves) -> float:
    """Seconds to move adapters before a step (module docstring)."""
    disk = moves.disk_bytes / profile.lora_disk_bandwidth + moves.disk_loads * profile.lora_disk_overhead_s
    return moves.host_bytes / profile.lora_host_bandwidth + disk
