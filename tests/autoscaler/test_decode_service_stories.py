"""The decode pool's leading demand with a service time that grows with load: fake-clock stories.

Real autoscaler code from the scrape on: each round builds the engines' and the gateway's readings,
then `remember` → `learn_service` → `decode_observation` → `decide_decode`, as the controller does.
Faked: the pool. Its numbers are the simulated 7B engine's on the held-out step (docs/autoscaler.md),
from its time model: a request runs s(c) = 1.58 + 0.068·c wall seconds at c running requests per engine
(0.79 + 0.034·c simulated seconds at time scale 0.5: 120 steps, each reading every sequence's KV, and
one KV load per admitted request), each holds 0.05 of an engine's cache (target 0.5: c* = 10), idle
about 1 request/s, the peak 10/s. Requests arrive at the gateway (its counters), pass their prefill at
the prefill pool's pace, and run in the decode engines while their caches have room (what does not fit
waits unseen); every running request advances by 0.1 s / s(c) of its work every 0.1 s. Engines report
their times on their own clock (`clock` wall seconds per engine second: 2 for the simulator at time
scale 0.5, 1 for vLLM). Replicas are ready 5 s after they are asked for and leave at once.

"Old" is the same run with the leading demand of before: the service time as measured now, in the
engines' seconds (the observation without its curve and clock ratio).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from tandem.autoscaler.decider import (
    DeciderParams,
    DeciderState,
    DecodeObservation,
    decide_decode,
    decode_arrival_demand,
)
from tandem.autoscaler.observe import PoolHistory, Scrape, decode_observation, learn_service, remember
from tandem.autoscaler.readings import EngineReading, GatewayReading

A, B = 1.58, 0.068  # s(c) = A + B·c wall seconds
KV_PER_REQUEST = 0.05
PARAMS = DeciderParams(min=1, max=12, target=0.5, stable_window_s=20, panic_window_s=4, scale_down_delay_s=30)
AT_TARGET = PARAMS.target / KV_PER_REQUEST  # c* = 10
START_S = 5.0
STEPS = 10  # per second
STEP_AT, PEAK = 60.0, 10.0
Rate = Callable[[float], float]


def service(concurrency: float) -> float:
    return A + B * concurrency


def need(rate: float) -> int:
    """Replicas with every engine at its KV target: rate × s(c*) / c*. Example: 10/s → 10 × 2.26 / 10
    = 2.26 → 3."""
    return math.ceil(rate * service(AT_TARGET) / AT_TARGET - 1e-9)


def unlimited(t: float) -> float:
    return math.inf


def step_prefill(t: float) -> float:
    """Requests/s the prefill pool passes on at a step: 4 per engine, one engine until 2.5 s after it,
    two then, three a second later (as measured on the step, docs/autoscaler.md)."""
    return 4.0 * (1 if t < STEP_AT + 2.5 else 2 if t < STEP_AT + 3.5 else 3)


@dataclass
class Engine:
    finished: float = 0.0
    reported: float = 0.0


@dataclass
class Cohort:
    """Requests that began running at `start` (wall seconds): `size` of them, `done` of their work."""

    start: float
    size: float
    done: float = 0.0


@dataclass
class Pool:
    """The pool (module docstring) and the autoscaler's state for one run."""

    clock: float
    old: bool
    prefill: Rate
    engines: list[Engine] = field(default_factory=lambda: [Engine()])
    cohorts: list[Cohort] = field(default_factory=list)
    arrived: float = 0.0
    prefilling: float = 0.0
    unseen: float = 0.0
    asks: list[float] = field(default_factory=list)
    asked: int = 1
    history: PoolHistory = field(default_factory=PoolHistory)
    state: DeciderState = field(default_factory=DeciderState)

    @property
    def running(self) -> float:
        return sum(c.size for c in self.cohorts)

    def serve(self, t: float, rate: float) -> None:
        """The second before `t` (module docstring)."""
        self.arrived += rate
        self.prefilling += rate
        passed = min(self.prefilling, self.prefill(t))
        self.prefilling -= passed
        dt, n = 1.0 / STEPS, len(self.engines)
        for k in range(STEPS):
            now = t - 1.0 + (k + 1) * dt
            pace = dt / service(self.running / n)
            for cohort in self.cohorts:
                cohort.done += pace
            for cohort in [c for c in self.cohorts if c.done >= 1.0]:
                self.cohorts.remove(cohort)
                for engine in self.engines:
                    engine.finished += cohort.size / n
                    engine.reported += cohort.size / n * (now - cohort.start) / self.clock
            waiting = self.unseen + passed * dt
            admitted = min(waiting, max(0.0, n / KV_PER_REQUEST - self.running))
            if admitted > 0:
                self.cohorts.append(Cohort(now, admitted))
            self.unseen = waiting - admitted

    def scrape(self, t: float) -> Scrape:
        per_engine = self.running / len(self.engines)
        readings: dict[str, EngineReading | None] = {
            f"http://e{i}": EngineReading(
                kv_usage=per_engine * KV_PER_REQUEST,
                running=per_engine,
                e2e_sum=e.reported,
                queue_sum=0.0,
                finished=e.finished,
            )
            for i, e in enumerate(self.engines)
        }
        gateway = GatewayReading(arrivals=self.arrived, arrival_tokens=self.arrived * 3000)
        return Scrape(t, readings, {"http://gw": gateway})

    def decide(self, t: float) -> tuple[int, DecodeObservation]:
        keep = PARAMS.panic_window_s + 1.0  # as the controller keeps
        self.history = learn_service(remember(self.history, self.scrape(t), keep_s=keep))
        observed, _ = decode_observation(self.history)
        observed = replace(observed, engine_start_s=START_S)
        if self.old:
            observed = as_before(observed)
        decision, self.state = decide_decode(params=PARAMS, observed=observed, state=self.state, now=t)
        return decision.desired, observed

    def act(self, t: float, desired: int) -> None:
        """As the controller: ask for more at once; fewer only once every replica asked for is ready
        (then the newest leave; their requests run on elsewhere). Then the replicas due join."""
        if desired > self.asked:
            self.asks += [t + START_S] * (desired - self.asked)
            self.asked = desired
        elif desired < self.asked and len(self.engines) == self.asked:
            del self.engines[desired:]
            self.asked = desired
        for due in [a for a in self.asks if a <= t]:
            self.engines.append(Engine())
            self.asks.remove(due)


