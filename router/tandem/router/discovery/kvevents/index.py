"""The precise prefix index: which endpoint's KV cache holds which prompt prefix, from its KV events.

Pure and synchronous (no I/O, no clock); one instance per router process, used from one event loop.

Dual keys (llm-d-kv-cache's design). The router cannot reproduce an engine's block hash (vLLM's
default is SHA-256 over a pickle seeded per process), so the index keys blocks by its own *router
keys*, `tandem.core.blockhash.block_keys` over the token ids that `BlockStored` carries, and keeps per
endpoint a map *engine hash → router key* that is used only to find a block's parent when it is stored
and to resolve `BlockRemoved`. A request is looked up by computing its router keys over its full
blocks and walking them from the first while the endpoint holds them.

Rules, per endpoint:
- `BlockStored` chains its blocks from the parent's router key. With `parent_block_hash` None, that
  is the root of the sequence's key space, `scope_key(lora_name=..., cache_salt=...)` with the salt
  its first block's `extra_keys` carry (`decode.first_block_salt`): `ROOT_KEY` for neither,
  `namespace_key(lora_name)` for an adapter alone, a root per (adapter, salt) otherwise; the gateway
  roots a request's keys the same way. Otherwise it is the key the parent's engine hash maps to (vLLM
  puts the salt on a sequence's first block only; the parent's key already lies in its scope). If the
  parent's engine hash is unknown (events missed, or the parent was evicted from this index), the
  tokens before the run are unknown, so the run is chained from a *detached* root derived from that
  engine hash: its blocks are tracked (so `BlockRemoved` and later children stay consistent) but no
  request walk from the root can reach them. Counted in `detached_stores`.
- A `BlockStored` without token ids (a copy of known blocks to another medium, e.g. CPU offload)
  reuses the router keys its engine hashes already map to; unknown ones are skipped (`unmapped`).
- A block is held per (engine hash, medium), medium None meaning "GPU"; it stays in the index while
  any medium holds it, and a match counts it whatever the medium.
- `BlockRemoved` drops the (engine hash, medium) holders; a key whose last holder goes is deleted, so
  removing block k of a chain makes every walk stop before k (blocks after k stay until removed too).
- `AllBlocksCleared` (and `clear`) empties the endpoint. Events of a KV-cache group whose kind is not
  full attention (`kv_cache_spec_kind`, hybrid models) are ignored, as are removals in such a group.
- Memory is bounded: at most `max_blocks_per_endpoint` router keys per endpoint, least recently stored
  first out (storing a child also refreshes its parent). Size it above the engine's `num_gpu_blocks`
  so in normal operation only the engine's own `BlockRemoved` events evict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tandem.core.blockhash import block_keys, namespace_key, scope_key
from tandem.router.discovery.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from tandem.router.discovery.kvevents.ports import KeyedPrompt

GPU = "GPU"
FULL_ATTENTION = "full_attention"
#: 256k blocks of 16 tokens = 4M tokens per endpoint (about 4x a 7B model's cache on one H100).
DEFAULT_MAX_BLOCKS_PER_ENDPOINT = 262_144

Holder = tuple[int, str]  # (engine block hash, medium)


@dataclass(frozen=True)
class EndpointStats:
    """What the index holds for one endpoint and how often it had to guess; counters are totals."""

    blocks: int
    block_size: int | None
    evicted: int
    detached_stores: int
    unmapped: int


@dataclass
class _Endpoint:
    block_size: int | None = None
    blocks: OrderedDict[int, set[Holder]] = field(default_factory=OrderedDict)  # router key → holders
    engine_keys: dict[int, int] = field(default_factory=dict)  # engine hash → router key
    ignored_groups: set[int] = field(default_factory=set)
    evicted: int = 0
    detached_stores: int = 0
    unmapped: int = 0


class PrecisePrefixIndex:
    """Router keys per endpoint, fed by decoded KV events (module docstring). Implements
    `PrefixSource` (`match`) and the subscriber's `EventSink` (`apply`, `clear`)."""

    def __init__(self, *, max_blocks_per_endpoint: int = DEFAULT_MAX_BLOCKS_PER_ENDPOINT) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError(f"max_blocks_per_endpoint must be >= 1, got {max_blocks_per_endpoint}")
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self._endpoints: dict[str, _Endpoint] = {}

    def endpoints(self) -> list[str]:
        """Endpoints that have had at least one event (and were not removed)."""
        return list(self._endpoints)

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None:
        """Apply one batch of events from `endpoint`, in order."""
        state = self._endpoints.setdefault(endpoint, _Endpoint())
        for event in events:
            if isinstance(event, BlockStored):
                self._store(state, event)
            elif isinstance(event, BlockRemoved):
                self._remove(state, event)
            elif isinstance(event, AllBlocksCleared):
                self._reset(state)

    def clear(self, endpoint: str) -> None:
        """Forget what `endpoint` caches (its engine restarted or dropped its cache); keeps its stats."""
        state = self._endpoints.get(endpoint)
        if state is not None:
            self._reset(state)

    def forget(self, endpoint: str) -> None:
        """Forget `endpoint` entirely, stats included (it left discovery)."""
        self._endpoints.pop(endpoint, None)

    def stats(self, endpoint: str) -> EndpointStats:
        state = self._endpoints.get(endpoint) or _Endpoint()
        return EndpointStats(
            blocks=len(state.blocks),
            block_size=state.block_size,
            evicted=state.evicted,
            detached_stores=state.detached_stores,
            unmapped=state.unmapped,
        )

    def longest_prefix(
        self,
        endpoints: Iterable[str] | None,
        token_ids: Sequence[int],
        *,
        block_size: int | None = None,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> dict[str, int]:
        """Tokens of the longest prefix of `token_ids` each endpoint holds, in full blocks: 0 for an
        endpoint without events. `endpoints=None` asks every known endpoint. The block size is the one
        the endpoint's events carry unless `block_size` is given; only blocks stored under the same
        adapter and `cache_salt` count. Example (blocks of 16): a 100-token prompt whose first 5
        blocks were stored matches 80 tokens; its last 4 tokens never match."""
        root = scope_key(lora_name=lora_name, cache_salt=cache_salt)
        memo: dict[int, Sequence[int]] = {}

        def keys(size: int) -> Sequence[int]:
            if size not in memo:
                memo[size] = block_keys(token_ids, size, parent=root)
            return memo[size]

        return self._longest(endpoints, keys, block_size=block_size)

    def match(self, endpoints: Iterable[str], prompt: KeyedPrompt) -> dict[str, int]:
        """`PrefixSource.match`: each endpoint's own block size; the prompt's keys are rooted in its
        scope (`scope_key` of its adapter and salt) by the prompt's owner."""
        return self._longest(endpoints, prompt.block_keys, block_size=None)

    def _longest(
        self,
        endpoints: Iterable[str] | None,
        keys_for: Callable[[int], Sequence[int]],
        *,
        block_size: int | None,
    ) -> dict[str, int]:
        names = list(self._endpoints) if endpoints is None else list(endpoints)
        matched: dict[str, int] = {}
        for name in names:
            state = self._endpoints.get(name)
            size = block_size or (state.block_size if state is not None else None)
            if state is None or size is None or not state.blocks:
                matched[name] = 0
                continue
            hits = 0
            blocks = state.blocks
            for key in keys_for(size):
                if key not in blocks:
                    break
                hits += 1
            matched[name] = hits * size
        return matched

    def _store(self, state: _Endpoint, event: BlockStored) -> None:
        if event.kv_cache_spec_kind not in (None, FULL_ATTENTION):
            if event.group_idx is not None:
                state.ignored_groups.add(event.group_idx)
            return
        state.block_size = event.block_size
        medium = event.medium or GPU
        parent = self._parent_key(state, event)
        keys = block_keys(event.token_ids, event.block_size, parent=parent) if event.token_ids else []
        for index, engine_hash in enumerate(event.block_hashes):
            key = keys[index] if index < len(keys) else state.engine_keys.get(engine_hash)
            if key is None:
                state.unmapped += 1
                continue
            self._hold(state, key, (engine_hash, medium))
        if parent in state.blocks:  # a parent with a new child is in use: keep the chain's head
            state.blocks.move_to_end(parent)
        self._evict_over_cap(state)

    def _parent_key(self, state: _Endpoint, event: BlockStored) -> int:
        if event.parent_block_hash is None:
            return scope_key(lora_name=event.lora_name, cache_salt=event.cache_salt)
        known = state.engine_keys.get(event.parent_block_hash)
        if known is not None:
            return known
        state.detached_stores += 1
        return namespace_key(f"detached:{event.parent_block_hash}")

    def _hold(self, state: _Endpoint, key: int, holder: Holder) -> None:
        engine_hash = holder[0]
        previous = state.engine_keys.get(engine_hash)
        if previous is not None and previous != key:  # re-announced under another chain: move it
            self._release(state, previous, engine_hash, medium=None)
        holders = state.blocks.get(key)
        if holders is None:
            state.blocks[key] = holders = set()
        else:
            state.blocks.move_to_end(key)
        holders.add(holder)
        state.engine_keys[engine_hash] = key

    def _remove(self, state: _Endpoint, event: BlockRemoved) -> None:
        if event.group_idx is not None and event.group_idx in state.ignored_groups:
            return
        medium = event.medium or GPU
        for engine_hash in event.block_hashes:
            key = state.engine_keys.get(engine_hash)
            if key is None:
                state.unmapped += 1
                continue
            self._release(state, key, engine_hash, medium=medium)

    def _release(self, state: _Endpoint, key: int, engine_hash: int, *, medium: str | None) -> None:
        """Drop `engine_hash`'s holders of `key` (only `medium`'s unless None); forget the mapping
        once no medium holds it, and the key once nothing does."""
        holders = state.blocks.get(key, set())
        holders.difference_update(
            {h for h in holders if h[0] == engine_hash and (medium is None or h[1] == medium)}
        )
        if not any(h[0] == engine_hash for h in holders):
            state.engine_keys.pop(engine_hash, None)
        if not holders:
            state.blocks.pop(key, None)

    def _evict_over_cap(self, state: _Endpoint) -> None:
        while len(state.blocks) > self.max_blocks_per_endpoint:
            key, holders = state.blocks.popitem(last=False)
            for engine_hash, _ in holders:
                if state.engine_keys.get(engine_hash) == key:
                    del state.engine_keys[engine_hash]
            state.evicted += 1

    @staticmethod
    def _reset(state: _Endpoint) -> None:
        state.blocks.clear()
        state.engine_keys.clear()
        state.ignored_groups.clear()
