"""The scheduler's and the collector's Prometheus metrics (names in docs/routing.md), on the app's
own `CollectorRegistry`. `SchedulingMetrics` is the `SchedulingEvents` sink of the scheduling state,
the `on_decision` hook of the schedulers and the `on_scrape` hook of the collector; the per-endpoint
gauges are computed at scrape time from the registry and the scheduling state.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.hotmetrics import LabeledCounter, LabeledHistogram
from tandem.router.observe.metrics import LATENCY_BUCKETS, PREFIX
from tandem.router.scheduling.runner import Decision
from tandem.router.scheduling.state import SchedulingState, Ticket
from tandem.router.types import endpoint_name

#: Seconds a plugin takes: a scorer over a few endpoints is microseconds.
PLUGIN_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05)
#: Share of the prompt cached on the chosen endpoint.
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


class SchedulingMetrics:
    """Decisions, plugin timings, prefix-hit estimates, predicted and observed TTFT, scrapes."""

    def __init__(
        self, registry: CollectorRegistry, *, endpoints: EndpointRegistry, state: SchedulingState
    ) -> None:
        # Recorded once or more per request: the request path's cheap families (`hotmetrics`).
        self.decisions = LabeledCounter(
            f"{PREFIX}_schedule_decisions",
            "Scheduling decisions by pool and deciding reason.",
            ["pool", "reason"],
            registry=registry,
        )
        self.plugin_duration = LabeledHistogram(
            f"{PREFIX}_scheduler_plugin_duration_seconds",
            "Time one scheduler plugin (filter, scorer, picker) took in one cycle.",
            ["pool", "plugin"],
            buckets=PLUGIN_BUCKETS,
            registry=registry,
        )
        self.prefix_match = LabeledHistogram(
            f"{PREFIX}_prefix_match_ratio",
            "Estimated share of the prompt cached on the endpoint an attempt went to.",
            ["pool"],
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.ttft_predicted = LabeledHistogram(
            f"{PREFIX}_ttft_predicted_seconds",
            "Predicted time to first token of attempts whose first token was observed.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft_observed = LabeledHistogram(
            f"{PREFIX}_ttft_observed_seconds",
            "Observed time to first token (attempt start to first token) of the same attempts.",
            ["pool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.scrapes = Counter(
            f"{PREFIX}_engine_scrapes",
            "Engine /metrics scrapes by endpoint and outcome (ok, unusable, slow, unreachable).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        registry.register(EngineStateCollector(endpoints, state))

    def decided(self, decision: Decision) -> None:
        pool = decision.cycle.pool
        self.decisions.labels(pool, decision.reason).inc()
        for plugin, seconds in decision.durations_s.items():
            self.plugin_duration.labels(pool, plugin).observe(seconds)

    def dispatched(self, ticket: Ticket, /) -> None:
        if ticket.prompt_tokens and not ticket.kv_loaded:
            ratio = ticket.matched_tokens / ticket.prompt_tokens
            self.prefix_match.labels(ticket.endpoint.pool).observe(ratio)

    def first_token(self, ticket: Ticket, /, *, observed_s: float) -> None:
        pool = ticket.endpoint.pool
        self.ttft_predicted.labels(pool).observe(ticket.predicted_ttft_s)
        self.ttft_observed.labels(pool).observe(observed_s)

    def scraped(self, url: str, outcome: str) -> None:
        self.scrapes.labels(endpoint=endpoint_name(url), outcome=outcome).inc()


class EngineStateCollector(Collector):
    """Scrape-time gauges: the engines' own numbers as the router last read them, and what the
    scheduler learned per endpoint."""

    def __init__(self, endpoints: EndpointRegistry, state: SchedulingState) -> None:
        self._endpoints = endpoints
        self._state = state

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "endpoint"]
        requests = GaugeMetricFamily(
            f"{PREFIX}_endpoint_engine_requests",
            "Requests the engine reported at the last good scrape (state: running, waiting; deferred: of "
            "those waiting, the ones a transient constraint such as the LoRA adapter budget held out of "
            "its batch, where the engine reports it).",
            labels=[*labels, "state"],
        )
        kv = GaugeMetricFamily(
            f"{PREFIX}_endpoint_kv_usage_ratio", "KV-cache usage the engine reported (0-1).", labels=labels
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_endpoint_metrics_age_seconds", "Seconds since the last good scrape.", labels=labels
        )
        stale = GaugeMetricFamily(
            f"{PREFIX}_endpoint_metrics_stale", "1 while the engine's numbers are stale.", labels=labels
        )
        now = self._endpoints.now()
        for pool in ("prefill", "decode"):
            for snap in self._endpoints.snapshots(pool):
                if snap.engine is None:
                    continue
                key, stats = [pool, snap.endpoint.name], snap.engine.stats
                requests.add_metric([*key, "running"], stats.running)
                requests.add_metric([*key, "waiting"], stats.waiting)
                if stats.deferred is not None:
                    requests.add_metric([*key, "deferred"], stats.deferred)
                if stats.kv_usage is not None:
                    kv.add_metric(key, stats.kv_usage)
                age.add_metric(key, snap.engine.age_s(now))
                stale.add_metric(key, 1.0 if snap.engine.stale else 0.0)
        yield from (requests, kv, age, stale)
        yield from self._learned()
        yield from self._pinned()

    def _pinned(self) -> Iterator[Metric]:
        pinned = self._state.pinned
        if pinned is None:
            return
        share = GaugeMetricFamily(
            f"{PREFIX}_endpoint_pinned_share",
            "Share of the gateway's recent decisions sent to the engine that no other engine could "
            "serve without computing much of the prompt; a long new prompt avoids the engines with "
            "the most (tandem policy).",
            labels=["pool", "endpoint"],
        )
        for pool, shares in sorted(pinned.shares.items()):
            for url, value in shares.items():
                share.add_metric([pool, endpoint_name(url)], value)
        yield share

    def _learned(self) -> Iterator[Metric]:
        rate = GaugeMetricFamily(
            f"{PREFIX}_endpoint_prefill_rate_tokens_per_second",
            "Learned prefill rate of the engine (the prior until observed).",
            labels=["endpoint"],
        )
        queued = GaugeMetricFamily(
            f"{PREFIX}_endpoint_queued_prefill_tokens",
            "Uncached prompt tokens sent to the engine that have no first token yet.",
            labels=["endpoint"],
        )
        throughput = GaugeMetricFamily(
            f"{PREFIX}_endpoint_prefill_throughput_tokens_per_second",
            "Prompt tokens per second of the engine's requests as observed, overhead included (absent "
            "until observed): the autoscaler's prefill capacity before it sees the engine saturated.",
            labels=["endpoint"],
        )
        blocks = GaugeMetricFamily(
            f"{PREFIX}_endpoint_routed_prefix_blocks",
            "Blocks in the approximate prefix index for the engine.",
            labels=["endpoint"],
        )
        load_cost = GaugeMetricFamily(
            f"{PREFIX}_endpoint_adapter_load_seconds",
            "Learned seconds a LoRA adapter load adds to a first token on the engine (the prior until "
            "observed); only for a service with adapters under the tandem policy.",
            labels=["endpoint"],
        )
        loading = GaugeMetricFamily(
            f"{PREFIX}_endpoint_adapter_loads_in_flight",
            "Requests sent to the engine that load their adapter there and have no first token yet.",
            labels=["endpoint"],
        )
        costs = self._state.adapter_loads
        for url in self._endpoints.urls():
            name = [endpoint_name(url)]
            rate.add_metric(name, self._state.rates.rate(url))
            observed = self._state.rates.throughput(url)
            if observed is not None:
                throughput.add_metric(name, observed)
            queued.add_metric(name, self._state.queued_tokens(url))
            blocks.add_metric(name, self._state.approximate.blocks(url))
            if costs is not None:
                load_cost.add_metric(name, costs.cost(url))
                loading.add_metric(name, costs.in_flight(url))
        yield from (rate, throughput, queued, blocks)
        if costs is not None:
            yield from (load_cost, loading)

    def describe(self) -> Iterator[Metric]:
        return iter(())
