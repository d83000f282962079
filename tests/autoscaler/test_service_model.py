"""The decode pool's learned service time, s(c) = a + b·c, and the engines' clock, as worked examples.

All real autoscaler code, pure (`tandem.autoscaler.service`); points, bins and clock samples are
written here by hand, time is plain floats.
"""

from __future__ import annotations

import pytest

from tandem.autoscaler.service import (
    BIN_WEIGHT_CAP,
    MIN_CLOCK_FINISHED,
    SERVICE_MEMORY_S,
    ClockSample,
    ServiceBin,
    ServiceCurve,
    ServiceMemory,
    ServicePoint,
    bin_index,
    clock_ratio,
    fit_service,
    learn_clock,
    learn_point,
    remember_service,
)


def bins(*points: tuple[float, float], weight: float = 50.0) -> tuple[ServiceBin, ...]:
    return tuple(ServiceBin(bin_index(c), c, s, weight, 0.0) for c, s in points)


# ------------------------------------------------------------------------------------------- the curve


def test_the_module_docstrings_example() -> None:
    """s(c) = 0.6 + 0.1·c, c* = 12, 15 requests/s → 15 × 1.8 / 12 = 2.25 replicas; the idle time
    (c = 1: 0.7 s) said 0.875."""
    curve = fit_service(bins((1, 0.7), (2, 0.8), (4, 1.0)))
    assert curve is not None
    assert (curve.intercept_s, curve.slope_s, curve.floor_s) == pytest.approx((0.6, 0.1, 0.7))
    assert 15 * curve.at(12) / 12 == pytest.approx(2.25)
    assert 15 * curve.at(1) / 12 == pytest.approx(0.875)


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # An odd bin among four: Theil–Sen's slope is the median of the six pairwise ones.
        (((1, 0.7), (2, 0.8), (4, 1.0), (6, 0.5)), ServiceCurve(0.705, 0.03, 0.7)),
        # A steep noisy pair would cross 0: the line through 0, median of s / c.
        (((1, 0.5), (2, 1.5)), ServiceCurve(0.0, 0.625, 0.5)),
        # Service time falling with load is noise: slope 0, intercept the median time.
        (((1, 0.9), (3, 0.8), (6, 0.85)), ServiceCurve(0.85, 0.0, 0.9)),
        # Flat: as measured.
        (((1, 0.8), (3, 0.8)), ServiceCurve(0.8, 0.0, 0.8)),
    ],
    ids=["odd-bin", "through-zero", "falling", "flat"],
)
def test_the_fit_is_robust_and_never_falls_with_load(
    points: tuple[tuple[float, float], ...], expected: ServiceCurve
) -> None:
    curve = fit_service(bins(*points))
    assert curve is not None
    assert (curve.intercept_s, curve.slope_s, curve.floor_s) == pytest.approx(
        (expected.intercept_s, expected.slope_s, expected.floor_s)
    )


@pytest.mark.parametrize(
    "learned",
    [
        (),
        bins((1.5, 0.8)),  # one load seen: no slope to tell
        bins((1.5, 0.8), (1.9, 0.9)),  # two bins, 0.4 running apart: too close
        bins((1, 0.7), (4, 1.0), weight=5.0),  # too few requests behind them
    ],
    ids=["nothing", "one-bin", "too-close", "too-thin"],
)
def test_without_two_loads_apart_there_is_no_line(learned: tuple[ServiceBin, ...]) -> None:
    assert fit_service(learned) is None


def test_the_curve_has_the_idle_time_as_its_floor_and_changes_clock_as_a_whole() -> None:
    curve = ServiceCurve(intercept_s=0.6, slope_s=0.1, floor_s=0.7)
    assert curve.at(0) == pytest.approx(0.7) and curve.at(12) == pytest.approx(1.8)
    assert curve.scaled(2.0) == ServiceCurve(1.2, 0.2, 1.4)


# -------------------------------------------------------------------------------------------- the bins


@pytest.mark.parametrize(
    ("concurrency", "index"),
    [(0, 0), (1, 3), (2, 4), (3, 6), (10, 10), (100, 20), (105, 20), (110, 21), (-1, 0)],
)
def test_bins_grow_geometrically(concurrency: float, index: int) -> None:
    assert bin_index(concurrency) == index


