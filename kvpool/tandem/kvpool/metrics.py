"""The pool's stats as Prometheus metrics: a collector that takes one snapshot per scrape.

`PoolCollector(snapshot)` calls `snapshot()` (e.g. `collect_stats` on a client) on every scrape and
renders it; a failed snapshot yields `tandem_kvpool_up 0` and nothing else, so a dead pool shows as a
value, not as a scrape error. Register it in any registry: the `tandem kvpool exporter` process
serves its own, and the router or operator may add it to theirs.

| metric | type | labels | meaning |
|---|---|---|---|
| `tandem_kvpool_up` | gauge | | 1 when the last snapshot succeeded |
| `tandem_kvpool_memory_bytes` | gauge | | Redis `used_memory` |
| `tandem_kvpool_memory_max_bytes` | gauge | | Redis `maxmemory` (0: unbounded) |
| `tandem_kvpool_evicted_keys_total` | counter | | keys evicted by `maxmemory-policy` |
| `tandem_kvpool_keyspace_hits_total` | counter | | key look-ups that found the key |
| `tandem_kvpool_keyspace_misses_total` | counter | | key look-ups that did not |
| `tandem_kvpool_keys` | gauge | | keys in the database (DBSIZE) |
| `tandem_kvpool_chunks` | gauge | `model` | complete chunk pairs |
| `tandem_kvpool_incomplete_chunks` | gauge | `model` | `kv_bytes` without `metadata` |
| `tandem_kvpool_orphaned_chunks` | gauge | `model` | `metadata` without `kv_bytes` |
| `tandem_kvpool_chunk_memory_bytes` | gauge | `model` | Redis memory of complete pairs |
| `tandem_kvpool_scan_truncated` | gauge | | 1 when the key scan stopped at its bound |
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.kvpool.client import POOL_ERRORS
from tandem.kvpool.stats import PoolStats

log = logging.getLogger(__name__)
PREFIX = "tandem_kvpool"


class PoolCollector(Collector):
    """Renders `snapshot()` on every scrape (module docstring)."""

    def __init__(self, snapshot: Callable[[], PoolStats]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(f"{PREFIX}_up", "1 when the last pool snapshot succeeded.")
        try:
            stats = self._snapshot()
        except POOL_ERRORS as exc:
            log.warning("kv pool snapshot failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _server_metrics(stats)
        yield from _model_metrics(stats)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _server_metrics(stats: PoolStats) -> Iterator[Metric]:
    yield _gauge("memory_bytes", "Redis used_memory in bytes.", stats.used_memory_bytes)
    yield _gauge("memory_max_bytes", "Redis maxmemory in bytes (0: unbounded).", stats.maxmemory_bytes)
    yield _counter("evicted_keys", "Keys evicted by the maxmemory policy.", stats.evicted_keys)
    yield _counter("keyspace_hits", "Key look-ups that found the key.", stats.keyspace_hits)
    yield _counter("keyspace_misses", "Key look-ups that did not find the key.", stats.keyspace_misses)
    yield _gauge("keys", "Keys in the pool's database.", stats.total_keys)
    yield _gauge("scan_truncated", "1 when the chunk scan stopped at its key bound.", int(stats.truncated))


def _model_metrics(stats: PoolStats) -> Iterator[Metric]:
    families = {
        "chunks": ("Complete chunk pairs (kv_bytes and metadata).", "chunks"),
        "incomplete_chunks": ("Chunks with kv_bytes but no metadata.", "incomplete"),
        "orphaned_chunks": ("Chunks with metadata but no kv_bytes (bytes evicted).", "orphaned"),
        "chunk_memory_bytes": ("Redis memory of complete chunk pairs in bytes.", "memory_bytes"),
    }
    for name, (doc, attribute) in families.items():
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["model"])
        for model, chunks in sorted(stats.models.items()):
            family.add_metric([model], getattr(chunks, attribute))
        yield family
