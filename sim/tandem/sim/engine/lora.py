"""LoRA adapters in the engine core: which adapters a request runs under, where their weights are, and
what moving them costs, after vLLM 0.32's `LRUCacheWorkerLoRAManager`.

An adapter's weights live in up to two tiers:
- **CPU** (vLLM's LoRA cache, `--max-cpu-loras` entries, LRU): an adapter gets there from disk when it
  is added (`--lora-modules` at start-up, `/v1/load_lora_adapter`, the filesystem resolver) or when a
  batch needs one the cache has evicted since;
- **GPU** (`--max-loras` slots, LRU): a step whose batch holds an adapter that is not in a slot copies
  it there from the CPU tier first (evicting the least recently used slot).
GPU slots are a subset of the CPU tier: evicting an adapter from the CPU tier frees its slot too, as
`LRUCacheLoRAModelManager.remove_oldest_adapter` deactivates what it removes.

The scheduler keeps at most `max_loras` distinct adapters in one batch (`scheduler.py`), so a batch's
adapters always fit the slots. The costs of the moves are in `timemodel.step_time`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

#: vLLM's `MaxLoRARanks` (`vllm/config/lora.py`): the only values `--max-lora-rank` takes.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRARef:
    """One adapter as a request carries it: vLLM's `LoRARequest` fields that matter to the engine.
    `int_id` is the id the API server gave it (1, 2, ... in load order; the KV events' `lora_id`);
    `nbytes` is the size of its weights (rank × the profile's bytes per rank)."""

    name: str
    int_id: int
    path: str
    rank: int
    nbytes: float


@dataclass(frozen=True)
class LoRAConfig:
    """`--enable-lora` and its limits: `max_loras` adapters per batch (and GPU slots), `max_cpu_loras`
    adapters in the CPU tier (>= max_loras)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1


@dataclass
class AdapterMoves:
    """The adapter weights one step had to move before it could run, in bytes and counts."""

    disk_loads: int = 0
    disk_bytes: float = 0.0
    host_loads: int = 0
    host_bytes: float = 0.0

    def __bool__(self) -> bool:
        """Whether anything moved (or, pending, has to)."""
        return bool(self.disk_loads or self.host_loads)

    def add(self, other: AdapterMoves) -> None:
        self.disk_loads += other.disk_loads
        self.disk_bytes += other.disk_bytes
        self.host_loads += other.host_loads
        self.host_bytes += other.host_bytes


@dataclass
class AdapterCache:
    """The CPU and GPU tiers (module docstring), both LRU. Names are adapter names.

    Example (max_loras 1, max_cpu_loras 2): add a, add b (two disk loads); a batch with a copies a to
    the GPU (one host load); a batch with b copies b (a host load, a leaves its slot); add c evicts the
    CPU tier's oldest, a; a batch with a loads it from disk and copies it (a disk and a host load)."""

    config: LoRAConfig
    cpu: OrderedDict[str, None] = field(default_factory=OrderedDict)
    gpu: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, ref: LoRARef, *, reload: bool = False) -> AdapterMoves:
        """`add_lora`: read `ref` from disk into the CPU tier unless it is there (or `reload`, vLLM's
        `load_inplace`, reads it again)."""
        moves = AdapterMoves()
        if reload:
            self.cpu.pop(ref.name, None)
            self.gpu.pop(ref.name, None)
        self._to_cpu(ref, moves)
        return moves

    def activate(self, refs: Iterable[LoRARef]) -> AdapterMoves:
        """Make every adapter of a batch GPU-resident (at most `max_loras` distinct ones)."""
        moves = AdapterMoves()
        for ref in refs:
            self._to_cpu(ref, moves)
            if ref.name in self.gpu:
                self.gpu.move_to_end(ref.name)
                continue
            while len(self.gpu) >= self.config.max_loras:
                self.gpu.popitem(last=False)
            self.gpu[ref.name] = None
            moves.host_loads += 1
            moves.host_bytes += ref.nbytes
        return moves

    def _to_cpu(self, ref: LoRARef, moves: AdapterMoves) -> None:
        if ref.name in self.cpu:
            self.cpu.move_to_end(ref.name)
            return
        while len(self.cpu) >= self.config.max_cpu_loras:
            oldest, _ = self.cpu.popitem(last=False)
            self.gpu.pop(oldest, None)
        self.cpu[ref.name] = None
        moves.disk_loads += 1
        moves.disk_bytes += ref.nbytes