def as_before(observed: DecodeObservation) -> DecodeObservation:
    ratio = observed.clock_ratio or 1.0
    engine_s = observed.service_s / ratio if observed.service_s is not None else None
    return replace(observed, service_curve=None, service_s=engine_s, clock_ratio=None)


def run(
    rate_at: Rate, *, until: float, clock: float = 1.0, old: bool = False, prefill: Rate = unlimited
) -> list[tuple[float, int, int]]:
    """Every second: serve, scrape and decide, act. Returns (t, ready, desired)."""
    pool, out = Pool(clock=clock, old=old, prefill=prefill), []
    for second in range(int(until) + 1):
        t = float(second)
        pool.serve(t, rate_at(t))
        desired, _ = pool.decide(t)
        pool.act(t, desired)
        out.append((t, len(pool.engines), desired))
    return out


def idle(t: float) -> float:
    """About 1 request/s, varying every 3 s as an idle load does (seeded): the loads the line is
    learned from before the step."""
    return random.Random(int(t) // 3).choice((0.4, 0.8, 1.2, 1.6, 2.0))


def step(t: float) -> float:
    return idle(t) if t < STEP_AT else PEAK


def first(timeline: list[tuple[float, int, int]], *, at_least: int) -> float:
    return next(t for t, _, desired in timeline if t >= STEP_AT and desired >= at_least)


# ------------------------------------------------------------------------------------------------ step


def test_before_the_step_the_line_and_the_clock_are_learned_from_the_idle_load() -> None:
    """60 s of idle load at half the wall's pace: the clock ratio reads 2 and the line, learned at 0.5–2
    running, puts the time at c* = 10 within 10% of the pool's 2.26 s."""
    pool = Pool(clock=2.0, old=False, prefill=unlimited)
    for second in range(int(STEP_AT)):
        pool.serve(float(second), idle(float(second)))
        _, observed = pool.decide(float(second))
    assert observed.clock_ratio == pytest.approx(2.0, rel=0.05)
    assert observed.service_curve is not None
    assert observed.service_curve.at(AT_TARGET) == pytest.approx(service(AT_TARGET), rel=0.1)


def arrival_demand_after_the_step(*, clock: float, old: bool) -> float | None:
    """The decode arrival demand two rounds after the step (the arrival window then spans the peak)."""
    pool = Pool(clock=clock, old=old, prefill=step_prefill)
    for second in range(int(STEP_AT) + 2):
        t = float(second)
        pool.serve(t, step(t))
        desired, observed = pool.decide(t)
        pool.act(t, desired)
    return decode_arrival_demand(observed, params=PARAMS)


@pytest.mark.parametrize(
    ("clock", "idle_share"), [(1.0, 0.77), (2.0, 0.385)], ids=["vllm-clock", "simulator-at-half-speed"]
)
def test_at_a_step_the_old_demand_under_counts_and_the_new_one_does_not(
    clock: float, idle_share: float
) -> None:
    """Two rounds into the step (10/s): 10 × s(10) / 10 = 2.26 replicas. The old demand multiplies by the
    time measured at the load before, s(1.7) = 1.7 s: 0.77 of it, and on the simulator's clock half
    that again; the new one takes the line learned at idle at c* = 10."""
    need_now = PEAK * service(AT_TARGET) / AT_TARGET
    assert arrival_demand_after_the_step(clock=clock, old=False) == pytest.approx(need_now, rel=0.05)
    assert arrival_demand_after_the_step(clock=clock, old=True) == pytest.approx(
        need_now * idle_share, rel=0.1
    )


def test_on_the_simulators_clock_the_step_gets_its_decode_replicas_rounds_earlier() -> None:
    """Idle → 10/s on engines at time scale 0.5: 3 replicas asked for within two rounds of the arrival
    window seeing the step; the old demand (0.87 → 1) leaves the third to the lagging KV signal and
    panic mode, 8 s after the step (on the held-out step the decode pool asked for its third at 68 s,
    after the burst that missed)."""
    new = run(step, until=180, clock=2.0, prefill=step_prefill)
    old = run(step, until=180, clock=2.0, old=True, prefill=step_prefill)
    new_at, old_at = first(new, at_least=need(PEAK)), first(old, at_least=need(PEAK))
    assert new_at <= STEP_AT + 2
    assert old_at >= new_at + 5, (new_at, old_at)
    assert max(desired for _, _, desired in new) <= need(PEAK) + 1  # at most the forecast's one more
    assert {ready for t, ready, _ in new if t > 150} == {need(PEAK)}


def test_on_vllms_clock_the_forecast_had_covered_the_gap_and_the_new_demand_is_not_later() -> None:
    """The same step with engines on the wall's clock: the old demand's 1.74 plus its forecast (0.87)
    also asked for 3 in the second round; the new demand asks no later, and no more than one over."""
    new = run(step, until=180, prefill=step_prefill)
    old = run(step, until=180, old=True, prefill=step_prefill)
    assert first(new, at_least=need(PEAK)) <= first(old, at_least=need(PEAK)) <= STEP_AT + 2
    assert max(desired for _, _, desired in new) <= need(PEAK) + 1
    assert {ready for t, ready, _ in new if t > 150} == {need(PEAK)}


# ------------------------------------------------------------------------------------------------ ramp


def ramp(t: float) -> float:
    return idle(t) if t < STEP_AT else min(PEAK, 1.0 + (PEAK - 1.0) * (t - STEP_AT) / 30.0)


@pytest.mark.parametrize("clock", [1.0, 2.0], ids=["vllm-clock", "simulator-at-half-speed"])
def test_a_ramp_is_followed_ahead_and_never_behind_the_old_demand(clock: float) -> None:
    """1 → 10/s over 30 s: from the ramp's second third on, the replicas asked for at t cover what the
    arrivals at t + start need (the forecast's start time ahead, less one for the two rounds the arrival
    window and the median lag), never fewer than the old demand's and never more than one over the
    peak's need."""
    new, old = run(ramp, until=120, clock=clock), run(ramp, until=120, clock=clock, old=True)
    ahead = False
    for (t, _, desired), (_, _, before) in zip(new, old, strict=True):
        if STEP_AT + 10 <= t <= STEP_AT + 30:
            assert desired >= need(ramp(t + START_S)) - 1, (t, desired)
            assert desired >= before, (t, desired, before)
            ahead = ahead or desired > before
    assert ahead, "somewhere on the ramp the learned service time asks before the old demand does"
    assert max(desired for _, _, desired in new) <= need(PEAK) + 1


# ------------------------------------------------------------------------------------------- flat, noise


@pytest.mark.parametrize("rate", [1.0, 4.0, 10.0, 14.0])
@pytest.mark.parametrize("clock", [1.0, 2.0], ids=["vllm-clock", "simulator-at-half-speed"])
def test_a_flat_load_does_not_over_ask(rate: float, clock: float) -> None:
    """At a flat load (from a cold start at full load, which overshoots in panic mode first) the demand at
    c* is the replicas the load needs at its target: once settled, within one of the old demand's count
    and at most one over the need. (The old one, at 14/s, went down to 3 and back to 4: its
    KV demand counts today's load at today's replicas.)"""
    new = run(lambda t: rate, until=200, clock=clock)
    old = run(lambda t: rate, until=200, clock=clock, old=True)
    settled = [(d, b) for (t, _, d), (_, _, b) in zip(new, old, strict=True) if t >= 120]
    assert all(abs(d - b) <= 1 for d, b in settled), settled
    assert {d for d, _ in settled} <= {need(rate), need(rate) + 1}, (need(rate), settled)


def test_noise_around_a_flat_load_does_not_flap() -> None:
    """10/s with ±40% noise every second (seeded; a 2 s window's error is then about a Poisson one's),
    on the simulator's clock: after the first minute the pool holds one size, between what the mean
    load and the noise's top need (3 and 4). The old demand, half-counted there, left the pool to the
    KV signal, which read 2.0 at 3 replicas and took one away for a few seconds."""
    noise = random.Random(7)
    rates = [PEAK * (1 + noise.uniform(-0.4, 0.4)) for _ in range(301)]
    new = run(lambda t: rates[int(t)], until=300, clock=2.0)
    late = [ready for t, ready, _ in new if t >= 60]
    assert sum(1 for a, b in itertools.pairwise(late) if a != b) <= 1, late
    assert set(late) <= {need(PEAK), need(PEAK * 1.4)}
