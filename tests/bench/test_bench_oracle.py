"""The autoscaling oracle (`tandem.bench.oracle`): replicas per second from arrivals and a pool's
capacity, its replica-seconds with engine starts, and the comparison the report prints. Pure."""

from __future__ import annotations

import pytest

from tandem.bench.oracle import PoolCapacity, compare, markdown, oracle, parse_capacity


def steady(rate: float, *, start: float, end: float) -> list[float]:
    """Arrivals evenly spaced at `rate` per second over [start, end)."""
    count = round((end - start) * rate)
    return [start + i / rate for i in range(count)]


def test_the_docstrings_worked_example() -> None:
    arrivals = steady(1, start=0, end=10) + steady(5, start=10, end=20)
    run = oracle(arrivals, PoolCapacity("prefill", rps=2, start_s=5), duration_s=20, window_s=1)
    assert run.needed == (1,) * 10 + (3,) * 10
    assert (run.ready_replica_s, run.starting_replica_s, run.replica_s, run.peak) == (40, 10, 50, 3)


def test_a_replica_is_ready_before_the_requests_it_serves_arrive() -> None:
    arrivals = steady(6, start=10, end=20)  # a step from idle to 6 req/s at t=10
    run = oracle(arrivals, PoolCapacity("decode", rps=2, min_replicas=1), duration_s=25, window_s=5)
    # The window ahead sees the step coming: 2 replicas from t=7 (12 arrivals in [7, 12)), 3 from t=9.
    assert run.needed[:7] == (1,) * 7 and run.needed[7:9] == (2, 2)
    # The window behind keeps them until the burst's requests are served, then back to the floor.
    assert run.needed[9:21] == (3,) * 12 and run.needed[21:] == (2, 2, 1, 1)


def test_the_floor_holds_at_idle_and_zero_is_allowed() -> None:
    assert oracle([], PoolCapacity("decode", rps=1, min_replicas=2), duration_s=3).needed == (2, 2, 2)
    run = oracle([], PoolCapacity("decode", rps=1, start_s=30, min_replicas=0), duration_s=3)
    assert run.needed == (0, 0, 0) and run.replica_s == 0


def test_the_run_is_set_against_the_oracle_and_fixed_for_peak() -> None:
    run = oracle(steady(4, start=0, end=10), PoolCapacity("prefill", rps=2), duration_s=10, window_s=1)
    rows = compare({"demo/prefill": 30.0, "demo/decode": 10.0}, [run], duration_s=10)
    assert rows == [
        {
            "pool": "prefill",
            "replica_s": 30.0,
            "oracle_replica_s": 20.0,
            "oracle_ready_replica_s": 20.0,
            "oracle_peak": 2,
            "fixed_for_peak_replica_s": 20.0,
            "vs_oracle": 1.5,
            "vs_fixed": 1.5,
        }
    ]
    assert "| prefill | 30 | 20 (20 + 0) | 2 | 20 | 1.50× | 1.50× |" in markdown(rows)
    missing = compare({}, [run], duration_s=10)[0]
    assert missing["replica_s"] is None and missing["vs_oracle"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("prefill=2.5", PoolCapacity("prefill", rps=2.5)),
        ("decode=4:6", PoolCapacity("decode", rps=4, start_s=6)),
        ("decode=4:6:0", PoolCapacity("decode", rps=4, start_s=6, min_replicas=0)),
    ],
)
def test_the_flag_reads_pool_rate_start_and_floor(text: str, expected: PoolCapacity) -> None:
    assert parse_capacity(text) == expected


@pytest.mark.parametrize("text", ["prefill", "=2", "prefill=x", "prefill=2:a", "prefill=0", "p=1:2:3:4"])
def test_a_bad_flag_is_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(ValueError):
        parse_capacity(text)
