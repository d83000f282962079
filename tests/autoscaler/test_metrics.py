"""The autoscaler's Prometheus metrics after a round: real `AutoscalerMetrics` on a registry of its own,
fed a hand-made `PoolOutcome` (no loop, no server)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tandem.autoscaler.control import PoolOutcome
from tandem.autoscaler.decider import Decision, DecodeObservation
from tandem.autoscaler.metrics import AutoscalerMetrics
from tandem.autoscaler.service import ServiceCurve


def decode_outcome(observed: DecodeObservation) -> PoolOutcome:
    return PoolOutcome(
        service="ns/demo",
        pool="decode",
        observed=observed,
        decision=Decision(desired=3, reason="test"),
        ready=2,
        desired=3,
        panic=False,
        previous=2,
    )


def value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name, {"service": "ns/demo"})


def test_the_decode_pools_learned_service_time_and_clock_are_exported() -> None:
    registry = CollectorRegistry()
    metrics = AutoscalerMetrics(registry)
    learned = DecodeObservation(
        timestamp=0.0,
        ready=2,
        service_s=1.7,
        service_curve=ServiceCurve(intercept_s=1.58, slope_s=0.068, floor_s=1.65),
        clock_ratio=2.0,
        on_the_way=9.0,
    )
    metrics.record(decode_outcome(learned))
    assert value(registry, "tandem_autoscaler_decode_service_seconds") == 1.7
    assert value(registry, "tandem_autoscaler_decode_service_slope_seconds") == 0.068
    assert value(registry, "tandem_autoscaler_decode_clock_ratio") == 2.0
    assert value(registry, "tandem_autoscaler_decode_on_the_way_requests") == 9.0
    metrics.record(decode_outcome(DecodeObservation(timestamp=1.0, ready=2)))  # nothing learned (yet)
    assert value(registry, "tandem_autoscaler_decode_service_slope_seconds") == 0.0
    assert value(registry, "tandem_autoscaler_decode_clock_ratio") == 0.0
    metrics.forget("ns/demo")
    assert value(registry, "tandem_autoscaler_decode_clock_ratio") is None
    assert value(registry, "tandem_autoscaler_decode_service_slope_seconds") is None
    assert value(registry, "tandem_autoscaler_decode_on_the_way_requests") is None
