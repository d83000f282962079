"""The decider's leading signals and the learned start time, as worked examples and fake-clock stories.

All real autoscaler code, pure; the "pool" in the stories is a tiny model: arrivals in tokens per second,
engines serving a fixed capacity each, replicas becoming ready a fixed start time after they are asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from tandem.autoscaler.decider import (
    DeciderParams,
    DeciderState,
    DecodeObservation,
    PrefillObservation,
    arrival_demand,
    decide_decode,
    decide_prefill,
    decode_arrival_demand,
    decode_leading,
    decode_occupancy,
    forecast,
    prefill_leading,
    recent_median,
)
from tandem.autoscaler.service import ServiceCurve
from tandem.autoscaler.startup import StartTimes, asked, cancelled, readied
from tandem.autoscaler.windows import Sample

PARAMS = DeciderParams(min=1, max=12, target=0.5, stable_window_s=20, panic_window_s=4, scale_down_delay_s=30)


# ------------------------------------------------------------------------------------ worked examples


def test_the_module_docstrings_prefill_example() -> None:
    observed = PrefillObservation(
        timestamp=0,
        ready=2,
        arrival_tokens_per_s=27_000,
        prefill_tokens_per_s=12_000,
        queued_prefill_tokens=30_000,
        engine_start_s=5.0,
    )
    assert arrival_demand(observed, params=PARAMS) == pytest.approx(2.8125)
    flat = (Sample(0, 2.8125), Sample(1, 2.8125))
    # (27 000 + 30 000 / 5) / 12 000 = 2.75 < 2.81: the headroom at ρ drains this backlog.
    assert prefill_leading(observed, params=PARAMS, trend=flat) == pytest.approx(2.8125)
    step = replace(observed, queued_prefill_tokens=90_000)  # a step's backlog while engines start
    assert prefill_leading(step, params=PARAMS, trend=flat) == pytest.approx((27_000 + 18_000) / 12_000)


def test_without_a_start_time_the_backlog_drains_within_the_ttft_target() -> None:
    observed = PrefillObservation(
        timestamp=0, ready=2, queued_prefill_tokens=40_000, prefill_tokens_per_s=1e4
    )
    assert prefill_leading(observed, params=PARAMS, trend=()) == pytest.approx(40_000 / (1e4 * 0.5))


def test_the_gateways_learned_rate_stands_in_before_any_engine_was_saturated() -> None:
    observed = PrefillObservation(
        timestamp=0, ready=1, arrival_tokens_per_s=24_000, learned_tokens_per_s=10_000
    )
    assert prefill_leading(observed, params=PARAMS, trend=()) == pytest.approx(3.0)
    measured = PrefillObservation(
        timestamp=0,
        ready=1,
        arrival_tokens_per_s=24_000,
        learned_tokens_per_s=10_000,
        prefill_tokens_per_s=15_000,
    )
    assert prefill_leading(measured, params=PARAMS, trend=()) == pytest.approx(2.0)
    # Both are lower bounds of what an engine does: the higher one counts.
    higher = replace(measured, learned_tokens_per_s=20_000)
    assert prefill_leading(higher, params=PARAMS, trend=()) == pytest.approx(24_000 / (20_000 * 0.8))


@pytest.mark.parametrize(
    ("observed", "leading"),
    [
        (PrefillObservation(timestamp=0, ready=0, arrival_tokens_per_s=3000), 1.0),  # from zero
        (PrefillObservation(timestamp=0, ready=0, gateway_queued=2), 1.0),
        (PrefillObservation(timestamp=0, ready=0), None),  # nothing arrives: stay at zero
        (PrefillObservation(timestamp=0, ready=2, arrival_tokens_per_s=3000), None),  # no rate: lagging only
    ],
    ids=["arrivals-no-engine", "queued-no-engine", "idle", "no-capacity-known"],
)
def test_without_a_capacity_only_an_empty_pool_with_demand_gets_a_first_replica(
    observed: PrefillObservation, leading: float | None
) -> None:
    assert prefill_leading(observed, params=PARAMS, trend=()) == leading


@pytest.mark.parametrize(
    ("values", "horizon", "now_value", "rise"),
    [
        ((1.0, 1.5, 2.0), 5.0, 2.0, 1.0),  # slope 0.5/s × 5 s = 2.5, capped at one replica
        ((1.0, 1.5, 2.0), 5.0, 1.0, 0.5),  # ... and at half of the demand now
        ((1.0, 1.0, 1.0, 3.0), 5.0, 3.0, 1.0),  # a jump: median slope (0 + 2/3) / 2 × 5 = 1.67 → 1.0
        ((1.0, 1.1, 1.2), 5.0, 1.2, 0.5),  # slope 0.1/s × 5 s = 0.5, under the cap
        ((2.0, 1.5, 1.0), 5.0, 1.0, 0.0),  # falling: no forecast down
        ((2.0,), 5.0, 2.0, 0.0),  # one sample: no slope
    ],
    ids=["capped-one-replica", "capped-half", "jump", "ramp", "falling", "single"],
)
def test_the_forecast_extrapolates_a_rise_within_bounds(
    values: tuple[float, ...], horizon: float, now_value: float, rise: float
) -> None:
    trend = tuple(Sample(float(t), v) for t, v in enumerate(values))
    assert forecast(trend, horizon_s=horizon, now_value=now_value) == pytest.approx(rise)


@pytest.mark.parametrize(
    ("times", "values", "median"),
    [
        ((0, 1, 2), (1.0, 1.0, 3.0), 1.0),  # a spike in the last of three 1 s rounds
        ((0, 0.5, 1), (1.0, 1.0, 3.0), 1.0),  # the same at half-second rounds
        ((0, 0.5, 1, 1.5, 2), (1.0, 1.0, 3.0, 3.0, 3.0), 3.0),  # a step, a second on
        ((0, 0.5, 1, 1.5, 2), (1.0, 1.0, 1.0, 3.0, 3.0), 1.0),  # a step half a second on: not yet
        ((0, 1, 2, 3), (9.0, 1.0, 2.0, 3.0), 2.0),  # 2.5 s back from t = 3: the round at 0 is out
    ],
    ids=["spike-1s", "spike-half-s", "step-1s-on", "step-half-s-on", "span"],
)
def test_the_leading_demands_median_spans_seconds_not_rounds(
    times: tuple[float, ...], values: tuple[float, ...], median: float
) -> None:
    """The docstring's examples: at 1 s rounds the last three, at half-second rounds the last five, so a
    shorter round period does not let a one-window spike through any sooner."""
    trend = tuple(Sample(float(t), v) for t, v in zip(times, values, strict=True))
    assert recent_median(trend) == pytest.approx(median)


@pytest.mark.parametrize(
    ("observed", "leading"),
    [
        (DecodeObservation(timestamp=0, ready=0, gateway_held=3), 1.0),
        (DecodeObservation(timestamp=0, ready=0, arrivals_per_s=0.5), 1.0),
        (DecodeObservation(timestamp=0, ready=0), None),
        (DecodeObservation(timestamp=0, ready=2, gateway_queued=4), None),
    ],
    ids=["held", "arriving", "idle-at-zero", "idle"],
)
def test_decode_from_zero_wants_one_replica_while_requests_wait(
    observed: DecodeObservation, leading: float | None
) -> None:
    assert decode_leading(observed, params=PARAMS, trend=()) == leading


DECODE = DeciderParams(min=1, max=12, target=0.6, stable_window_s=20, panic_window_s=4, scale_down_delay_s=30)
KNOWN = DecodeObservation(
    timestamp=0, ready=1, mean_kv_utilization=0.3, running_requests=6, arrivals_per_s=9.0, service_s=2.0
)


def test_the_module_docstrings_decode_example() -> None:
    """9 requests/s running 2.0 s each → 18 at once; 6 running hold 0.3 of 1 replica, target 0.6 → 1.5."""
    assert decode_arrival_demand(KNOWN, params=DECODE) == pytest.approx(1.5)
    flat = (Sample(0, 1.5), Sample(1, 1.5), Sample(2, 1.5))
    assert decode_leading(KNOWN, params=DECODE, trend=flat) == pytest.approx(1.5)


def test_the_decode_leading_demand_takes_the_median_over_seconds_not_the_last_three_rounds() -> None:
    """Half-second rounds, a rise half a second old: the last three rounds (1.5, 3.0, 3.0) would say 3.0
    and buy replicas on it; the span's five say 1.5, plus the forecast (Theil–Sen slope 0.875/s × the
    4 s panic window, capped at half of 1.5) → 2.25."""
    trend = tuple(Sample(t, v) for t, v in zip((0, 0.5, 1, 1.5, 2), (1.5, 1.5, 1.5, 3.0, 3.0), strict=True))
    assert decode_leading(KNOWN, params=DECODE, trend=trend) == pytest.approx(1.5 + 0.75)


def test_the_decode_demand_takes_the_learned_service_time_at_the_kv_targets_concurrency() -> None:
    """The docstring's example: c* = 0.6 × 6 / (1 × 0.3) = 12; the line 0.8 + 0.2·c (2.0 s at today's 6
    running, as measured) says 3.2 s there → 9 × 3.2 / 12 = 2.4, where the measured time said 1.5."""
    learned = replace(KNOWN, service_curve=ServiceCurve(intercept_s=0.8, slope_s=0.2, floor_s=1.0))
    assert decode_arrival_demand(learned, params=DECODE) == pytest.approx(2.4)
    # A line and no measured time yet (nothing finished in the window): the line alone.
    assert decode_arrival_demand(replace(learned, service_s=None), params=DECODE) == pytest.approx(2.4)


@pytest.mark.parametrize(
    ("median", "ready", "leading"),
    [(4.3, 4, 4.0), (4.5, 4, 4.5), (3.6, 4, 3.6), (1.05, 1, 1.0), (1.2, 1, 1.2)],
    ids=["within-band", "beyond-band", "below-ready", "one-within", "one-beyond"],
)
def test_a_decode_leading_demand_within_the_tolerance_above_ready_keeps_ready(
    median: float, ready: int, leading: float
) -> None:
    """The docstring's example: 4 ready, tolerance 0.1: 4.3 → 4.0, 4.5 → 4.5 (a flat trend: no forecast)."""
    observed = replace(KNOWN, ready=ready, running_requests=6.0 * ready, mean_kv_utilization=0.3)
    flat = tuple(Sample(float(t), median) for t in range(3))
    assert decode_leading(observed, params=DECODE, trend=flat) == pytest.approx(leading)


