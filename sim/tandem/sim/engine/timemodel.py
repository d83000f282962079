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
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.sim.engine.profiles import Profile


@dataclass(frozen=True)
class BatchShape:
    """What one step computes. All counts are tokens; `num_seqs` is the number of sequences."""

    num_seqs: int
    new_tokens: int
    context_tokens: int
    loaded_tokens: int = 0


@dataclass(frozen=True)
class StepTime:
    """The parts of one step's duration, in simulated seconds."""

    compute_s: float
    memory_s: float
    overhead_s: float
    load_s: float

    @property
    def total_s(self) -> float:
        """max(compute, memory) + overhead + load."""
        return max(self.compute_s, self.memory_s) + self.overhead_s + self.load_s

    @property
    def bound(self) -> str:
        """Which roofline limits the step: "compute" or "memory"."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def step_time(profile: Profile, batch: BatchShape) -> StepTime:
    """The duration of one step of `batch` on `profile` (module docstring: formulas and examples).
    An empty batch takes no time."""
    if batch.num_seqs == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0)
    model, device = profile.model, profile.accelerator
    compute = 2.0 * model.params * batch.new_tokens / (device.peak_flops * profile.mfu)
    memory_bytes = model.weight_bytes + batch.context_tokens * model.kv_bytes_per_token
    memory = memory_bytes / device.memory_bandwidth
    load = batch.loaded_tokens * model.kv_bytes_per_token / profile.pool_bandwidth
    return StepTime(compute_s=compute, memory_s=memory, overhead_s=profile.step_overhead_s, load_s=load)
