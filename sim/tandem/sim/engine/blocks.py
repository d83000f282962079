"""Paged KV blocks with prefix caching, as vLLM v1's block pool does it.

The cache has `num_blocks` blocks of `block_size` tokens. Invariants:
- a block is *used* while some request holds it (ref_count > 0) and *free* otherwise;
- every free block sits in one LRU free queue, least recently freed first; allocation takes from the
  front, so a freed block that holds a cached prefix survives as long as possible;
- a full block may carry a block hash (chained over all earlier tokens, so equal hashes mean equal
  prefixes); hashed blocks stay findable while free, until allocation reuses (evicts) them;
- a request frees its blocks tail first, so the end of a prompt is evicted before its start.

Usage (`vllm:kv_cache_usage_perc`) is used blocks / total: cached but free blocks count as free.

Every block that gains a hash is reported as `BlockStored` and every hash that is evicted as
`BlockRemoved`, through the optional `on_event` callback: the hook for vLLM-style KV events. A salted
owner's runs carry vLLM's per-block `extra_keys`: `(salt,)` on the sequence's first block, None on
the others (vLLM adds the salt to the first block's extra keys only). An owner under a LoRA adapter
has the adapter's name first in every block's extra keys, as vLLM 0.32 publishes them
(`to_event_extra_keys` of `("lora", name, path)` is the bare name): `(name, salt)` or `(name,)` on the
first block, `(name,)` on the others, and its events carry `lora_id` and `lora_name`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.sim.engine.lora import LoRARef


@dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one sequence became cached. `token_ids` holds their tokens, in order.
    `extra_keys` (vLLM's, one entry per block) is None for an unsalted sequence of the base model;
    otherwise the module docstring's entries. `lora_id`/`lora_name` name the adapter (None: base)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[tuple[str, ...] | None, ...] | None = None
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks were evicted to make room."""

    block_hashes: tuple[int, ...]


KVEvent = BlockStored | BlockRemoved
KVEventSink = Callable[[KVEvent], None]


@dataclass(frozen=True)
class _Chain:
    """The owner's sequence a run of newly cached blocks belongs to."""

    token_ids: Sequence[int]
    block_hashes: Sequence[int]
    cache_salt: str | None
    lora: LoRARef | None = None


def _extra_keys(
    cache_salt: str | None, lora_name: str | None, *, run_start: int, count: int
) -> tuple[tuple[str, ...] | None, ...] | None:
    """vLLM's `extra_keys` for `count` blocks from block `run_start` of a sequence (module docstring).
    Example: salt "t", a run of 3 blocks from block 0 → `(("t",), None, None)`; from block 2 → all None;
    under adapter "sql" with salt "t" from block 0 → `(("sql", "t"), ("sql",), ("sql",))`."""
    if cache_salt is None and lora_name is None:
        return None
    lora = (lora_name,) if lora_name is not None else ()
    first = lora + ((cache_salt,) if cache_salt is not None else ())
    rest = lora or None
    head = (first or None) if run_start == 0 else rest
    return (head,) + (rest,) * (count - 1)


@dataclass
class _Block:
    ref_count: int = 0
    block_hash: int | None = None