@pytest.mark.parametrize(
    ("median", "ready", "leading"),
    [(3.04, 3, 3.0), (3.31, 3, 3.31), (2.5, 3, 2.5), (1.05, 1, 1.0), (1.2, 1, 1.2), (0.3, 0, 0.3)],
    ids=["within-band", "beyond-band", "below-ready", "one-within", "one-beyond", "from-zero"],
)
def test_a_prefill_leading_demand_within_the_tolerance_above_ready_keeps_ready(
    median: float, ready: int, leading: float
) -> None:
    """As decode's: 3 ready, tolerance 0.1: 3.04 → 3.0 (the 2026-11-27 steps bought a fourth replica on
    3.00–3.24 and held it through the scale-down delay), 3.31 → 3.31 (→ 4); nothing ready: any demand."""
    observed = PrefillObservation(
        timestamp=2, ready=ready, arrival_tokens_per_s=median * 9_600, prefill_tokens_per_s=12_000
    )
    flat = tuple(Sample(float(t), median) for t in range(3))
    assert prefill_leading(observed, params=replace(PARAMS, target_utilization=0.8), trend=flat) == (
        pytest.approx(leading)
    )


def test_a_prefill_pool_at_a_flat_load_a_hair_over_its_replicas_does_not_scale() -> None:
    """3 ready and arrivals a hair over three replicas' worth at ρ (3.04), round after round: the
    decision keeps 3, where without the band every round asked for a fourth."""
    params = replace(PARAMS, target_utilization=0.8)
    state, desired = DeciderState(), []
    for t in range(12):
        seen = PrefillObservation(
            timestamp=t,
            ready=3,
            arrival_tokens_per_s=3.04 * 9_600,
            prefill_tokens_per_s=12_000,
            ttft_p90_s=0.1,
        )
        decision, state = decide_prefill(params=params, observed=seen, state=state, now=float(t))
        desired.append(decision.desired)
    assert desired == [3] * 12