def test_a_point_joins_its_bins_weighted_mean_with_the_weight_capped() -> None:
    """The docstring's example: (1.6, 1.0 s, weight 200) + (1.8, 1.2 s, 20) → 1.018 s at 1.618."""
    old = (ServiceBin(bin_index(1.6), 1.6, 1.0, BIN_WEIGHT_CAP, 0.0),)
    (merged,) = learn_point(old, ServicePoint(1.8, 1.2, 20), now=1.0)
    assert (merged.concurrency, merged.service_s, merged.weight, merged.t) == pytest.approx(
        (356 / 220, 224 / 220, 220, 1.0)
    )
    (again,) = learn_point((merged,), ServicePoint(1.6, 1.0, 20), now=2.0)
    assert again.weight == 220  # the prior counts at most the cap: new points keep moving the mean


def test_points_start_new_bins_and_old_bins_are_forgotten() -> None:
    learned = learn_point((), ServicePoint(1.0, 0.7, 6), now=0.0)
    learned = learn_point(learned, ServicePoint(10.0, 1.5, 30), now=1.0)
    assert [b.index for b in learned] == [3, 10]
    later = learn_point(learned, ServicePoint(10.0, 1.5, 30), now=SERVICE_MEMORY_S + 0.5)
    assert [b.index for b in later] == [10]  # the idle bin is older than the memory


@pytest.mark.parametrize(
    "point",
    [ServicePoint(1.0, 0.7, 0), ServicePoint(float("nan"), 0.7, 3), ServicePoint(1.0, float("inf"), 3)],
    ids=["nothing-finished", "nan", "inf"],
)
def test_a_point_without_finished_requests_or_finite_values_teaches_nothing(point: ServicePoint) -> None:
    assert learn_point((), point, now=0.0) == ()


# ------------------------------------------------------------------------------------------- the clock


def test_the_clock_ratio_is_littles_law_on_the_engines() -> None:
    """The docstring's example: 96 request-seconds running, 60 finished reporting 50 s → 1.92."""
    samples = tuple(ClockSample(float(t), 1.6, 50 / 60, 1.0) for t in range(60))
    assert clock_ratio(samples) == pytest.approx(96 / 50)


def test_the_clock_ratio_counts_the_requests_still_running_at_the_edges() -> None:
    """The docstring's step: nothing to 10/s of 1 s requests; over 3 s, 25 request-seconds, 20 finished
    reporting 20 s, running 0 → 10: 1.0, where R / S says 1.25."""
    samples = (
        ClockSample(1.0, 5.0, 0.0, 0.0, running_start=0.0, running_end=10.0),
        ClockSample(2.0, 10.0, 10.0, 10.0, running_start=10.0, running_end=10.0),
        ClockSample(3.0, 10.0, 10.0, 10.0, running_start=10.0, running_end=10.0),
    )
    assert clock_ratio(samples) == pytest.approx(1.0)


def test_no_clock_ratio_before_enough_requests_finished() -> None:
    few = tuple(ClockSample(float(t), 2.0, 1.0, 1.0) for t in range(int(MIN_CLOCK_FINISHED) - 1))
    assert clock_ratio(few) is None
    assert clock_ratio((ClockSample(0.0, 2.0, 0.0, 30.0),)) is None  # nothing reported
    assert clock_ratio((*few, ClockSample(99.0, 2.0, 1.0, 1.0))) == pytest.approx(2.0)


def test_clock_samples_are_kept_for_their_memory() -> None:
    samples: tuple[ClockSample, ...] = ()
    for t in range(0, 200, 10):
        samples = learn_clock(samples, ClockSample(float(t), 1.0, 1.0, 1.0), memory_s=120.0)
    assert [s.t for s in samples] == [float(t) for t in range(80, 200, 10)]


def test_a_round_adds_its_points_and_its_clock_sample() -> None:
    memory = remember_service(
        ServiceMemory(),
        points=(ServicePoint(1.0, 0.7, 5), ServicePoint(4.0, 1.0, 12)),
        clock=ClockSample(3.0, 2.5, 1.2, 2.0),
        now=3.0,
    )
    assert [b.index for b in memory.bins] == [3, 7] and len(memory.clock) == 1
    quiet = remember_service(memory, points=(), clock=None, now=SERVICE_MEMORY_S + 4.0)
    assert quiet.bins == () and quiet.clock == memory.clock
