"""The decider, driven by fake-clock stories and tables.

Everything is real decider code and pure; time is a fake clock (plain floats stepped by the test), and the
"pool" is a tiny model in which ready replicas follow the last decision at once and a fixed total load
spreads over them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tandem.autoscaler.decider import (
    DeciderParams,
    DeciderState,
    Decision,
    DecodeObservation,
    PrefillObservation,
    decide_decode,
    decide_prefill,
    decode_demand,
    decode_params,
    prefill_demand,
    prefill_params,
)
from tandem.autoscaler.windows import ceil_replicas, median
from tandem.core.spec import DecodeAutoscaling, PrefillAutoscaling

STEP_S = 2.0


def run_decode(
    *, params: DeciderParams, load_at: Callable[[float], float], ready: int, until: float
) -> list[tuple[float, Decision]]:
    """Every 2 s, observe the pool (KV util = total load / ready, at most 1) and follow the decision."""
    state, out, t = DeciderState(), [], 0.0
    while t <= until:
        util = min(1.0, load_at(t) / ready)
        seen = DecodeObservation(timestamp=t, ready=ready, mean_kv_utilization=util)
        decision, state = decide_decode(params=params, observed=seen, state=state, now=t)
        out.append((t, decision))
        ready, t = decision.desired, t + STEP_S
    return out


def test_a_load_step_scales_decode_up_within_one_panic_window() -> None:
    params = DeciderParams(min=1, max=20, target=0.5)
    story = run_decode(params=params, load_at=lambda t: 1.0 if t < 100 else 4.0, ready=2, until=130)
    assert all(d.desired == 2 for t, d in story if t < 100)
    within_panic = [d for t, d in story if 100 <= t <= 106]
    assert any(d.desired >= 4 and d.reason.startswith("panic") for d in within_panic)


def test_load_oscillating_inside_the_tolerance_band_never_scales() -> None:
    params = DeciderParams(min=1, max=20, target=0.5)
    story = run_decode(params=params, load_at=lambda t: 4.8 if int(t) % 4 else 5.2, ready=10, until=900)
    assert {d.desired for _, d in story} == {10}


def test_scale_down_waits_for_the_delay_then_follows_the_load() -> None:
    params = DeciderParams(min=1, max=20, target=0.5)
    story = run_decode(params=params, load_at=lambda t: 2.0 if t < 400 else 0.5, ready=4, until=800)
    assert all(d.desired == 4 for t, d in story if t < 400 + 298)
    assert [d.desired for t, d in story if t >= 760] == [1] * len([t for t, _ in story if t >= 760])


def test_a_fresh_decider_does_not_scale_down_before_one_delay() -> None:
    params = DeciderParams(min=1, max=20, target=0.5)
    story = run_decode(params=params, load_at=lambda t: 0.5, ready=4, until=400)
    assert all(d.desired == 4 for t, d in story if t < 300)
    assert story[-1][1].desired == 1


def test_panic_never_scales_down_and_ends_after_a_quiet_stable_window() -> None:
    params = DeciderParams(min=1, max=20, target=0.5, scale_down_delay_s=0.0)
    story = run_decode(params=params, load_at=lambda t: 8.0 if 50 <= t < 60 else 1.0, ready=2, until=300)
    panicking = [(t, d) for t, d in story if d.reason.startswith("panic")]
    assert panicking and min(t for t, _ in panicking) < 60
    peaks = [d.desired for _, d in panicking]
    assert peaks == sorted(peaks)
    assert story[-1][1].reason.startswith("stable") and story[-1][1].desired == 2


def test_decode_scales_on_kv_utilisation() -> None:
    params = decode_params(DecodeAutoscaling(enabled=True, min=1, max=16, target_kv_utilization=0.6))
    seen = DecodeObservation(timestamp=0.0, ready=4, mean_kv_utilization=0.9)
    decision, _ = decide_decode(params=params, observed=seen, state=DeciderState(), now=0.0)
    assert decision == Decision(desired=6, reason=decision.reason) and decision.valid


def test_prefill_scales_on_ttft() -> None:
    params = prefill_params(PrefillAutoscaling(enabled=True, min=1, max=8, target_ttft_seconds=0.5))
    seen = PrefillObservation(timestamp=0.0, ready=2, ttft_p90_s=1.5)
    decision, state = decide_prefill(params=params, observed=seen, state=DeciderState(), now=0.0)
    assert decision.desired == 6 and decision.reason.startswith("panic")
    assert state.panic_since == 0.0 and state.max_panic_replicas == 6


@pytest.mark.parametrize(
    ("observation", "now", "why"),
    [
        (DecodeObservation(timestamp=0.0, ready=3, valid=False), 0.0, "invalid"),
        (DecodeObservation(timestamp=0.0, ready=3, mean_kv_utilization=0.9), 31.0, "stale"),
        (DecodeObservation(timestamp=0.0, ready=3, mean_kv_utilization=1.5), 0.0, "not in [0, 1]"),
        (DecodeObservation(timestamp=0.0, ready=3, mean_kv_utilization=float("nan")), 0.0, "not in [0, 1]"),
    ],
)
def test_invalid_or_stale_decode_metrics_hold(observation: DecodeObservation, now: float, why: str) -> None:
    state = DeciderState(panic_since=-5.0, max_panic_replicas=7)
    decision, after = decide_decode(
        params=DeciderParams(min=1, max=9, target=0.5), observed=observation, state=state, now=now
    )
    assert not decision.valid and decision.desired == 3 and why in decision.reason
    assert after is state


def test_invalid_prefill_metrics_hold() -> None:
    seen = PrefillObservation(timestamp=0.0, ready=2, ttft_p90_s=-1.0)
    decision, _ = decide_prefill(
        params=DeciderParams(min=1, max=9, target=0.5), observed=seen, state=DeciderState(), now=0.0
    )
    assert not decision.valid and decision.reason.startswith("hold")


@pytest.mark.parametrize(
    ("params", "ready", "util", "expected"),
    [
        (DeciderParams(min=1, max=5, target=0.5), 4, 1.0, 5),
        (DeciderParams(min=3, max=9, target=0.5, scale_down_delay_s=0.0), 4, 0.0, 3),
        (DeciderParams(min=1, max=20, target=0.5, max_step_up=3), 4, 1.0, 7),
        (DeciderParams(min=1, max=20, target=0.5, max_step_down=1, scale_down_delay_s=0.0), 4, 0.1, 3),
        (DeciderParams(min=1, max=20, target=0.5), 10, 0.54, 10),
    ],
)
def test_bounds_steps_and_tolerance(params: DeciderParams, ready: int, util: float, expected: int) -> None:
    seen = DecodeObservation(timestamp=0.0, ready=ready, mean_kv_utilization=util)
    state = DeciderState(desires=())
    decision, _ = decide_decode(params=params, observed=seen, state=state, now=0.0)
    assert decision.desired == expected


@pytest.mark.parametrize(
    ("observation", "demand"),
    [
        (PrefillObservation(timestamp=0, ready=2, ttft_p90_s=1.5), 6.0),
        (PrefillObservation(timestamp=0, ready=2, ttft_p90_s=1.5, queued_prefill_tokens=40_000), 6.0),
        (PrefillObservation(timestamp=0, ready=2), 0.0),
        # A known capacity: the backlog moves to the leading demand, the TTFT term stops at ready + 1.
        (
            PrefillObservation(timestamp=0, ready=2, queued_prefill_tokens=40_000, prefill_tokens_per_s=1e4),
            0.0,
        ),
        (PrefillObservation(timestamp=0, ready=2, ttft_p90_s=1.5, prefill_tokens_per_s=1e4), 3.0),
        (PrefillObservation(timestamp=0, ready=2, ttft_p90_s=0.6, learned_tokens_per_s=1e4), 2.4),
    ],
)
def test_prefill_demand_is_the_larger_of_ttft_and_backlog(
    observation: PrefillObservation, demand: float
) -> None:
    assert prefill_demand(observation, target=0.5) == pytest.approx(demand)


@pytest.mark.parametrize(("ready", "util", "demand"), [(4, 0.9, 6.0), (2, 0.35, 1.0), (0, 0.0, 0.0)])
def test_decode_demand_is_ready_times_utilisation_over_target(ready: int, util: float, demand: float) -> None:
    seen = DecodeObservation(timestamp=0.0, ready=ready, mean_kv_utilization=util)
    assert decode_demand(seen, target=0.7 if ready == 2 else 0.6) == pytest.approx(demand)


@pytest.mark.parametrize(
    ("running", "queued", "demand"),
    [
        (20.0, 10.0, 9.0),  # the module docstring's example: 6.0 × (1 + 10 / 20)
        (20.0, 0.0, 6.0),  # nothing queued: KV alone
        (0.0, 10.0, 6.0),  # nothing running: no per-request share to count the queue with
        (4.0, 40.0, 66.0),  # a long gateway queue: 6.0 × 11
    ],
    ids=["docstring", "no-queue", "no-running", "long-queue"],
)
def test_decode_demand_counts_gateway_queued_requests_as_running_ones(
    running: float, queued: float, demand: float
) -> None:
    seen = DecodeObservation(
        timestamp=0.0, ready=4, mean_kv_utilization=0.9, running_requests=running, gateway_queued=queued
    )
    assert decode_demand(seen, target=0.6) == pytest.approx(demand)


def test_a_gateway_queue_scales_decode_although_kv_is_on_target() -> None:
    params = DeciderParams(min=1, max=8, target=0.5, panic_window_s=6.0, stable_window_s=60.0)
    seen = DecodeObservation(
        timestamp=10.0, ready=2, mean_kv_utilization=0.5, running_requests=8.0, gateway_queued=16.0
    )
    decision, _ = decide_decode(params=params, observed=seen, state=DeciderState(), now=10.0)
    assert decision.valid and decision.desired == 6  # 2 × 0.5 / 0.5 × (1 + 16 / 8) = 6.0, panic (≥ 2 × 2)
    bad = DecodeObservation(timestamp=10.0, ready=2, mean_kv_utilization=0.5, gateway_queued=-1.0)
    held, _ = decide_decode(params=params, observed=bad, state=DeciderState(), now=10.0)
    assert not held.valid and held.desired == 2


@pytest.mark.parametrize(("demand", "replicas"), [(2.0000000001, 2), (2.1, 3), (-0.5, 0), (0.0, 0)])
def test_ceil_replicas_ignores_float_noise(demand: float, replicas: int) -> None:
    assert ceil_replicas(demand) == replicas


def run_both(
    *, ttft_at: Callable[[float], float], kv_at: Callable[[float], float]
) -> tuple[list[int], list[int]]:
    """Both pools of one service on one fake clock, each following its own decisions (2 ready each)."""
    prefill = prefill_params(PrefillAutoscaling(enabled=True, min=1, max=8, target_ttft_seconds=0.5))
    decode = decode_params(DecodeAutoscaling(enabled=True, min=1, max=8, target_kv_utilization=0.5))
    p_state, d_state, p_ready, d_ready = DeciderState(), DeciderState(), 2, 2
    p_seen, d_seen, t = [], [], 0.0
    while t <= 60:
        p_obs = PrefillObservation(timestamp=t, ready=p_ready, ttft_p90_s=ttft_at(t))
        d_obs = DecodeObservation(timestamp=t, ready=d_ready, mean_kv_utilization=kv_at(t))
        p_dec, p_state = decide_prefill(params=prefill, observed=p_obs, state=p_state, now=t)
        d_dec, d_state = decide_decode(params=decode, observed=d_obs, state=d_state, now=t)
        p_ready, d_ready = p_dec.desired, d_dec.desired
        p_seen.append(p_ready)
        d_seen.append(d_ready)
        t += STEP_S
    return p_seen, d_seen


def test_prefill_scales_on_ttft_while_decode_stays() -> None:
    prefill, decode = run_both(ttft_at=lambda t: 0.5 if t < 20 else 1.5, kv_at=lambda t: 0.5)
    assert prefill[0] == 2 and max(prefill) >= 4
    assert set(decode) == {2}


def test_decode_scales_on_kv_while_prefill_stays() -> None:
    prefill, decode = run_both(ttft_at=lambda t: 0.5, kv_at=lambda t: 0.5 if t < 20 else 1.0)
    assert decode[0] == 2 and max(decode) >= 4
    assert set(prefill) == {2}


@pytest.mark.parametrize(
    ("values", "middle"), [([3.0, 1.0, 2.0], 2.0), ([4.0, 1.0, 2.0, 3.0], 2.5), ([5.0], 5.0), ([], 0.0)]
)
def test_the_median_is_the_middle_value_or_the_mean_of_the_two(values: list[float], middle: float) -> None:
    assert median(values) == middle