@pytest.mark.parametrize(
    "observed",
    [replace(KNOWN, running_requests=0.0), replace(KNOWN, mean_kv_utilization=0.0)],
    ids=["nothing-running", "empty-cache"],
)
def test_decode_without_a_share_has_no_leading_demand(observed: DecodeObservation) -> None:
    assert decode_arrival_demand(observed, params=DECODE) is None
    assert decode_occupancy(observed, params=DECODE) is None
    assert decode_leading(observed, params=DECODE, trend=(Sample(0, 1.5),)) is None


@pytest.mark.parametrize(
    "observed",
    [replace(KNOWN, service_s=None), replace(KNOWN, arrivals_per_s=None)],
    ids=["no-service-time", "no-arrivals"],
)
def test_decode_without_a_rate_has_the_occupancy_demand_alone(observed: DecodeObservation) -> None:
    # 6 running hold 0.3 of 1 ready, target 0.6 → c* = 12; 6 running, 9 queued, 3 in prefill → 1.5.
    observed = replace(observed, gateway_queued=9.0, on_the_way=3.0)
    assert decode_arrival_demand(observed, params=DECODE) is None
    assert decode_leading(observed, params=DECODE, trend=(Sample(0, 1.5),)) == pytest.approx(1.5)


def test_the_decode_occupancy_demand_takes_a_step_before_the_arrivals_median_does() -> None:
    """The docstring's example: 8 running hold 0.38 of 1 ready, target 0.5 → c* = 10.5; 4 queued in
    the gateway and 6 in prefill → 18 / 10.5 = 1.71, taken in the round that sees it, while the median
    of the arrival demands still says what the idle seconds needed."""
    params = replace(DECODE, target=0.5)
    observed = replace(
        KNOWN, running_requests=8.0, mean_kv_utilization=0.38, gateway_queued=4.0, on_the_way=6.0
    )
    assert decode_occupancy(observed, params=params) == pytest.approx(18 / (0.5 * 8 / 0.38))
    idle_then_step = (Sample(0, 0.3), Sample(0.5, 0.3), Sample(1.0, 0.35), Sample(1.5, 1.9))
    leading = decode_leading(observed, params=params, trend=idle_then_step)
    assert leading == pytest.approx(1.71, abs=0.01)
    # Nothing beyond the running ones: the occupancy is what they hold now, below the arrivals' need.
    calm = replace(observed, gateway_queued=0.0, on_the_way=0.0)
    flat = tuple(Sample(t / 2, 1.2) for t in range(5))
    assert decode_occupancy(calm, params=params) == pytest.approx(0.76)
    assert decode_leading(calm, params=params, trend=flat) == pytest.approx(1.2)


