"""The autoscaler's Prometheus metrics (names documented in docs/autoscaler.md).

One `AutoscalerMetrics` per process, on a registry of its own (no global registry). Labels are the
InferenceService name (`service`, `namespace/name` in a cluster) and the pool (`prefill`, `decode`).
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from tandem.autoscaler.control import PoolOutcome
from tandem.autoscaler.decider import DecodeObservation, prefill_capacity


class AutoscalerMetrics:
    """Gauges of the last decision per pool and counters of what was done."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        pool = ("service", "pool")
        self.desired = Gauge(
            "tandem_autoscaler_desired_replicas", "Replicas the autoscaler wants.", pool, registry=registry
        )
        self.ready = Gauge(
            "tandem_autoscaler_ready_replicas", "Ready replicas (engines found).", pool, registry=registry
        )
        self.panic = Gauge(
            "tandem_autoscaler_panic", "1 while the pool is in panic mode.", pool, registry=registry
        )
        self.kv = Gauge(
            "tandem_autoscaler_kv_utilization",
            "Mean KV-cache utilisation of the decode pool (0-1) at the last valid scrape.",
            ("service",),
            registry=registry,
        )
        self.ttft = Gauge(
            "tandem_autoscaler_ttft_p90_seconds",
            "p90 time to first token of the prefill pool over the panic window (0: no first token in it).",
            ("service",),
            registry=registry,
        )
        self.backlog = Gauge(
            "tandem_autoscaler_prefill_backlog_tokens",
            "Estimated prompt tokens waiting in the prefill pool.",
            ("service",),
            registry=registry,
        )
        self.gateway_queued = Gauge(
            "tandem_autoscaler_gateway_queued_requests",
            "Requests waiting in the gateway's queue (all its replicas) at the last valid scrape.",
            ("service",),
            registry=registry,
        )
        self.start = Gauge(
            "tandem_autoscaler_engine_start_seconds",
            "Learned seconds from asking for a replica to its being ready (absent until measured).",
            pool,
            registry=registry,
        )
        self.arrivals = Gauge(
            "tandem_autoscaler_arrival_prompt_tokens_per_second",
            "Prompt tokens per second arriving (the gateway's counters), the prefill pool's leading signal.",
            ("service",),
            registry=registry,
        )
        self.capacity = Gauge(
            "tandem_autoscaler_prefill_capacity_tokens_per_second",
            "One prefill replica's capacity the decider divides by "
            "(the higher of the rate measured busy and the gateway's observed throughput).",
            ("service",),
            registry=registry,
        )
        self.held = Gauge(
            "tandem_autoscaler_gateway_held_requests",
            "Requests the gateway holds because the decode pool has no engine (scale from zero).",
            ("service",),
            registry=registry,
        )
        self.on_the_way = Gauge(
            "tandem_autoscaler_decode_on_the_way_requests",
            "Requests bound for a decode engine's batch besides the gateway's queue: held for or in "
            "prefill, waiting in the decode engines (with the running and queued ones, the decode "
            "pool's occupancy demand).",
            ("service",),
            registry=registry,
        )
        self.service_time = Gauge(
            "tandem_autoscaler_decode_service_seconds",
            "Mean seconds a request runs in a decode engine (its time there less its wait, on the "
            "autoscaler's clock; 0 until one finished): with the arrival rate, the decode pool's leading "
            "signal by Little's law.",
            ("service",),
            registry=registry,
        )
        self.service_slope = Gauge(
            "tandem_autoscaler_decode_service_slope_seconds",
            "Learned seconds a decode request's time grows by per running request per engine, b of "
            "s(c) = a + b*c (0: no line yet; the leading demand takes the time measured now).",
            ("service",),
            registry=registry,
        )
        self.clock_ratio = Gauge(
            "tandem_autoscaler_decode_clock_ratio",
            "Seconds on the autoscaler's clock per second the decode engines report (Little's law on the "
            "engines; 1 for vLLM, 2 for the simulator at time scale 0.5; 0: not measured yet).",
            ("service",),
            registry=registry,
        )
        self.scale_events = Counter(
            "tandem_autoscaler_scale_events",
            "Scale actions taken, by direction (up or down).",
            ("service", "pool", "direction"),
            registry=registry,
        )
        self.holds = Counter(
            "tandem_autoscaler_holds",
            "Decisions that held because the observation was invalid or stale.",
            pool,
            registry=registry,
        )
        self.scale_refusals = Counter(
            "tandem_autoscaler_scale_refused",
            "Scale actions refused because the pool's Deployment has no ownerReference to the "
            "InferenceService (by uid).",
            pool,
            registry=registry,
        )

    def record(self, outcome: PoolOutcome) -> None:
        """Update the series of one pool after a decision."""
        labels = (outcome.service, outcome.pool)
        self.desired.labels(*labels).set(outcome.desired)
        self.ready.labels(*labels).set(outcome.ready)
        self.panic.labels(*labels).set(1 if outcome.panic else 0)
        if outcome.engine_start_s is not None:
            self.start.labels(*labels).set(outcome.engine_start_s)
        if not outcome.decision.valid:
            self.holds.labels(*labels).inc()
        if outcome.direction is not None:
            self.scale_events.labels(*labels, outcome.direction).inc()
        observed = outcome.observed
        if not observed.valid:
            return
        self.gateway_queued.labels(outcome.service).set(observed.gateway_queued)
        if isinstance(observed, DecodeObservation):
            self.kv.labels(outcome.service).set(observed.mean_kv_utilization)
            self.held.labels(outcome.service).set(observed.gateway_held)
            self.on_the_way.labels(outcome.service).set(observed.on_the_way)
            self.service_time.labels(outcome.service).set(observed.service_s or 0.0)
            curve = observed.service_curve
            self.service_slope.labels(outcome.service).set(curve.slope_s if curve is not None else 0.0)
            self.clock_ratio.labels(outcome.service).set(observed.clock_ratio or 0.0)
        else:
            self.ttft.labels(outcome.service).set(observed.ttft_p90_s or 0.0)
            self.backlog.labels(outcome.service).set(observed.queued_prefill_tokens)
            self.arrivals.labels(outcome.service).set(observed.arrival_tokens_per_s or 0.0)
            self.capacity.labels(outcome.service).set(prefill_capacity(observed) or 0.0)

    def refused(self, service: str, pool: str) -> None:
        """Count a scale refused for want of ownership (`tandem.autoscaler.ownership`)."""
        self.scale_refusals.labels(service, pool).inc()

    def forget(self, service: str) -> None:
        """Drop every series of a service that is gone (or no longer autoscaled)."""
        for gauge in (self.desired, self.ready, self.panic, self.holds, self.start, self.scale_refusals):
            for pool in ("prefill", "decode"):
                _remove(gauge, service, pool)
        per_service = (self.kv, self.ttft, self.backlog, self.gateway_queued, self.arrivals, self.capacity)
        decode = (self.held, self.on_the_way, self.service_time, self.service_slope, self.clock_ratio)
        for gauge in (*per_service, *decode):
            _remove(gauge, service)
        for pool in ("prefill", "decode"):
            for direction in ("up", "down"):
                _remove(self.scale_events, service, pool, direction)


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