class BlockPool:
    """The KV cache of one engine: allocation, ref counts, the prefix cache and LRU eviction."""

    def __init__(self, *, num_blocks: int, block_size: int, on_event: KVEventSink | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._on_event = on_event
        self._blocks = [_Block() for _ in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._owned: dict[str, list[int]] = {}
        self._num_hashed: dict[str, int] = {}  # leading blocks of an owner that are registered

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return (self.num_blocks - len(self._free)) / self.num_blocks

    def blocks_of(self, owner: str) -> tuple[int, ...]:
        return tuple(self._owned.get(owner, ()))

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def cached_prefix(self, block_hashes: Sequence[int], *, num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of a sequence of `num_tokens` tokens whose full blocks
        hash to `block_hashes`. At least one token is always left to compute, so a fully cached
        sequence of 32 tokens in 16-token blocks hits (32 - 1) // 16 = 1 block, not 2."""
        max_blocks = (num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in block_hashes[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def allocate(
        self,
        owner: str,
        *,
        num_tokens: int,
        token_ids: Sequence[int],
        block_hashes: Sequence[int],
        computed_blocks: Sequence[int] = (),
        cache_salt: str | None = None,
        lora: LoRARef | None = None,
    ) -> bool:
        """Give `owner` enough blocks for its first `num_tokens` tokens; False (and no change) when
        the free blocks do not suffice. `computed_blocks` (cache hits from `cached_prefix`, only when
        the owner holds nothing yet) are shared, not copied. Full blocks among the first `num_tokens`
        get their hash from `block_hashes` (already rooted at the owner's `cache_salt`) and become
        findable by other requests; `cache_salt` and `lora` only shape the events."""
        blocks = self._owned.get(owner, [])
        needed = math.ceil(num_tokens / self.block_size) - len(blocks) - len(computed_blocks)
        # Touching a cached block that is free takes it out of the free queue.
        reclaimed = sum(1 for b in computed_blocks if self._blocks[b].ref_count == 0)
        if needed > len(self._free) - reclaimed:
            return False
        blocks = self._owned.setdefault(owner, blocks)
        for block_id in computed_blocks:
            self._touch(block_id)
            blocks.append(block_id)
        if computed_blocks:
            self._num_hashed[owner] = len(computed_blocks)
        evicted = [self._take_free_block(blocks) for _ in range(max(0, needed))]
        evicted_hashes = tuple(h for h in evicted if h is not None)
        if evicted_hashes:
            self._emit(BlockRemoved(evicted_hashes))
        full = min(num_tokens // self.block_size, len(block_hashes))
        chain = _Chain(token_ids, block_hashes, cache_salt, lora)
        self._register(owner, blocks, full=full, chain=chain)
        return True

    def free(self, owner: str) -> None:
        """Release every block of `owner`, tail first; hashed blocks stay cached while free."""
        for block_id in reversed(self._owned.pop(owner, [])):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        self._num_hashed.pop(owner, None)

    def _touch(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_free_block(self, blocks: list[int]) -> int | None:
        """Pop the least recently freed block for `blocks`; return the hash it evicted, if any."""
        block_id, _ = self._free.popitem(last=False)
        block = self._blocks[block_id]
        evicted = block.block_hash
        if evicted is not None and self._cached.get(evicted) == block_id:
            del self._cached[evicted]
        block.block_hash = None
        block.ref_count = 1
        blocks.append(block_id)
        return evicted

    def _register(
        self,
        owner: str,
        blocks: list[int],
        *,
        full: int,
        chain: _Chain,
    ) -> None:
        """Hash the owner's blocks [already registered, full) and report each contiguous new run."""
        start = self._num_hashed.get(owner, 0)
        run: list[int] = []
        run_start = start
        for index in range(start, full):
            block_hash = chain.block_hashes[index]
            if block_hash in self._cached:  # another block already holds this prefix
                self._flush_run(run, run_start, chain)
                run, run_start = [], index + 1
                continue
            self._blocks[blocks[index]].block_hash = block_hash
            self._cached[block_hash] = blocks[index]
            run.append(block_hash)
        self._flush_run(run, run_start, chain)
        self._num_hashed[owner] = max(start, full)

    def _flush_run(self, run: list[int], run_start: int, chain: _Chain) -> None:
        if not run:
            return
        size = self.block_size
        parent = chain.block_hashes[run_start - 1] if run_start > 0 else None
        tokens = tuple(chain.token_ids[run_start * size : (run_start + len(run)) * size])
        lora = chain.lora
        lora_name = lora.name if lora is not None else None
        extra_keys = _extra_keys(chain.cache_salt, lora_name, run_start=run_start, count=len(run))
        lora_id = lora.int_id if lora is not None else None
        self._emit(BlockStored(tuple(run), parent, tokens, size, extra_keys, lora_id, lora_name))

    def _emit(self, event: KVEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)
