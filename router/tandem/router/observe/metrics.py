"""The router's Prometheus metrics, registered on a per-app `CollectorRegistry` (no global registry).

Counters and histograms are updated on the request path; the per-endpoint gauges are computed at
scrape time from the `EndpointRegistry` by `EndpointCollector`, so they can never drift from the
accounting the router actually uses. Every name is documented in docs/router.md.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.hotmetrics import CounterChild, HistogramChild, LabeledCounter, LabeledHistogram
from tandem.router.types import POOLS

PREFIX = "tandem_router"
#: The requests counter's and the two duration histograms' series of one (route, status).
_RequestSeries = tuple[CounterChild, HistogramChild, HistogramChild]

#: Seconds; from sub-10 ms proxy overhead up to multi-minute non-streaming generations.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: Seconds; time to first byte and prefill latency (prompt processing).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
#: Seconds; one scheduling decision (microseconds for a few endpoints and a cached prompt).
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05)
#: Seconds; the KV-pool barrier (usually one Redis round trip, at most its timeout).
BARRIER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)


class RouterMetrics:
    """The router's instruments. Label values are bounded: routes come from a fixed set,
    endpoints from discovery, kinds and reasons from fixed vocabularies."""

    def __init__(self, registry: CollectorRegistry, endpoints: EndpointRegistry) -> None:
        self.requests = LabeledCounter(
            f"{PREFIX}_requests",
            "HTTP requests answered, by route and status (499: client left first).",
            ["route", "status"],
            registry=registry,
        )
        self.request_duration = LabeledHistogram(
            f"{PREFIX}_request_duration_seconds",
            "From request received to last response byte sent (or client gone).",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.time_to_first_byte = LabeledHistogram(
            f"{PREFIX}_time_to_first_byte_seconds",
            "From request received to the first response body byte handed to the server.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_errors = LabeledCounter(
            f"{PREFIX}_upstream_errors",
            "Failed upstream requests by endpoint and kind (connect, timeout, read, status).",
            ["pool", "endpoint", "kind"],
            registry=registry,
        )
        self.retries = LabeledCounter(
            f"{PREFIX}_retries",
            "Requests sent to another endpoint after a failure before the first byte.",
            ["pool", "reason"],
            registry=registry,
        )
        self.recalled = LabeledCounter(
            f"{PREFIX}_recalled",
            "Requests taken back from an engine's queue beyond its capacity, to wait in the fair queue.",
            ["pool", "endpoint"],
            registry=registry,
        )
        self.adapter_held = LabeledCounter(
            f"{PREFIX}_adapter_held",
            "Requests for a declared LoRA adapter that no engine could load yet, held and tried again, "
            "by how the hold ended (loaded, expired).",
            ["outcome"],
            registry=registry,
        )
        self.pd_decisions = LabeledCounter(
            f"{PREFIX}_pd_decisions",
            "Generation requests by P/D decision (disaggregate, decode_only) and its reason.",
            ["decision", "reason"],
            registry=registry,
        )
        self.pd_decode_rechosen = Counter(
            f"{PREFIX}_pd_decode_rechosen",
            "Prefilled requests whose decode endpoint was chosen again: the pool changed during the prefill.",
            registry=registry,
        )
        self.pd_kv_barrier_wait = LabeledHistogram(
            f"{PREFIX}_pd_kv_barrier_wait_seconds",
            "Wait after a prefill for the prompt's chunks in the KV pool, by outcome.",
            ["outcome"],
            buckets=BARRIER_BUCKETS,
            registry=registry,
        )
        self.pd_prefill_duration = LabeledHistogram(
            f"{PREFIX}_pd_prefill_duration_seconds",
            "Prefill step duration by outcome (ok, fallback).",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.pd_prefill_held = Gauge(
            f"{PREFIX}_pd_prefill_held",
            "Requests held in the gateway for a prefill engine with room (late binding).",
            registry=registry,
        )
        self.pd_prefill_hold = Histogram(
            f"{PREFIX}_pd_prefill_hold_seconds",
            "How long each prefill was held in the gateway before it was sent (0: not held).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.pd_prefill_ahead = LabeledCounter(
            f"{PREFIX}_pd_prefill_ahead",
            "P/D steps started while the request waited for its decode slot (prefill ahead), by "
            "whether the request then used it (used) or ended first (unused).",
            ["outcome"],
            registry=registry,
        )
        self.pd_fallbacks = LabeledCounter(
            f"{PREFIX}_pd_fallbacks",
            "Disaggregated requests that fell back to decode-only, by reason.",
            ["reason"],
            registry=registry,
        )
        self.schedule_decision = LabeledHistogram(
            f"{PREFIX}_schedule_decision_duration_seconds",
            "Time one scheduling decision took, whole: the prompt's tokens and block keys when the "
            "policy needs them first, candidates, filters, scorers and picker.",
            ["pool"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        registry.register(EndpointCollector(endpoints))
        # One look-up for the three series of a (route, status) rather than three, and no str(status).
        self._request_children: dict[
            tuple[str, int], tuple[CounterChild, HistogramChild, HistogramChild]
        ] = {}

    def decision_duration(self, pool: str) -> HistogramChild:
        """The decision histogram's series for `pool`."""
        return self.schedule_decision.labels(pool)

    def observe_request(self, route: str, status: int, *, duration_s: float, ttfb_s: float | None) -> None:
        """Count one answered HTTP request."""
        children = self._request_children.get((route, status))
        if children is None:
            children = self._request_children[(route, status)] = (
                self.requests.labels(route, str(status)),
                self.request_duration.labels(route),
                self.time_to_first_byte.labels(route),
            )
        requests, duration, ttfb = children
        requests.inc()
        duration.observe(duration_s)
        if ttfb_s is not None:
            ttfb.observe(ttfb_s)


