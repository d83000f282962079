"""The KV-event subscribers' Prometheus metrics (`spec.router.prefixSource: precise`; names in
docs/routing.md, "Precise prefix state"): the `KVEventMetrics` the subscribers report to, plus the
precise index's size per endpoint, computed at scrape time.

- `tandem_router_kv_events_total{endpoint,kind}`: events applied to the index (kind `BlockStored`,
  `BlockRemoved`, `AllBlocksCleared`);
- `tandem_router_kv_events_unknown_total{endpoint}`: events of a kind the decoder does not know;
- `tandem_router_kv_event_decode_errors_total{endpoint}`: batches that could not be decoded;
- `tandem_router_kv_event_gaps_total{endpoint}`: live batches missed (a replay was asked for);
- `tandem_router_kv_event_batches_lost_total{endpoint}`: batches no stream or replay delivered;
- `tandem_router_kv_event_replays_total{endpoint,outcome}`: replays (ok, timeout, error, unavailable);
- `tandem_router_kv_event_engine_restarts_total{endpoint}`: restarts seen (its entries dropped);
- `tandem_router_kv_event_connected{endpoint}`: 1 while the subscriber's connection is up;
- `tandem_router_kv_index_blocks{endpoint}`: blocks the precise index holds for the endpoint.

Endpoint labels are engine base URLs from discovery (bounded by the pools' sizes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
from tandem.router.discovery.kvevents.ports import ConnectionState, ReplayOutcome
from tandem.router.observe.metrics import PREFIX


class KVEventMetrics:
    """Prometheus counters behind `tandem.router.discovery.kvevents.ports.KVEventMetrics`."""

    def __init__(self, registry: CollectorRegistry, *, index: PrecisePrefixIndex) -> None:
        def counter(name: str, help_text: str, *labels: str) -> Counter:
            return Counter(f"{PREFIX}_{name}", help_text, ["endpoint", *labels], registry=registry)

        self._applied = counter("kv_events", "KV events applied to the precise prefix index.", "kind")
        self._unknown = counter("kv_events_unknown", "KV events of an unknown kind (skipped).")
        self._decode_errors = counter("kv_event_decode_errors", "KV-event batches that could not be decoded.")
        self._gaps = counter("kv_event_gaps", "Live KV-event batches missed (a replay was asked for).")
        self._lost = counter("kv_event_batches_lost", "KV-event batches no stream or replay delivered.")
        self._replays = counter("kv_event_replays", "KV-event replays by outcome.", "outcome")
        self._restarts = counter("kv_event_engine_restarts", "Engine restarts seen in the KV-event sequence.")
        self._connected = Gauge(
            f"{PREFIX}_kv_event_connected",
            "1 while the KV-event subscriber is connected to the engine.",
            ["endpoint"],
            registry=registry,
        )
        registry.register(_IndexCollector(index))

    def events_applied(self, endpoint: str, kind: str, count: int) -> None:
        self._applied.labels(endpoint=endpoint, kind=kind).inc(count)

    def unknown_events(self, endpoint: str, count: int) -> None:
        self._unknown.labels(endpoint=endpoint).inc(count)

    def decode_error(self, endpoint: str) -> None:
        self._decode_errors.labels(endpoint=endpoint).inc()

    def gap(self, endpoint: str, missed: int) -> None:
        self._gaps.labels(endpoint=endpoint).inc(missed)

    def lost(self, endpoint: str, batches: int) -> None:
        self._lost.labels(endpoint=endpoint).inc(batches)

    def replay(self, endpoint: str, outcome: ReplayOutcome, batches: int) -> None:
        self._replays.labels(endpoint=endpoint, outcome=outcome).inc()

    def restart(self, endpoint: str) -> None:
        self._restarts.labels(endpoint=endpoint).inc()

    def connection(self, endpoint: str, state: ConnectionState) -> None:
        self._connected.labels(endpoint=endpoint).set(1 if state == "connected" else 0)

    def forget(self, endpoint: str) -> None:
        """The endpoint left discovery: its connection gauge goes (counters stay, as totals)."""
        with contextlib.suppress(KeyError):
            self._connected.remove(endpoint)


class _IndexCollector(Collector):
    def __init__(self, index: PrecisePrefixIndex) -> None:
        self._index = index

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_kv_index_blocks",
            "Blocks the precise prefix index holds per endpoint.",
            labels=["endpoint"],
        )
        for endpoint in self._index.endpoints():
            family.add_metric([endpoint], self._index.stats(endpoint).blocks)
        yield family
