"""What is in the pool: memory, chunks per model, hits and misses. One snapshot per call.

- Memory (`INFO memory`, `INFO stats`): `used_memory`, `maxmemory`, `maxmemory_policy`, `evicted_keys`.
- Hits and misses (`INFO stats`): `keyspace_hits` / `keyspace_misses`, server-wide counters of key
  look-ups since Redis started (every GET/EXISTS of a chunk key is one look-up; a consumer probing
  for a chunk that is not there is a miss).
- Chunks per model: one `SCAN` pass over the keys in batches of `scan_count`, reading only chunk keys
  (`tandem.kvpool.keys.parse_key`). For every key one pipelined probe of its partner and, for
  `kv_bytes`, of itself, with `MEMORY USAGE` (nil for a missing key; unlike GET or EXISTS it does not
  count as a keyspace hit or miss, so looking does not skew the hit ratio), and each pair is counted
  once, at its `kv_bytes` key:
  `chunks` (both halves), `incomplete` (`kv_bytes` but no `metadata`: being written, or the metadata
  was evicted), `orphaned` (`metadata` but no `kv_bytes`: the bytes were evicted; LMCache deletes such
  metadata when it reads it). The pass stops after `max_keys` keys and says so (`truncated`): the
  work per call is bounded, at about `max_keys / scan_count` round trips of two commands each.

The pass is not atomic (writers keep writing), so counts are a consistent-enough view, not exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from tandem.kvpool.keys import KV_BYTES_SUFFIX, METADATA_SUFFIX, ParsedKey, parse_key

DEFAULT_SCAN_COUNT = 1000
DEFAULT_MAX_KEYS = 1_000_000


@dataclass
class ModelChunks:
    """The chunk pairs of one model (module docstring); `memory_bytes`: Redis' memory for the complete
    pairs (both keys, values and overhead, as `MEMORY USAGE` reports it)."""

    chunks: int = 0
    incomplete: int = 0
    orphaned: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True)
class PoolStats:
    """One snapshot of the pool (module docstring)."""

    used_memory_bytes: int
    maxmemory_bytes: int  # 0: unbounded
    maxmemory_policy: str
    evicted_keys: int
    keyspace_hits: int
    keyspace_misses: int
    total_keys: int  # DBSIZE of the selected database
    models: dict[str, ModelChunks] = field(default_factory=dict)
    keys_scanned: int = 0
    truncated: bool = False

    @property
    def hit_ratio(self) -> float | None:
        """hits / (hits + misses); None before the first look-up."""
        lookups = self.keyspace_hits + self.keyspace_misses
        return self.keyspace_hits / lookups if lookups else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (what `tandem kvpool stats --json` prints)."""
        return {
            "memory": {
                "used_bytes": self.used_memory_bytes,
                "max_bytes": self.maxmemory_bytes,
                "policy": self.maxmemory_policy,
                "evicted_keys": self.evicted_keys,
            },
            "keyspace": {
                "hits": self.keyspace_hits,
                "misses": self.keyspace_misses,
                "hit_ratio": self.hit_ratio,
                "keys": self.total_keys,
            },
            "models": {name: asdict(chunks) for name, chunks in sorted(self.models.items())},
            "scan": {"keys_scanned": self.keys_scanned, "truncated": self.truncated},
        }


def collect_stats(
    client: redis.Redis, *, scan_count: int = DEFAULT_SCAN_COUNT, max_keys: int = DEFAULT_MAX_KEYS
) -> PoolStats:
    """A snapshot of the pool behind `client` (module docstring); raises redis/OS errors as they come."""
    memory = _info(client, "memory")
    counters = _info(client, "stats")
    models, scanned, truncated = count_chunks(client, scan_count=scan_count, max_keys=max_keys)
    return PoolStats(
        used_memory_bytes=int(memory.get("used_memory", 0)),
        maxmemory_bytes=int(memory.get("maxmemory", 0)),
        maxmemory_policy=str(memory.get("maxmemory_policy", "")),
        evicted_keys=int(counters.get("evicted_keys", 0)),
        keyspace_hits=int(counters.get("keyspace_hits", 0)),
        keyspace_misses=int(counters.get("keyspace_misses", 0)),
        total_keys=int(client.dbsize()),
        models=models,
        keys_scanned=scanned,
        truncated=truncated,
    )


def count_chunks(
    client: redis.Redis, *, scan_count: int = DEFAULT_SCAN_COUNT, max_keys: int = DEFAULT_MAX_KEYS
) -> tuple[dict[str, ModelChunks], int, bool]:
    """Chunks per model, keys scanned, and whether `max_keys` cut the pass short."""
    if scan_count <= 0 or max_keys <= 0:
        raise ValueError("scan_count and max_keys must be positive")
    models: dict[str, ModelChunks] = {}
    scanned, cursor = 0, 0
    while True:
        cursor, batch = client.scan(cursor=cursor, count=scan_count)
        scanned += len(batch)
        _count_batch(client, (_text(k) for k in batch), models)
        if cursor == 0:
            return models, scanned, False
        if scanned >= max_keys:
            return models, scanned, True


def _count_batch(client: redis.Redis, keys: Iterable[str], models: dict[str, ModelChunks]) -> None:
    parsed = [p for p in map(parse_key, keys) if p is not None]
    if not parsed:
        return
    with client.pipeline(transaction=False) as pipe:
        for key in parsed:
            if key.suffix == KV_BYTES_SUFFIX:
                pipe.memory_usage(key.base + METADATA_SUFFIX)
                pipe.memory_usage(key.base + KV_BYTES_SUFFIX)
            else:
                pipe.memory_usage(key.base + KV_BYTES_SUFFIX)
        replies = iter(pipe.execute())
    for key in parsed:
        _count_key(key, replies, models.setdefault(key.model, ModelChunks()))


def _count_key(key: ParsedKey, replies: Iterator[Any], model: ModelChunks) -> None:
    """Consume `key`'s replies (the partner's MEMORY USAGE, then its own for kv_bytes) and count it."""
    partner = next(replies)
    if key.suffix == KV_BYTES_SUFFIX:
        own = next(replies)
        if partner is not None and own is not None:
            model.chunks += 1
            model.memory_bytes += int(partner) + int(own)
        elif own is not None:
            model.incomplete += 1
    elif partner is None:
        model.orphaned += 1


def _info(client: redis.Redis, section: str) -> Mapping[str, Any]:
    info: Mapping[str, Any] = client.info(section)
    return info


def _text(key: bytes | str) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else key