class EndpointCollector(Collector):
    """Scrape-time gauges from the endpoint registry."""

    def __init__(self, endpoints: EndpointRegistry) -> None:
        self._endpoints = endpoints

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            f"{PREFIX}_endpoint_up",
            "1 while the endpoint is in rotation, 0 while it cools down after failures.",
            labels=["pool", "endpoint"],
        )
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_endpoint_in_flight_requests",
            "Upstream requests the router has open to the endpoint.",
            labels=["pool", "endpoint"],
        )
        failures = GaugeMetricFamily(
            f"{PREFIX}_endpoint_consecutive_failures",
            "Failures of the endpoint since its last success.",
            labels=["pool", "endpoint"],
        )
        pool_in_flight = GaugeMetricFamily(
            f"{PREFIX}_pool_in_flight_requests",
            "Upstream requests the router has open to the pool (including removed endpoints).",
            labels=["pool"],
        )
        per_pool: Tally[str] = Tally()
        for snap in self._endpoints.tracked():
            labels = [snap.endpoint.pool, snap.endpoint.name]
            in_flight.add_metric(labels, snap.in_flight)
            failures.add_metric(labels, snap.consecutive_failures)
            per_pool[snap.endpoint.pool] += snap.in_flight
        for pool in POOLS:
            for snap in self._endpoints.snapshots(pool):
                up.add_metric([pool, snap.endpoint.name], 1.0 if snap.in_rotation else 0.0)
            pool_in_flight.add_metric([pool], per_pool[pool])
        yield from (up, in_flight, failures, pool_in_flight)

    def describe(self) -> Iterator[Metric]:
        # Describing by collecting would read live state at registration; names are static anyway.
        return iter(())


class PoolKeysCollector(Collector):
    """`tandem_router_kv_pool_keys_state{state}`, read at scrape time: 1 for the state the self-check
    of the KV pool's keys is in (`tandem.router.pd.keycheck`), 0 for the others. Registered only where
    the gateway looks chunks up in a pool."""

    def __init__(self, state: Callable[[], str], states: Sequence[str]) -> None:
        self._state = state
        self._states = tuple(states)

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            f"{PREFIX}_kv_pool_keys_state",
            "Whether the engines write the KV-pool keys the gateway computes: 1 for the current state "
            "(unverified, verified, mismatch).",
            labels=["state"],
        )
        now = self._state()
        for state in self._states:
            gauge.add_metric([state], 1.0 if state == now else 0.0)
        yield gauge

    def describe(self) -> Iterator[Metric]:
        return iter(())


#: Why the HTTP server ended a client connection itself: `cap` (it arrived while `max_connections`
#: were served), `header_deadline` (its request head was not complete within `header_seconds`).
CONNECTION_REFUSALS = ("cap", "header_deadline")


@dataclass(slots=True)
class ConnectionTally:
    """This process's client connections, counted by its HTTP server (`tandem.cli.connections`) and
    read at scrape time (`ConnectionsCollector`). `cap`: the most served at once; `open`: served now
    (a connection being closed with a 408 included, a refused one not); `lingering`: refused
    connections still open while their 503 is read; `refused`: connections ended by the server, by
    reason (`CONNECTION_REFUSALS`)."""

    cap: int
    open: int = 0
    lingering: int = 0
    refused: Tally[str] = field(default_factory=Tally)


class ConnectionsCollector(Collector):
    """`tandem_router_connections_open`, `_max` and `_refused_total{reason}` from a `ConnectionTally`."""

    def __init__(self, tally: ConnectionTally) -> None:
        self._tally = tally

    def collect(self) -> Iterator[Metric]:
        tally = self._tally
        yield GaugeMetricFamily(
            f"{PREFIX}_connections_open", "Client connections this process serves now.", value=tally.open
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_connections_max",
            "Client connections this process serves at most (--max-connections); more are refused.",
            value=tally.cap,
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_connections_refused",
            "Client connections the server ended itself: cap (answered 503 on arrival, over "
            "--max-connections), header_deadline (request head not complete in --header-seconds).",
            labels=["reason"],
        )
        for reason in CONNECTION_REFUSALS:
            refused.add_metric([reason], tally.refused[reason])
        yield refused

    def describe(self) -> Iterator[Metric]:
        return iter(())