def test_held_requests_scale_an_empty_decode_pool_from_zero() -> None:
    params = DeciderParams(min=0, max=4, target=0.7, scale_down_delay_s=30)
    decision, _ = decide_decode(
        params=params,
        observed=DecodeObservation(timestamp=0, ready=0, gateway_held=5),
        state=DeciderState(),
        now=0,
    )
    assert decision.desired == 1


# ------------------------------------------------------------------------------------- start times


def test_start_times_are_learned_from_the_pools_own_scale_ups() -> None:
    times = asked(StartTimes(), now=10.0, count=2)
    times = readied(times, now=15.0, count=1, forget_after_s=600)
    assert times.estimate_s == pytest.approx(5.0)
    times = readied(times, now=17.0, count=1, forget_after_s=600)
    assert times.estimate_s == pytest.approx(0.3 * 7.0 + 0.7 * 5.0) and times.samples == 2
    assert times.pending == ()


def test_replicas_nobody_asked_for_teach_nothing_and_cancelled_asks_are_dropped() -> None:
    assert readied(StartTimes(), now=5.0, count=3, forget_after_s=600).estimate_s is None
    times = cancelled(asked(StartTimes(), now=0.0, count=3), count=2)
    assert times.pending == (0.0,)
    stuck = readied(asked(StartTimes(), now=0.0, count=1), now=700.0, count=1, forget_after_s=600)
    assert stuck.estimate_s is None and stuck.pending == ()


