"""The autoscaler's decider: Knative's KPA made pure, one entry point per pool kind.

Everything here is pure: no I/O, no clock, no globals. ``now`` is monotonic seconds passed in by the caller
(tests use a fake clock), and each call returns the decision together with the next state.

Each observation becomes a *demand* in replica-equivalents (a float). The decider averages demand over a
stable window (60 s) and a panic window (6 s) and rounds up to replicas:

- decode: ``demand = ready × mean_kv_util / target_kv × (1 + gateway_queued / running)``: requests
  waiting in the gateway's queue (for decode capacity) count as running ones would, each holding the
  mean KV share of a running request; without running requests (or without a queue) the factor is 1.
  Example: 4 ready at 0.9 KV utilisation, target 0.6 → 4 × 0.9 / 0.6 = 6.0 → 6 replicas; the same with
  20 running and 10 queued in the gateway → 6.0 × (1 + 10 / 20) = 9.0 → 9 replicas.
- prefill: ``demand = max(ready × ttft_p90 / target_ttft, backlog / (rate × target_ttft))``, where the
  backlog (tokens) counts the engines' waiting requests and the gateway's queued ones (the collector's
  job, `tandem.autoscaler.observe`).
  Example: 2 ready, p90 1.5 s, target 0.5 s → 2 × 1.5 / 0.5 = 6.0; 40 000 queued tokens at
  10 000 tokens/s per replica → 40 000 / (10 000 × 0.5) = 8.0; the larger, 8 replicas.

Beside that lagging demand each pool has a **leading** one, from signals that move before latency does
(`prefill_leading`, `decode_leading`), used at once and never averaged away:

- prefill, once a per-replica capacity ``R`` (tokens/s) is known (the higher of the rate measured on a
  busy engine and the gateway's observed throughput):
  ``max(arrivals / (R × ρ), (arrivals + backlog / H) / R) + forecast``: enough replicas to run at the
  target utilisation ``ρ`` (0.8), or to serve the arrivals *and* drain the backlog within
  ``H = max(target TTFT, engine start time)`` (a backlog need not be drained faster than a new engine
  can start), whichever needs more: the headroom ρ leaves is what drains the queue an ordinary burst
  builds, so the two are not added (adding them held twice the replicas a peak needed). Arrivals are
  the median of those of the rounds in the last `MEDIAN_SPAN_S` (a one-window spike buys no replica);
  the forecast is the arrival demand's slope over the panic window (Theil–Sen) times the start time,
  at least 0 and at most one replica and half the arrival demand (a ramp pre-scales its next replica;
  a step is not extrapolated).
  Example: 27 000 tokens/s arriving, R = 12 000, ρ = 0.8 → 2.81; 30 000 tokens waiting, start 5 s →
  (27 000 + 6 000) / 12 000 = 2.75: the first; flat arrivals → 2.81 → 3 replicas. With 90 000 waiting
  (a step while engines start): (27 000 + 18 000) / 12 000 = 3.75 → 4.
  With a known R the TTFT term stops at ready + 1 (a high TTFT while a backlog drains says "more", not
  how many: it was what overshot) and the backlog term with ``H`` = target TTFT is dropped.
- decode, with engines: Little's law, ``arrivals × s(c*) / c*``: requests/s arriving at the gateway
  times the mean seconds a request runs in a decode engine is how many will run at once, and each engine
  at the target KV utilisation runs ``c* = target × running / (ready × mean_kv)`` of them (each holds the
  KV share the running ones hold now); the same median as prefill's, plus the same forecast as
  prefill. The service time grows with the requests an engine batches, so it is taken at c*, from the
  line the collector learned (`tandem.autoscaler.service`: s(c) = a + b·c over the loads seen, on the
  arrivals' clock); until it has one, the service time as measured now (which at a step from idle is
  the idle one, and under-counts by s(c*) / s(c_idle)). The KV signal itself moves only as the burst's
  requests reach the decode engines, which in P/D is after their prefill: at a step it filled the caches
  seconds before the windows asked for a replica. Example: 9 requests/s; 6 running hold 0.3 of 1
  ready, target 0.6 → c* = 12; 2.0 s measured → 9 × 2.0 / 12 = 1.5 → 2 replicas; with the line
  0.8 + 0.2·c learned, s(12) = 3.2 s → 2.4 → 3. Without a running request (no share to measure) or a
  service time, none. Beside it, the **occupancy** (`decode_occupancy`): the requests already running,
  queued in the gateway or on their way (held for or in prefill, waiting in a decode engine) over c*,
  taken in the round that sees them (a step's requests are here seconds before the arrivals' median
  moves); the leading demand is the larger of the two.
- decode without an engine: 1 while the gateway holds requests, queues some or sees arrivals (scale from
  zero).
- prefill with no engine and no known rate: 1 while anything arrives.

Either pool's leading demand above the ready count by no more than the tolerance (0.1) is the ready
count (`within_tolerance`): noise that crosses an integer by a hair buys no replica.

The start time is measured by the controller (scale-up asked → replica ready) and passed in the
observation (``engine_start_s``, None until measured: then ``H`` = target and the forecast horizon is the
panic window).

Then, in order: panic (panic-window desire ≥ 2 × ready; while panicking never scale down, and leave only
after a stable window without the trigger), the leading demand (a higher one raises the desire at once:
scale-up within two rounds, asymmetric with the windows and delay that scale-down waits for), the tolerance
band (|desired / ready − 1| ≤ 0.1 keeps ready), the scale-down delay (scale down only to the largest desire
of the last 300 s), step limits, min/max.
An invalid or stale observation holds: ``valid=False``, desired = ready, state unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tandem.autoscaler.decider_data import (
    DeciderParams,
    DeciderState,
    Decision,
    DecodeObservation,
    PrefillObservation,
    decode_params,
    prefill_params,
)
from tandem.autoscaler.windows import Sample, ceil_replicas, mean, median, peak, within

__all__ = [
    "MEDIAN_SPAN_S",
    "DeciderParams",
    "DeciderState",
    "Decision",
    "DecodeObservation",
    "PrefillObservation",
    "arrival_demand",
    "at_target",
    "decide_decode",
    "decide_prefill",
    "decode_arrival_demand",
    "decode_demand",
    "decode_leading",
    "decode_occupancy",
    "decode_params",
    "forecast",
    "prefill_capacity",
    "prefill_demand",
    "prefill_leading",
    "prefill_params",
    "recent_median",
    "within_tolerance",
]


def decode_demand(observed: DecodeObservation, *, target: float) -> float:
    """Replica-equivalents of decode load. Example: 4 ready × 0.9 / 0.6 = 6.0; with 20 running and 10
    queued in the gateway, 6.0 × (1 + 10 / 20) = 9.0."""
    by_kv = observed.ready * observed.mean_kv_utilization / target
    if observed.running_requests > 0 and observed.gateway_queued > 0:
        return by_kv * (1.0 + observed.gateway_queued / observed.running_requests)
    return by_kv


def prefill_demand(observed: PrefillObservation, *, target: float) -> float:
    """Replica-equivalents of prefill load, the larger of the TTFT and the backlog estimates.

    Example: 2 ready, p90 1.5 s, target 0.5 s → 6.0; 40 000 tokens / (10 000 tok/s × 0.5 s) → 8.0; → 8.0.
    With a known capacity (`prefill_capacity`) the leading demand takes over: the TTFT term stops at
    ready + 1 and the backlog term moves there (module docstring): 2 ready, p90 1.5 s → 3.0.
    """
    by_ttft = observed.ready * observed.ttft_p90_s / target if observed.ttft_p90_s is not None else 0.0
    if prefill_capacity(observed) is not None:
        return min(by_ttft, observed.ready + 1.0)
    rate = observed.prefill_tokens_per_s
    by_backlog = observed.queued_prefill_tokens / (rate * target) if rate else 0.0
    return max(by_ttft, by_backlog)


def prefill_capacity(observed: PrefillObservation) -> float | None:
    """One replica's prefill capacity in tokens/s: the higher of the rate measured on a busy engine and
    the gateway's observed throughput (each a lower bound: no engine serves faster than it can); None
    when neither is known. Example: busy 15 000, observed 10 000 → 15 000; 15 000 and 20 000 → 20 000."""
    known = [r for r in (observed.prefill_tokens_per_s, observed.learned_tokens_per_s) if r]
    return max(known) if known else None


#: The leading demands take the median of the arrival demands of the rounds in this span (seconds) before
#: the latest one, bounds excluded: the last three rounds at a 1 s period, the last five at 0.5 s. A span
#: in seconds, not a count of rounds, so a shorter round period reacts sooner to what is immediate (a
#: backlog, the TTFT) without making a one-window spike of arrivals buy a replica any more easily.
MEDIAN_SPAN_S = 2.5


def recent_median(trend: tuple[Sample, ...]) -> float:
    """The median of the values in `trend` (not empty, the latest last) newer than `MEDIAN_SPAN_S`
    before the latest. Examples: 1.0, 1.0, 3.0 at t = 0, 1, 2 → 1.0 (a spike); the same at t = 0, 0.5,
    1 → 1.0; 1.0, 1.0, 3.0, 3.0, 3.0 at t = 0, 0.5, 1, 1.5, 2 → 3.0 (a step, a second on)."""
    latest = trend[-1].t
    return median(s.value for s in trend if s.t > latest - MEDIAN_SPAN_S)


def forecast(trend: tuple[Sample, ...], *, horizon_s: float, now_value: float) -> float:
    """How much a demand rises over `horizon_s` at its slope over `trend` (Theil–Sen: the median of the
    pairwise slopes, which a single jump moves less than a least-squares line), at least 0 and at most
    one replica and half of `now_value`: it pre-scales the *next* replica on a ramp. Examples: 1.0, 1.1,
    1.2 at t = 0, 1, 2 (0.1/s), horizon 5 s → 0.5; 1.0, 1.5, 2.0 (0.5/s) → 2.5, capped at 1.0."""
    slopes = [
        (b.value - a.value) / (b.t - a.t) for i, a in enumerate(trend) for b in trend[i + 1 :] if b.t > a.t
    ]
    if not slopes:
        return 0.0
    slope = median(slopes)
    return min(max(0.0, slope * horizon_s), 1.0, 0.5 * max(0.0, now_value))


def arrival_demand(observed: PrefillObservation, *, params: DeciderParams) -> float | None:
    """Replicas the arriving prompt tokens need at the target utilisation, `arrivals / (R × ρ)`; None
    without a known capacity R. Example: 27 000 tokens/s, R 12 000, ρ 0.8 → 2.81."""
    capacity = prefill_capacity(observed)
    if capacity is None:
        return None
    return (observed.arrival_tokens_per_s or 0.0) / (capacity * params.target_utilization)


def prefill_leading(
    observed: PrefillObservation, *, params: DeciderParams, trend: tuple[Sample, ...]
) -> float | None:
    """The prefill pool's leading demand (module docstring), `trend` holding the recent arrival demand
    (the latest last; `recent_median` of it is used); None when there is no capacity to divide by and
    an engine is running (the lagging demand decides alone). A demand above the ready count by no more
    than the tolerance is the ready count (`within_tolerance`). Example: arrival demand 2.81; 30 000
    tokens waiting, R 12 000, start 5 s → (27 000 + 6 000) / 12 000 = 2.75, the larger 2.81; flat trend →
    2.81."""
    capacity = prefill_capacity(observed)
    if capacity is None:
        arriving = (observed.arrival_tokens_per_s or 0.0) > 0 or observed.gateway_queued > 0
        return 1.0 if observed.ready == 0 and arriving else None  # from zero: one replica to measure
    # The median over the last MEDIAN_SPAN_S: a spike in one 2 s window (a client's burst, a late scrape)
    # does not buy a replica; a step moves it about a second after it shows (recent_median).
    arrival = recent_median(trend) if trend else arrival_demand(observed, params=params) or 0.0
    start = observed.engine_start_s
    horizon = start if start is not None else params.panic_window_s
    # `arrival` is in replicas at utilisation ρ; × ρ gives the replicas the same tokens need at 100%.
    drain = arrival * params.target_utilization + observed.queued_prefill_tokens / (
        capacity * max(params.target, start or 0.0)
    )
    leading = max(arrival, drain) + forecast(trend, horizon_s=horizon, now_value=arrival)
    return within_tolerance(leading, ready=observed.ready, params=params)


def within_tolerance(leading: float, *, ready: int, params: DeciderParams) -> float:
    """A leading demand above the ready count by no more than the tolerance is the ready count: the band
    is AIBrix's, on the demand itself (its KPA scales only when the metric passes target × (1 +
    tolerance)), where the band on the rounded count lets any excess through below 10 replicas. At a
    flat load with Poisson arrivals a 2 s window's noise plus the forecast's slope of it crossed an
    integer by a hair and bought a replica, held through the scale-down delay (decode first; prefill on
    the 2026-11-27 steps: 3.00–3.24 at 3 ready, 1.00–1.09 at 1 in the tail). Example: 4 ready,
    tolerance 0.1: 4.3 → 4.0, 4.5 → 4.5 (→ 5 replicas); 0 ready: any demand passes."""
    return float(ready) if ready < leading <= ready * (1 + params.tolerance) else leading


def at_target(observed: DecodeObservation, *, params: DeciderParams) -> float | None:
    """c*: the running requests one decode engine holds at the target KV utilisation, each holding the
    share the running ones hold now; None without engines or a running request. Example: 6 running
    hold 0.3 of 1 ready, target 0.6 → 12."""
    running, kv = observed.running_requests, observed.mean_kv_utilization
    if observed.ready <= 0 or running <= 0 or kv <= 0:
        return None
    return params.target * running / (observed.ready * kv)


def decode_occupancy(observed: DecodeObservation, *, params: DeciderParams) -> float | None:
    """Replicas the requests already in the system need at c* each (`at_target`): running in the
    decode engines, queued in the gateway, and on their way (held for or in prefill, waiting in a
    decode engine); None without c*. Unlike the arrival demand this takes no median: these requests
    are here, and in P/D they reach decode within a prefill. Example: 8 running hold 0.38 of 1 ready,
    target 0.5 → c* = 10.5; 4 queued and 6 in prefill → (8 + 4 + 6) / 10.5 = 1.71."""
    per_engine = at_target(observed, params=params)
    if per_engine is None:
        return None
    here = observed.running_requests + observed.gateway_queued + observed.on_the_way
    return here / per_engine


def decode_arrival_demand(observed: DecodeObservation, *, params: DeciderParams) -> float | None:
    """Replicas the arriving requests need with every engine at the target KV utilisation, by Little's
    law (module docstring): `arrivals × s(c*) / c*`, where c* = target × running / (ready × kv) is the
    running requests one engine holds at the target and s(c*) the learned service time there
    (`tandem.autoscaler.service`); without a learned curve, the service time as measured now. None
    without arrivals, a service time, engines or a running request. Example: 6 running hold 0.3 of
    1 ready, target 0.6 → c* = 12; 9/s × 2.0 s (measured) / 12 = 1.5; with the curve 0.8 + 0.2·c
    learned (2.0 s at today's 6 running), s(12) = 3.2 s → 9 × 3.2 / 12 = 2.4."""
    per_engine = at_target(observed, params=params)
    if observed.arrivals_per_s is None or per_engine is None:
        return None
    curve = observed.service_curve
    service = curve.at(per_engine) if curve is not None else observed.service_s
    if service is None:
        return None
    return observed.arrivals_per_s * service / per_engine


def decode_leading(
    observed: DecodeObservation, *, params: DeciderParams, trend: tuple[Sample, ...]
) -> float | None:
    """The decode pool's leading demand (module docstring): with engines, `recent_median` of the
    arrival demands in `trend` plus the forecast, or the occupancy demand (`decode_occupancy`) when
    that is higher; without any, 1 while the gateway holds, queues or sees arriving requests (scale
    from zero). None when there is nothing to say.

    A demand above the ready count by no more than the tolerance is the ready count
    (`within_tolerance`)."""
    if observed.ready == 0:
        waiting = observed.gateway_held + observed.gateway_queued + (observed.arrivals_per_s or 0.0)
        return 1.0 if waiting > 0 else None
    occupancy = decode_occupancy(observed, params=params)
    if not trend or decode_arrival_demand(observed, params=params) is None:
        leading = occupancy
    else:
        arrival = recent_median(trend)
        start = observed.engine_start_s
        horizon = start if start is not None else params.panic_window_s
        leading = arrival + forecast(trend, horizon_s=horizon, now_value=arrival)
        if occupancy is not None:
            leading = max(leading, occupancy)
    if leading is None:
        return None
    return within_tolerance(leading, ready=observed.ready, params=params)


def decide_decode(
    *, params: DeciderParams, observed: DecodeObservation, state: DeciderState, now: float
) -> tuple[Decision, DeciderState]:
    """Decide the decode pool's replicas on mean KV-cache utilisation against ``params.target``."""
    util = observed.mean_kv_utilization
    problem = None if math.isfinite(util) and 0.0 <= util <= 1.0 else f"KV utilisation {util} not in [0, 1]"
    counts = (
        observed.running_requests,
        observed.gateway_queued,
        observed.gateway_held,
        observed.on_the_way,
        observed.arrivals_per_s or 0.0,
        observed.service_s or 0.0,
    )
    if problem is None and not all(math.isfinite(v) and v >= 0 for v in counts):
        problem = "negative or non-finite request count"
    return _decide(params=params, observed=observed, problem=problem, state=state, now=now)


def decide_prefill(
    *, params: DeciderParams, observed: PrefillObservation, state: DeciderState, now: float
) -> tuple[Decision, DeciderState]:
    """Decide the prefill pool's replicas on p90 TTFT and queued backlog against ``params.target``."""
    values = (
        observed.ttft_p90_s or 0.0,
        observed.prefill_tokens_per_s or 0.0,
        observed.learned_tokens_per_s or 0.0,
        observed.arrival_tokens_per_s or 0.0,
        observed.gateway_queued,
    )
    bad = [v for v in values if not math.isfinite(v) or v < 0] or observed.queued_prefill_tokens < 0
    problem = "negative or non-finite prefill metric" if bad else None
    return _decide(params=params, observed=observed, problem=problem, state=state, now=now)


def _hold_reason(
    observed: DecodeObservation | PrefillObservation,
    problem: str | None,
    *,
    params: DeciderParams,
    now: float,
) -> str | None:
    if not observed.valid:
        return "hold: observation marked invalid"
    if problem is not None:
        return f"hold: {problem}"
    if observed.ready < 0:
        return f"hold: negative ready count {observed.ready}"
    age = now - observed.timestamp
    if age > params.max_observation_age_s:
        return f"hold: observation stale ({age:.1f}s old > {params.max_observation_age_s:.1f}s)"
    return None


def _decide(
    *,
    params: DeciderParams,
    observed: DecodeObservation | PrefillObservation,
    problem: str | None,
    state: DeciderState,
    now: float,
) -> tuple[Decision, DeciderState]:
    hold = _hold_reason(observed, problem, params=params, now=now)
    if hold is not None:
        return Decision(desired=observed.ready, reason=hold, valid=False), state
    trend_window = params.panic_window_s
    leading: float | None
    if isinstance(observed, DecodeObservation):
        demand = decode_demand(observed, target=params.target)
        arrival = decode_arrival_demand(observed, params=params)
        trend = state.trend if arrival is None else (*state.trend, Sample(now, arrival))
        trend = within(trend, now=now, window_s=trend_window)
        leading = decode_leading(observed, params=params, trend=trend)
        occupancy = decode_occupancy(observed, params=params)
        # The reason names the occupancy demand beside the leading demand that acted.
        detail = f", occupancy {occupancy:.2f}" if occupancy is not None else ""
    else:
        demand = prefill_demand(observed, target=params.target)
        arrival = arrival_demand(observed, params=params)
        trend = state.trend if arrival is None else (*state.trend, Sample(now, arrival))
        trend = within(trend, now=now, window_s=trend_window)
        leading = prefill_leading(observed, params=params, trend=trend)
        detail = ""
    sampled = max(demand, leading) if leading is not None else demand
    samples = within((*state.samples, Sample(now, sampled)), now=now, window_s=params.stable_window_s)
    ready = observed.ready
    desired, reason, state = _panic_or_stable(
        params=params, samples=samples, ready=ready, state=state, now=now
    )
    state = replace(state, trend=trend)
    if leading is not None and ceil_replicas(leading) > desired:
        desired = ceil_replicas(leading)
        reason = f"{reason}; leading signals want {desired} now ({leading:.2f}{detail})"
    if ready > 0 and abs(desired - ready) <= params.tolerance * ready + 1e-9:  # |desired/ready - 1| <= tol
        desired, reason = ready, f"{reason}; within ±{params.tolerance:.0%} of {ready} ready, keep"
    # A fresh decider has no history, so it counts today's ready as a desire: no scale-down for one delay.
    seed = () if state.desires else (Sample(now, ready),)
    desires = within(
        (*seed, *state.desires, Sample(now, desired)), now=now, window_s=params.scale_down_delay_s
    )
    if desired < ready:
        delayed = min(ready, ceil_replicas(peak(desires)))
        if delayed > desired:
            desired, reason = delayed, f"{reason}; scale-down delay holds {delayed}"
    desired, reason = _limit(params=params, desired=desired, ready=ready, reason=reason)
    return Decision(desired=desired, reason=reason), replace(state, samples=samples, desires=desires)


def _panic_or_stable(
    *, params: DeciderParams, samples: tuple[Sample, ...], ready: int, state: DeciderState, now: float
) -> tuple[int, str, DeciderState]:
    """KPA's mode switch. Example: 2 ready, panic-window desire 5 ≥ 2.0 × 2 → panic, desire 5; 60 s later
    without the trigger, back to the stable-window desire."""
    stable = ceil_replicas(mean(samples))
    panic = ceil_replicas(mean(within(samples, now=now, window_s=params.panic_window_s)))
    if panic >= params.panic_threshold * max(ready, 1) and panic > ready:
        state = replace(state, panic_since=now)
    elif state.panic_since is not None and now - state.panic_since >= params.stable_window_s:
        state = replace(state, panic_since=None, max_panic_replicas=0)
    if state.panic_since is None:
        return stable, f"stable: {params.stable_window_s:g}s window wants {stable}", state
    held = max(panic, state.max_panic_replicas, ready)
    state = replace(state, max_panic_replicas=held)
    return held, f"panic: {params.panic_window_s:g}s window wants {panic}, no scale-down, {held}", state


def _limit(*, params: DeciderParams, desired: int, ready: int, reason: str) -> tuple[int, str]:
    """Step limits around ``ready``, then min/max. Example: ready 2, desired 9, step up 4, max 8 → 6."""
    limited = desired
    if params.max_step_up is not None:
        limited = min(limited, ready + params.max_step_up)
    if params.max_step_down is not None:
        limited = max(limited, ready - params.max_step_down)
    if limited != desired:
        reason = f"{reason}; step limit {limited}"
    bounded = min(max(limited, params.min), params.max)
    if bounded != limited:
        reason = f"{reason}; clamped to [{params.min}, {params.max}]"
    return bounded, reason
