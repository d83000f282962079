"""The approximate prefix index: what the router sent where, as each engine's likely prefix cache.

Two `PrefixSource`s answer "how many leading tokens of this prompt does each endpoint cache?"
(`tandem.router.discovery.kvevents.ports.PrefixSource`): the precise index fed by the engines' KV events
(`tandem.router.discovery.kvevents.index.PrecisePrefixIndex`), and this one, fed by the router's own routing
decisions, which needs nothing from the engines (llm-d's approximate prefix producer, SGLang's tree).

Per endpoint it keeps a bounded LRU set of block keys, `tandem.core.blockhash.block_keys` over the
prompt's token ids in the engine's block size (from `vllm:cache_config_info` when the collector has
read it, else `default_block_size`), holding at most the engine's `num_gpu_blocks` keys (else
`default_capacity_blocks`, llm-d's 31,250), the most it could cache. `record` marks a prompt's blocks
most recent **last block first**, so the first block is the freshest: like vLLM, which frees a
request's blocks tail first, eviction eats prompts from the end and a surviving chain keeps its start.

A match counts consecutive keys from the first block: a 1,030-token prompt in blocks of 16 whose
first 64 blocks were recorded on A matches 1,024 tokens on A. Keys chain (block i covers blocks
0..i), so equal keys mean equal prefixes.

A match is a binary search, not a walk (8,000 tokens: 9 look-ups instead of 500), which is exact
because each endpoint's keys are *prefix-closed*: a recorded prompt's keys are all inserted, block i
always more recently than block i + 1 (`record` marks them last block first), and every later record
that touches block i + 1 (it extends a prefix through block i) touches block i after it; so the least
recent key of a chain is its last, and eviction takes chains from their ends.

Pure and single-threaded (the event loop).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from tandem.router.discovery.kvevents.ports import KeyedPrompt

#: vLLM's default block size, used until an engine's `vllm:cache_config_info` is known.
DEFAULT_BLOCK_SIZE = 16
#: llm-d's `lruCapacityPerServer`, used until an engine's `num_gpu_blocks` is known.
DEFAULT_CAPACITY_BLOCKS = 31_250


@dataclass(slots=True)
class _Cache:
    block_size: int
    capacity: int
    keys: OrderedDict[int, None] = field(default_factory=OrderedDict)  # least recent first


class ApproximatePrefixIndex:
    """Per-endpoint LRU of routed block keys (module docstring). Endpoints are base URLs."""

    def __init__(
        self,
        *,
        default_block_size: int = DEFAULT_BLOCK_SIZE,
        default_capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
    ) -> None:
        if default_block_size < 1 or default_capacity_blocks < 1:
            raise ValueError("block size and capacity must be positive")
        self._default_block_size = default_block_size
        self._default_capacity = default_capacity_blocks
        self._caches: dict[str, _Cache] = {}
        # block size → first-block key → endpoints whose picture holds that key (for `holders`)
        self._firsts: dict[int, dict[int, set[str]]] = {}

    def configure(self, url: str, *, block_size: int | None, capacity_blocks: int | None) -> None:
        """Size `url`'s cache from its engine's numbers (None: keep the current/default value).
        A changed block size empties it (keys of another size never match); a smaller capacity
        evicts the least recent keys."""
        cache = self._cache(url)
        if block_size is not None and block_size > 0 and block_size != cache.block_size:
            self._drop_firsts(url, cache)
            cache.block_size = block_size
            cache.keys.clear()
        if capacity_blocks is not None and capacity_blocks > 0 and capacity_blocks != cache.capacity:
            cache.capacity = capacity_blocks
            self._evict(url, cache)

    def match(self, endpoints: Iterable[str], prompt: KeyedPrompt) -> dict[str, int]:
        """`PrefixSource.match`: leading tokens of `prompt` recorded on each endpoint, in full
        blocks of that endpoint's block size (0 for an endpoint never recorded)."""
        matched: dict[str, int] = {}
        for url in endpoints:
            cache = self._caches.get(url)
            if cache is None or not cache.keys:
                matched[url] = 0
                continue
            matched[url] = _held_prefix(prompt.block_keys(cache.block_size), cache.keys) * cache.block_size
        return matched

    def record(self, url: str, prompt: KeyedPrompt) -> Sequence[int]:
        """`prompt` was sent to `url`: its full blocks become `url`'s most recent keys (returned)."""
        keys = prompt.block_keys(self._cache(url).block_size)
        self.record_keys(url, keys)
        return keys

    def record_keys(self, url: str, keys: Sequence[int]) -> None:
        """`record` with the keys computed already (in `url`'s block size; a sibling worker's)."""
        cache = self._cache(url)
        held = cache.keys
        for key in reversed(keys):
            held[key] = None
            held.move_to_end(key)
        if keys:
            self._firsts.setdefault(cache.block_size, {}).setdefault(keys[0], set()).add(url)
        self._evict(url, cache)

    def holders(self, prompt: KeyedPrompt) -> set[str]:
        """Endpoints whose picture holds `prompt`'s first block (so they may hold more of it): a
        look-up per block size in use, whatever the number of endpoints."""
        found: set[str] = set()
        for size, firsts in self._firsts.items():
            keys = prompt.block_keys(size)
            if keys and (urls := firsts.get(keys[0])):
                found |= urls
        return found

    def holds(self, url: str, key: int) -> bool:
        """Whether `url`'s picture holds the block `key`."""
        cache = self._caches.get(url)
        return cache is not None and key in cache.keys

    def fill(self, url: str) -> float:
        """Recorded blocks / capacity, 0..1 (0 for an unknown endpoint)."""
        cache = self._caches.get(url)
        return len(cache.keys) / cache.capacity if cache is not None else 0.0

    def blocks(self, url: str) -> int:
        cache = self._caches.get(url)
        return len(cache.keys) if cache is not None else 0

    def block_size(self, url: str) -> int:
        cache = self._caches.get(url)
        return cache.block_size if cache is not None else self._default_block_size

    def clear(self, url: str) -> None:
        """Empty `url`'s picture, keeping its sizes (its engine restarted with an empty cache)."""
        cache = self._caches.get(url)
        if cache is not None:
            self._drop_firsts(url, cache)
            cache.keys.clear()

    def forget(self, keep: Collection[str]) -> None:
        """Drop every endpoint not in `keep` (it left discovery)."""
        for url in [u for u in self._caches if u not in keep]:
            self._drop_firsts(url, self._caches.pop(url))

    def _evict(self, url: str, cache: _Cache) -> None:
        firsts = self._firsts.get(cache.block_size, {})
        while len(cache.keys) > cache.capacity:
            key, _ = cache.keys.popitem(last=False)
            urls = firsts.get(key)
            if urls is not None:
                urls.discard(url)
                if not urls:
                    del firsts[key]

    def _drop_firsts(self, url: str, cache: _Cache) -> None:
        firsts = self._firsts.get(cache.block_size, {})
        for key in [k for k, urls in firsts.items() if url in urls]:
            firsts[key].discard(url)
            if not firsts[key]:
                del firsts[key]

    def _cache(self, url: str) -> _Cache:
        cache = self._caches.get(url)
        if cache is None:
            cache = self._caches[url] = _Cache(self._default_block_size, self._default_capacity)
        return cache


def _held_prefix(keys: Sequence[int], held: Collection[int]) -> int:
    """How many leading `keys` are in `held`, by binary search (prefix-closed: module docstring)."""
    if not keys or keys[0] not in held:  # most endpoints hold none of a given prompt: one look-up
        return 0
    lo, hi = 1, len(keys)  # keys[:lo] are held; keys[hi:] are not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo
