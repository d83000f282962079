"""Goodput under SLOs, the service gap between any two backlogged tenants, run-to-run spread, the
overhead sweep's arithmetic, and the timeline's integrals (all pure).

Real: `tandem.bench.stats`, `fairness`, `aggregate`, `overhead` and `timeline` functions. Faked:
requests are `Timed` values and driver records written by hand (seconds); no server or clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.bench.aggregate import aggregate, spread, spread_table
from tandem.bench.fairness import ServiceWeights, max_pair_gap, tenant_report, waiting_intervals
from tandem.bench.overhead import added_over_direct, level_row, parse_levels, summarize_sweep, sweep_markdown
from tandem.bench.plots import in_flight
from tandem.bench.records import DriveResult, RequestRecord
from tandem.bench.stats import Slo, Timed, meets, slo_report
from tandem.bench.timeline import integral, rolling_ttft


def req(
    *, ttft: float | None = 0.1, tpot: float | None = 0.01, tokens: int = 11, ok: bool = True,
    tenant: str = "a", arrival: float = 0.0, prompt: int = 10,
) -> Timed:  # fmt: skip
    """A request sent at its arrival; `tokens` evenly spaced chunks from arrival + ttft, `tpot` apart."""
    if ttft is None:
        return Timed(tenant, ok, arrival, arrival, (), arrival + 1, prompt, 0)
    step = tpot or 0.0
    times = tuple(arrival + ttft + i * step for i in range(tokens))
    return Timed(tenant, ok, arrival, arrival, times, times[-1], prompt, tokens)


SLO = Slo(ttft_s=0.2, tpot_s=0.02)


@pytest.mark.parametrize(("request_", "met"), [
    (req(ttft=0.1, tpot=0.01), True),
    (req(ttft=0.2, tpot=0.02), True),  # on the objective counts as met
    (req(ttft=0.21, tpot=0.01), False),
    (req(ttft=0.1, tpot=0.03), False),
    (req(ttft=0.1, tpot=None, tokens=1), True),  # one token: no TPOT, only TTFT is checked
    (req(ttft=0.1, ok=False), False),
    (req(ttft=None), False),
])  # fmt: skip
def test_a_request_meets_the_slo_when_it_succeeded_within_both_objectives(request_: Timed, met: bool) -> None:
    assert meets(request_, SLO) is met


def test_goodput_counts_requests_within_both_objectives_per_second_of_the_run() -> None:
    fast = [req(arrival=float(i), ttft=0.1, tpot=0.01) for i in range(8)]
    slow = [req(arrival=8.0, ttft=0.5), req(arrival=8.5, ttft=0.1, tpot=0.05, tokens=9)]
    report = slo_report(fast + slow, SLO)
    end = max(r.end for r in fast + slow if r.end is not None)  # 8.5 + 0.1 + 8 × 0.05 = 9.0
    assert end == pytest.approx(9.0)
    assert report == {
        "ttft_slo_s": 0.2, "tpot_slo_s": 0.02, "met": 8, "attainment": 0.8,
        "goodput_rps": pytest.approx(8 / 9.0),
    }  # fmt: skip
    assert slo_report([], SLO)["attainment"] is None


def test_the_largest_gap_between_two_backlogged_tenants_is_found_among_all_pairs() -> None:
    # a and b wait together over [0, 1) (first tokens at 1.0); c waits alone later, over [5, 6).
    requests = [
        req(
            tenant="a", arrival=0.0, ttft=0.5, tokens=1, prompt=100
        ),  # first token at 0.5: 100 units in [0, 1)
        req(tenant="a", arrival=0.0, ttft=1.0, tokens=1, prompt=100),
        req(tenant="b", arrival=0.0, ttft=1.0, tokens=1, prompt=10),
        req(tenant="c", arrival=5.0, ttft=1.0, tokens=1, prompt=1000),
    ]
    weights = ServiceWeights(input=1, output=0)
    waiting = waiting_intervals(requests, run_end=10.0)
    assert waiting == {"a": [(0.0, 1.0)], "b": [(0.0, 1.0)], "c": [(5.0, 6.0)]}
    assert max_pair_gap(requests, waiting, weights) == (100.0, ("a", "b"))
    report = tenant_report(requests, weights)
    assert report["max_pair_gap"] == 100.0 and report["max_pair_gap_tenants"] == ["a", "b"]
    assert report["backlogged_s"] == 0.0, "the three tenants never all wait at once"
    assert max_pair_gap(requests[3:], waiting_intervals(requests[3:], run_end=10.0), weights) == (None, None)


@pytest.mark.parametrize(("values", "expected"), [
    ([30.0, 34.0, 38.0], {"n": 3, "mean": 34.0, "sd": 4.0, "median": 34.0, "min": 30.0, "max": 38.0}),
    ([1.0, 1.0, 3.0, 3.0], {"n": 4, "mean": 2.0, "sd": (4 / 3) ** 0.5, "median": 2.0, "min": 1.0,
                            "max": 3.0}),
    ([5.0], {"n": 1, "mean": 5.0, "sd": 0.0, "median": 5.0, "min": 5.0, "max": 5.0}),
    ([], {"n": 0, "mean": None, "sd": None, "median": None, "min": None, "max": None}),
])  # fmt: skip
def test_spread_is_the_mean_the_sample_standard_deviation_and_the_median(
    values: list[float], expected: dict[str, Any]
) -> None:
    assert spread(values) == pytest.approx(expected)


def summary(label: str, ttft_p50: float | None, repeat: int) -> dict[str, Any]:
    return {
        "label": label,
        "repeat": repeat,
        "requests": {"ok": 10},
        "latency": {"ttft_s": {"p50": ttft_p50}},
    }


def test_runs_of_one_target_are_aggregated_and_shown_as_mean_plus_minus_sd() -> None:
    runs = [
        summary("rr", 0.030, 0),
        summary("rr", 0.034, 1),
        summary("rr", 0.038, 2),
        summary("direct", None, 0),
    ]
    agg = aggregate(runs)
    assert agg["rr"]["ttft_p50"] == pytest.approx(
        {"n": 3, "mean": 34.0, "sd": 4.0, "median": 34.0, "min": 30.0, "max": 38.0}
    )
    assert agg["direct"]["ttft_p50"]["n"] == 0
    table = spread_table(agg)
    assert "| TTFT p50 (ms) | 34 ± 4 | – |" in table
    assert "| requests ok | 10 ± 0 | 10 |" in table
    assert "TPOT" not in table, "rows undefined for every target are left out"


def record(index: int, *, start: float, first: float, end: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        index, "default", None, 2, arrival_s=0.0, start_s=start, token_times_s=[first, end], end_s=end,
        completion_tokens=2, status=200 if ok else 500, error=None if ok else "HTTP 500",
    )  # fmt: skip


def test_a_level_row_has_wall_latencies_in_ms_and_throughput_from_first_send_to_last_end() -> None:
    records = (
        record(0, start=0.0, first=0.002, end=0.010),
        record(1, start=0.0, first=0.004, end=0.020),
        record(2, start=0.01, first=0.5, end=0.6, ok=False),
    )
    result = DriveResult(records, wall_s=0.6)
    row = level_row("rr", 4, 0, result)
    assert row["ok"] == 2 and row["errors"] == 1
    assert row["ttft_p50_ms"] == pytest.approx(3.0) and row["e2e_p99_ms"] == pytest.approx(19.9)
    assert row["requests_per_s"] == pytest.approx(2 / 0.020)
    assert row["gateway_cpu_s"] is None and row["gateway_cpu_s_per_1000"] is None, "no gateway"


@pytest.mark.parametrize(
    ("readings", "cpu_s", "per_1000"),
    [((10.0, 10.3), 0.3, 100.0), ((10.0, 10.0), 0.0, 0.0), ((None, 10.3), None, None), (None, None, None)],
)
def test_a_level_row_has_the_gateways_cpu_per_1000_requests_sent(
    readings: tuple[float | None, float | None] | None, cpu_s: float | None, per_1000: float | None
) -> None:
    records = (record(0, start=0.0, first=0.002, end=0.010), record(1, start=0.0, first=0.004, end=0.020),
               record(2, start=0.01, first=0.5, end=0.6, ok=False))  # fmt: skip
    row = level_row("rr", 4, 0, DriveResult(records, wall_s=0.6), gateway_cpu_s=readings)
    assert row["gateway_cpu_s"] == (None if cpu_s is None else pytest.approx(cpu_s))
    assert row["gateway_cpu_s_per_1000"] == (None if per_1000 is None else pytest.approx(per_1000)), (
        "3 requests sent (one failed): 0.3 s / 3 × 1000 = 100"
    )


def level(
    label: str, c: int, r: int, p50: float, p99: float, rps: float, errors: int = 0, cpu: float | None = None
) -> dict[str, Any]:
    return {"label": label, "concurrency": c, "repeat": r, "requests": 10, "ok": 10 - errors,
            "errors": errors, "ttft_p50_ms": p50, "ttft_p99_ms": p99, "e2e_p50_ms": p50 * 2,
            "e2e_p99_ms": p99 * 2, "requests_per_s": rps, "gateway_cpu_s_per_1000": cpu}  # fmt: skip


def test_added_latency_is_the_routers_percentile_minus_directs_at_the_same_level_and_repeat() -> None:
    rows = [
        level("direct", 1, 0, 2.0, 4.0, 100), level("rr", 1, 0, 3.5, 7.0, 80, cpu=1.5),
        level("direct", 1, 1, 2.2, 4.4, 100), level("rr", 1, 1, 3.9, 6.4, 70, cpu=2.5),
        level("direct", 4, 0, 3.0, 6.0, 200), level("rr", 4, 0, 5.0, 9.0, 150, errors=1, cpu=1.25),
    ]  # fmt: skip
    added = added_over_direct(rows)
    got = [(a["concurrency"], a["repeat"], a["added_ttft_p50_ms"], a["added_ttft_p99_ms"]) for a in added]
    assert got == [(1, 0, 1.5, 3.0), (1, 1, pytest.approx(1.7), pytest.approx(2.0)), (4, 0, 2.0, 3.0)]
    summary_ = summarize_sweep(rows)
    assert summary_["levels"]["rr"][1]["added_ttft_p50_ms"]["mean"] == pytest.approx(1.6)
    assert summary_["sustained"]["rr"]["concurrency"] == 1, "the level with an error does not count"
    assert summary_["sustained"]["rr"]["mean"] == pytest.approx(75)
    assert summary_["sustained"]["direct"]["concurrency"] == 4
    text = sweep_markdown(summary_)
    assert "| 1 | 2.1 ± 0.1 / 4.2 ± 0.3 | 1.6 ± 0.1 / 2.5 ± 0.7 |" in text
    assert summary_["levels"]["rr"][1]["gateway_cpu_s_per_1000"]["mean"] == pytest.approx(2.0)
    assert summary_["levels"]["direct"][1]["gateway_cpu_s_per_1000"]["n"] == 0, "direct has no gateway"
    assert "| concurrency | rr (req/s) | rr: gateway CPU s per 1,000 req | direct (req/s) |" in text
    assert "| 1 | 75.0 ± 7.1 | 2.00 ± 0.71 | 100.0 ± 0.0 |" in text
    assert "| 4 | 150.0 (1 errors) | 1.25 | 200.0 |" in text
    assert "| sustained | **75.0 ± 7.1** (C = 1) | 2.00 ± 0.71 | **200.0** (C = 4) |" in text


@pytest.mark.parametrize(("text", "levels"), [("1,4,16", (1, 4, 16)), ("16, 1,1", (1, 16))])
def test_sweep_levels_are_parsed_sorted_and_deduplicated(text: str, levels: tuple[int, ...]) -> None:
    assert parse_levels(text) == levels


@pytest.mark.parametrize("text", ["", "0", "1,x", "-4"])
def test_bad_sweep_levels_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--overhead-sweep"):
        parse_levels(text)


@pytest.mark.parametrize(("points", "area"), [
    ([[0, 1], [10, 3], [20, 3]], 40.0),  # 1 × 10 + 3 × 10
    ([[10, 3], [0, 1], [20, 3]], 40.0),  # order does not matter
    ([[0, 2]], 0.0),  # a single sample spans no time
    ([], 0.0),
])  # fmt: skip
def test_replica_seconds_integrate_each_sample_until_the_next(points: list[list[float]], area: float) -> None:
    assert integral(points) == pytest.approx(area)


def test_rolling_ttft_takes_the_requests_whose_first_token_fell_in_the_window() -> None:
    requests = [req(arrival=0.0, ttft=0.5), req(arrival=1.0, ttft=1.5), req(arrival=4.0, ttft=0.2)]
    rolling = rolling_ttft(requests, end_s=5.0, window_s=2.0, step_s=1.0, time_scale=1.0)
    assert rolling["t"] == [0, 1, 2, 3, 4, 5]
    # first tokens at 0.5, 2.5 and 4.2 s; windows (t − 2, t]
    assert rolling["count"] == [0, 1, 1, 1, 1, 1]
    assert rolling["p50_s"] == [None, 0.5, 0.5, 1.5, 1.5, pytest.approx(0.2)]


def test_requests_in_flight_step_up_at_starts_and_down_at_ends() -> None:
    assert in_flight([0, 1], [2, 3]) == ([0, 1, 2, 3], [1, 2, 1, 0])
