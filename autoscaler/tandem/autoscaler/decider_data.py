"""The autoscaler decider's plain data: each pool's parameters (from the InferenceService's autoscaling
spec), what the collector observed on a pool, what the decider remembers between calls and what it decides.

Frozen dataclasses and no logic beyond building parameters from a spec; the decisions on them are
`tandem.autoscaler.decider`'s (which re-exports these names). Seconds are monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.autoscaler.service import ServiceCurve
from tandem.autoscaler.windows import Sample
from tandem.core.spec import AutoscalingBehavior, DecodeAutoscaling, PrefillAutoscaling

__all__ = [
    "DeciderParams",
    "DeciderState",
    "Decision",
    "DecodeObservation",
    "PrefillObservation",
    "decode_params",
    "prefill_params",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeciderParams:
    """Bounds, target and timing of one pool's decider. Seconds are monotonic seconds."""

    min: int
    max: int
    target: float
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0
    tolerance: float = 0.1
    scale_down_delay_s: float = 300.0
    max_step_up: int | None = None
    max_step_down: int | None = None
    max_observation_age_s: float = 30.0
    ready_timeout_s: float = 600.0
    #: Prefill only: the share of a replica's capacity to plan arrivals for (ρ).
    target_utilization: float = 0.8


def _params(spec: AutoscalingBehavior, *, min: int, max: int, target: float) -> DeciderParams:
    return DeciderParams(
        min=min,
        max=max,
        target=target,
        stable_window_s=spec.stable_window_seconds,
        panic_window_s=spec.panic_window_seconds,
        panic_threshold=spec.panic_threshold,
        tolerance=spec.tolerance,
        scale_down_delay_s=spec.scale_down_delay_seconds,
        max_step_up=spec.max_scale_up_step,
        max_step_down=spec.max_scale_down_step,
        max_observation_age_s=spec.max_metric_age_seconds,
        ready_timeout_s=spec.ready_timeout_seconds,
    )


def decode_params(spec: DecodeAutoscaling) -> DeciderParams:
    """Decider parameters for the decode pool: the target is mean KV-cache utilisation (0-1)."""
    return _params(spec, min=spec.min, max=spec.max, target=spec.target_kv_utilization)


def prefill_params(spec: PrefillAutoscaling) -> DeciderParams:
    """Decider parameters for the prefill pool: the target is p90 time to first token in seconds."""
    params = _params(spec, min=spec.min, max=spec.max, target=spec.target_ttft_seconds)
    return replace(params, target_utilization=spec.target_utilization)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeObservation:
    """What the collector saw on the decode pool at ``timestamp`` (monotonic seconds):
    ``running_requests`` summed over the engines, ``gateway_queued`` requests waiting in the gateway."""

    timestamp: float
    ready: int
    valid: bool = True
    mean_kv_utilization: float = 0.0
    running_requests: float = 0.0
    gateway_queued: float = 0.0
    #: Requests the gateway holds for want of any decode engine; requests/s arriving at the gateway.
    gateway_held: float = 0.0
    arrivals_per_s: float | None = None
    #: Requests on their way to a decode engine's batch besides the gateway's queue: held for or in
    #: prefill, and waiting in the decode engines.
    on_the_way: float = 0.0
    #: Mean seconds a finished request ran in a decode engine (its time there less its wait, on the
    #: arrivals' clock; None: none finished, or the engines do not report it).
    service_s: float | None = None
    #: The learned service time against running requests per engine (`tandem.autoscaler.service`, on
    #: the arrivals' clock; None: not enough loads seen), and the engines' clock ratio (None: not known).
    service_curve: ServiceCurve | None = None
    clock_ratio: float | None = None
    #: Seconds a new replica of this pool takes to become ready, as measured (None: not yet).
    engine_start_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillObservation:
    """What the collector saw on the prefill pool; ``ttft_p90_s`` is None when no request finished prefill,
    ``queued_prefill_tokens`` counts the engines' waiting and the gateway's queued requests (of which
    ``gateway_queued`` requests; held ones count in the backlog too), ``prefill_tokens_per_s`` is the
    measured rate of one busy replica and ``learned_tokens_per_s`` the gateway's observed throughput
    per engine (None or 0 when unknown),
    ``arrival_tokens_per_s`` the prompt tokens per second arriving (None when unknown)."""

    timestamp: float
    ready: int
    valid: bool = True
    ttft_p90_s: float | None = None
    queued_prefill_tokens: int = 0
    prefill_tokens_per_s: float | None = None
    learned_tokens_per_s: float | None = None
    arrival_tokens_per_s: float | None = None
    gateway_queued: float = 0.0
    engine_start_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeciderState:
    """What the decider remembers between calls. ``panic_since`` is when the panic trigger was last seen
    (None = stable mode); ``desires`` holds recent pre-delay desires for the scale-down delay."""

    samples: tuple[Sample, ...] = ()
    panic_since: float | None = None
    max_panic_replicas: int = 0
    desires: tuple[Sample, ...] = ()
    #: Recent arrival demand in replicas (`decider.arrival_demand`, `decider.decode_arrival_demand`), for
    #: the median and the forecast's slope.
    trend: tuple[Sample, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """Replicas the pool should have. ``valid=False`` means hold: do not act on ``desired``."""

    desired: int
    reason: str
    valid: bool = True