# ------------------------------------------------------------------------------------------ stories

CAPACITY = 9_000.0  # tokens/s per prefill replica (three 3,000-token prompts a second)
PROMPT = 3_000.0


def run_prefill(
    rate_at: Callable[[float], float], *, until: float, start_s: float = 5.0, params: DeciderParams = PARAMS
) -> list[tuple[float, int, int]]:
    """Every second: arrivals (requests/s × PROMPT tokens), a backlog that grows when arrivals exceed
    what the ready replicas serve, replicas ready `start_s` after being asked. Returns (t, ready, desired)."""
    state, t, ready, backlog = DeciderState(), 0.0, 1, 0.0
    asks: list[tuple[float, int]] = []  # (ready at, count)
    desired_now = 1
    out: list[tuple[float, int, int]] = []
    while t <= until:
        for due, count in [a for a in asks if a[0] <= t]:
            ready += count
            asks.remove((due, count))
        arriving = rate_at(t) * PROMPT
        backlog = max(0.0, backlog + arriving - ready * CAPACITY)
        seen = PrefillObservation(
            timestamp=t,
            ready=ready,
            arrival_tokens_per_s=arriving,
            queued_prefill_tokens=round(backlog),
            prefill_tokens_per_s=CAPACITY,
            engine_start_s=start_s,
        )
        decision, state = decide_prefill(params=params, observed=seen, state=state, now=t)
        if decision.desired > desired_now:
            asks.append((t + start_s, decision.desired - desired_now))
        elif decision.desired < desired_now:
            ready -= desired_now - decision.desired
        desired_now = decision.desired
        out.append((t, ready, desired_now))
        t += 1.0
    return out


def test_a_step_is_met_within_two_rounds_without_overshooting() -> None:
    """Idle (0.5 req/s) → 9 req/s at t = 10: 9 × 3 000 / (9 000 × 0.8) = 3.75 → 4 replicas, asked in
    the second round that sees the step (the median of three rounds ignores a one-round spike), and
    never more than 7 (one forecast replica, and the backlog of the start-up gap drained within a
    start time)."""
    run = run_prefill(lambda t: 0.5 if t < 10 else 9.0, until=90)
    first_up = next(t for t, _, desired in run if desired >= 4)
    assert first_up == 11.0
    assert max(desired for _, _, desired in run) <= 7
    # Panic (20 s stable window after its last trigger) then the 30 s delay: back to 4 by 66 s.
    assert [desired for t, _, desired in run if t >= 66] == [4] * 25


def test_a_one_round_spike_of_arrivals_buys_no_replica() -> None:
    observed = PrefillObservation(timestamp=3, ready=1, arrival_tokens_per_s=36e3, prefill_tokens_per_s=9e3)
    spike = (Sample(1, 0.5), Sample(2, 0.5), Sample(3, 5.0))  # the latest round alone saw 5 replicas' worth
    assert prefill_leading(observed, params=PARAMS, trend=spike) == pytest.approx(0.5 + 0.25)  # + forecast


def test_after_the_load_falls_scale_down_waits_for_the_delay_and_does_not_flap() -> None:
    run = run_prefill(lambda t: 9.0 if 10 <= t < 40 else 0.5, until=120)
    desired = {t: d for t, _, d in run}
    assert desired[45.0] >= 4  # within the 30 s delay: held
    assert desired[120.0] == 1  # the load is gone
    downs = [t for (t, _, d), (_, _, prev) in zip(run[1:], run, strict=False) if d < prev]
    ups_after = [t for (t, _, d), (_, _, prev) in zip(run[1:], run, strict=False) if d > prev and t > 40]
    assert downs and not ups_after  # once down, it does not come back up for the same idle load


KV_PER_REQUEST = 0.1  # of one decode replica's cache
SERVICE_S = 2.0


def run_decode(
    rate_at: Callable[[float], float], *, until: float, leading: bool, start_s: float = 5.0
) -> list[tuple[float, int, int]]:
    """Every second: requests running = arrivals × service time (Little's law), as many as the ready
    replicas' caches hold, each holding `KV_PER_REQUEST`; the rest wait for their prefill or inside the
    engines, where no signal counts them (as measured at a step: docs/autoscaler.md); replicas
    ready `start_s` after being asked. `leading=False` hides the service time (the lagging KV and queue
    signals alone). Returns (t, ready, desired)."""
    state, t, ready, desired_now = DeciderState(), 0.0, 1, 1
    asks: list[tuple[float, int]] = []
    out: list[tuple[float, int, int]] = []
    while t <= until:
        for due, count in [a for a in asks if a[0] <= t]:
            ready += count
            asks.remove((due, count))
        running = min(rate_at(t) * SERVICE_S, ready / KV_PER_REQUEST)
        seen = DecodeObservation(
            timestamp=t,
            ready=ready,
            mean_kv_utilization=running * KV_PER_REQUEST / ready,
            running_requests=running,
            arrivals_per_s=rate_at(t),
            service_s=SERVICE_S if leading else None,
            engine_start_s=start_s,
        )
        decision, state = decide_decode(params=DECODE, observed=seen, state=state, now=t)
        if decision.desired > desired_now:
            asks.append((t + start_s, decision.desired - desired_now))
        desired_now = max(desired_now, decision.desired)
        out.append((t, ready, desired_now))
        t += 1.0
    return out


def test_a_decode_step_is_met_before_the_caches_fill() -> None:
    """Idle (0.5 req/s) → 9 req/s at t = 10: 9 × 2 s = 18 running × 0.1 / 0.6 = 3 replicas, asked in the
    second round that sees the step; the KV signal alone saturates (a full cache says 1 / 0.6 at most per
    replica) and gets there rounds later. At most one forecast replica over."""
    step = run_decode(lambda t: 0.5 if t < 10 else 9.0, until=40, leading=True)
    lagging = run_decode(lambda t: 0.5 if t < 10 else 9.0, until=40, leading=False)
    first = next(t for t, _, desired in step if desired >= 3)
    assert first == 11.0
    assert next(t for t, _, desired in lagging if desired >= 3) > first + 1.0
    assert max(desired for _, _, desired in step) <= 4


def test_a_ramp_is_pre_scaled_by_the_forecast() -> None:
    """0.5 → 9 req/s over 30 s: the replicas asked for at t cover the arrivals at t + start (5 s) for the
    whole ramp, where arrivals alone would lag one start time behind."""

    def ramp(t: float) -> float:
        return 0.5 + 8.5 * min(1.0, max(0.0, (t - 10) / 30))

    run = run_prefill(ramp, until=45)
    for t, _, desired in run:
        if 15 <= t <= 35:
            need_later = ramp(t + 5.0) * PROMPT / (CAPACITY * 0.8)
            assert desired >= need_later - 0.5, (t, desired, need_later)


def test_a_decode_decision_says_what_its_occupancy_demand_was() -> None:
    """The reason names the occupancy demand beside the leading demand that acted (here it is the one)."""
    params = replace(DECODE, target=0.5)
    observed = replace(
        KNOWN, running_requests=8.0, mean_kv_utilization=0.38, gateway_queued=4.0, on_the_way=6.0
    )
    calm = DeciderState(samples=tuple(Sample(float(t), 0.4) for t in range(-19, 0)))  # windows: 1
    decision, _ = decide_decode(params=params, observed=observed, state=calm, now=0.0)
    assert decision.desired == 2
    assert "leading signals want 2 now (1.71, occupancy 1.71)" in decision.reason
