"""Report maths: percentiles, per-request latencies, throughput, backlog intervals, VTC service and
shares, and the markdown table.

Real: the pure functions of `tandem.bench.stats`, `tandem.bench.fairness` and `tandem.bench.report`.
Faked: request records are written by hand (times in seconds), no server or clock is involved.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.bench.counters import EngineCounters
from tandem.bench.fairness import (
    ServiceWeights,
    contains,
    intersect,
    merge,
    service,
    tenant_report,
    waiting_intervals,
)
from tandem.bench.records import DriveResult, RequestRecord
from tandem.bench.report import RunData, markdown, markdown_table, summarize
from tandem.bench.stats import Timed, distribution, latency_summary, percentile, throughput, timed


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 90, 3.7),
        ([4, 1, 3, 2], 0, 1),
        ([4, 1, 3, 2], 100, 4),
        ([5], 99, 5),
        (list(range(1, 101)), 99, 99.01),
        ([], 50, None),
    ],
)
def test_percentiles_interpolate_between_closest_ranks(
    values: list[float], q: float, expected: float | None
) -> None:
    result = percentile(values, q)
    assert result == (None if expected is None else pytest.approx(expected))


def test_a_percentile_outside_0_to_100_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 101)


def test_a_distribution_of_nothing_has_no_values() -> None:
    assert distribution([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}


def record(
    *,
    tenant: str = "a",
    arrival: float = 0.0,
    start: float | None = 0.0,
    tokens: list[float] | None = None,
    end: float | None = None,
    prompt: int | None = 100,
    completion: int | None = None,
    status: int | None = 200,
    error: str | None = None,
    index: int = 0,
) -> RequestRecord:
    times = tokens or []
    return RequestRecord(
        index=index, tenant=tenant, group=None, max_tokens=len(times), arrival_s=arrival, start_s=start,
        token_times_s=list(times), end_s=end if end is not None else (times[-1] if times else start),
        prompt_tokens=prompt, completion_tokens=completion if completion is not None else len(times),
        status=status, error=error,
    )  # fmt: skip


def test_ttft_tpot_itl_e2e_and_queue_of_one_request() -> None:
    # Arrived at 0.1, sent at 0.2, first token at 0.4, 101 tokens until 1.4, stream ended at 1.5.
    times = [0.4 + i * 0.01 for i in range(101)]
    (r,) = timed([record(arrival=0.1, start=0.2, tokens=times, end=1.5)], time_scale=1.0)
    assert r.ttft == pytest.approx(0.2)
    assert r.tpot == pytest.approx(0.01)
    assert r.e2e == pytest.approx(1.3)
    assert r.queue == pytest.approx(0.1)
    assert r.itls() == pytest.approx([0.01] * 100)


def test_the_time_scale_turns_wall_seconds_into_engine_seconds() -> None:
    (r,) = timed([record(arrival=0.0, start=0.01, tokens=[0.02, 0.03], end=0.04)], time_scale=100.0)
    assert (r.ttft, r.tpot, r.e2e) == pytest.approx((1.0, 1.0, 3.0))


def test_tpot_needs_two_tokens_and_uses_usage_counts_over_chunks() -> None:
    one, chunky = timed(
        [record(tokens=[0.5]), record(tokens=[0.5, 1.5], completion=11)],  # 2 chunks carrying 11 tokens
        time_scale=1.0,
    )
    assert one.tpot is None
    assert chunky.tpot == pytest.approx(0.1)


def test_failed_requests_are_left_out_of_latencies_and_throughput() -> None:
    requests = timed(
        [
            record(start=0.0, tokens=[1.0, 2.0], end=2.0, completion=2),
            record(start=0.0, tokens=[], end=4.0, status=500, error="HTTP 500: boom", prompt=None),
        ],
        time_scale=1.0,
    )
    summary = latency_summary(requests)
    assert summary["ttft_s"]["count"] == 1 and summary["ttft_s"]["p50"] == 1.0
    rates = throughput(requests)
    assert rates["duration_s"] == 4.0, "the run lasts until the last request ended, failed or not"
    assert rates["requests_per_s"] == 0.25
    assert rates["output_tokens_per_s"] == 0.5


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([(3, 4), (0, 2), (1, 2.5)], [(0, 2.5), (3, 4)]),
        ([(0, 1), (1, 2)], [(0, 2)]),
        ([(1, 1), (2, 3)], [(2, 3)]),
        ([], []),
    ],
)
def test_merging_intervals(intervals: list[tuple[float, float]], expected: list[tuple[float, float]]) -> None:
    assert merge(intervals) == expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([(0, 5)], [(1, 2), (4, 9)], [(1, 2), (4, 5)]),
        ([(0, 1)], [(1, 2)], []),
        ([(0, 2), (3, 6)], [(1, 4), (5, 7)], [(1, 2), (3, 4), (5, 6)]),
    ],
)
def test_intersecting_intervals(
    a: list[tuple[float, float]], b: list[tuple[float, float]], expected: list[tuple[float, float]]
) -> None:
    assert intersect(a, b) == expected


@pytest.mark.parametrize(
    ("t", "inside"), [(0.0, True), (0.99, True), (1.0, False), (2.5, True), (9.0, False)]
)
def test_intervals_are_half_open(t: float, inside: bool) -> None:
    assert contains([(0.0, 1.0), (2.0, 3.0)], t) is inside


def test_a_tenant_waits_from_arrival_to_its_first_token_or_end() -> None:
    requests = timed(
        [
            record(tenant="a", arrival=0.0, start=0.5, tokens=[1.0, 2.0]),
            record(tenant="a", arrival=0.8, start=0.8, tokens=[3.0]),
            record(tenant="b", arrival=1.0, start=1.0, tokens=[], end=5.0, status=500, error="x"),
        ],
        time_scale=1.0,
    )
    assert waiting_intervals(requests, run_end=6.0) == {"a": [(0.0, 3.0)], "b": [(1.0, 5.0)]}


def test_service_counts_the_prompt_at_the_first_token_and_output_chunk_by_chunk() -> None:
    (r,) = timed([record(prompt=100, tokens=[1.0, 2.0, 3.0, 4.0], completion=8)], time_scale=1.0)
    weights = ServiceWeights(input=1, output=2)
    assert service(r, weights) == 100 + 2 * 8
    assert service(r, weights, within=[(0.5, 2.5)]) == 100 + 2 * 4, (
        "the prompt and 2 of 4 chunks (2 tokens each)"
    )
    assert service(r, weights, within=[(1.5, 3.5)]) == 2 * 4, "the prompt was served before the interval"


def heavy_and_light() -> list[Timed]:
    """Between t=0 and t=10 both tenants wait; heavy gets 3 chunks of output there, light 1."""
    return timed(
        [
            record(tenant="heavy", index=0, arrival=0, prompt=10, tokens=[2, 4, 6], completion=3),
            record(tenant="heavy", index=1, arrival=1, prompt=10, tokens=[12, 13], completion=2),
            record(tenant="light", index=2, arrival=0, prompt=10, tokens=[8, 15], completion=2),
            record(tenant="light", index=3, arrival=9, prompt=10, tokens=[10.5], completion=1),
        ],
        time_scale=1.0,
    )


def test_shares_are_measured_while_every_tenant_waits() -> None:
    report = tenant_report(heavy_and_light(), ServiceWeights(input=1, output=2))
    # heavy waits over [0, 12), light over [0, 8) and [9, 10.5): both over [0, 8) + [9, 10.5) = 9.5 s.
    assert report["backlogged_s"] == pytest.approx(9.5)
    heavy, light = report["tenants"]["heavy"], report["tenants"]["light"]
    # In that set: heavy's prompt (at 2) and chunks at 2, 4, 6 → 10 + 3×2 = 16; light's chunk at 8 is
    # outside (8 is not < 8), its second request's first token at 10.5 is outside too → 0.
    assert heavy["service_backlogged"] == 16 and light["service_backlogged"] == 0
    assert heavy["share_backlogged"] == 1.0 and light["share_backlogged"] == 0.0
    assert report["fair_share"] == 0.5
    assert report["service_gap_backlogged"] == 16
    assert heavy["service"] == (10 + 6) + (10 + 4)
    assert light["service"] == (10 + 4) + (10 + 2)


def test_one_tenant_has_no_shares() -> None:
    report = tenant_report(timed([record(tokens=[1.0])], time_scale=1.0), ServiceWeights())
    assert report["backlogged_s"] is None and report["service_gap_backlogged"] is None
    assert report["tenants"]["a"]["share_backlogged"] is None
    assert report["fair_share"] == 1.0


def run_data(label: str, *, hits: float, gateway: dict[str, Any] | None = None) -> RunData:
    records = tuple(record(index=i, start=0.0, tokens=[0.1, 0.2], end=0.2) for i in range(4))
    before: dict[str, EngineCounters | str] = {
        "http://e0": EngineCounters(),
        "http://e1": "http://e1/metrics: ConnectError: refused",
    }
    after: dict[str, EngineCounters | str] = {
        "http://e0": EngineCounters(prefix_queries=400, prefix_hits=hits, requests=4),
        "http://e1": before["http://e1"],
    }
    target = {"kind": "tandem", "policy": label}
    return RunData(label, target, DriveResult(records, 0.2), before, after, gateway=gateway)


def test_a_summary_has_counts_hit_rates_and_load_per_engine() -> None:
    summary = summarize(run_data("round-robin", hits=100), time_scale=1.0, weights=ServiceWeights())
    assert summary["requests"] == {
        "total": 4, "sent": 4, "closed_loop_unsent": 0, "ok": 4, "errors": 0, "error_examples": []
    }  # fmt: skip
    assert summary["phase"] is None
    assert summary["engines"]["overall"]["prefix_hit_rate"] == 0.25
    assert summary["engines"]["engines"]["http://e1"] == {"error": "http://e1/metrics: ConnectError: refused"}
    assert summary["load"] == {"requests_per_engine": {"http://e0": 4}, "imbalance": 1.0}


@pytest.mark.parametrize(
    ("label", "repeat", "phase", "expected"),
    [
        ("vllm-router:cache_aware", 0, "", "vllm-router-cache_aware"),
        ("tandem", 2, "", "tandem-r2"),
        ("tandem", 0, "flood", "tandem"),
        ("tandem", 0, "alone", "tandem-alone"),
        ("vllm-router:round_robin", 1, "alone", "vllm-router-round_robin-alone-r1"),
    ],
)
def test_file_labels_name_the_repeat_and_an_isolation_runs_light_tenant_alone(
    label: str, repeat: int, phase: str, expected: str
) -> None:
    run = RunData(label, {}, DriveResult((), 0.0), {}, {}, repeat=repeat, phase=phase)
    assert run.file_label == expected


def test_the_markdown_table_has_one_column_per_run() -> None:
    runs = [summarize(run_data(label, hits=h), time_scale=1.0, weights=ServiceWeights()) for label, h in
            (("round-robin", 100), ("vllm-router:cache_aware", 300))]  # fmt: skip
    table = markdown_table(runs).splitlines()
    assert table[0] == "| metric | round-robin | vllm-router:cache_aware |"
    assert "| prefix cache hit rate | 25.0% | 75.0% |" in table
    assert "| requests ok / total | 4 / 4 | 4 / 4 |" in table
    assert "| TTFT p50 / p90 / p99 (ms) | 100 / 100 / 100 | 100 / 100 / 100 |" in table
    doc: dict[str, Any] = {
        "command": ["tandem", "bench"], "created": "2026-01-01T00:00:00+00:00",
        "machine": {"nproc": 2, "cpu": "x"}, "settings": {"time_scale": 10.0, "engines_desc": "2 engines"},
        "workload": {"name": "shared-prefix", "params": {"groups": 2}, "requests": 4, "seed": 0},
        "runs": runs,
    }  # fmt: skip
    text = markdown(doc)
    assert "time scale 10 (times are engine seconds" in text
    assert "2 cores" in text


def test_the_gateway_cpu_row_shows_when_a_run_had_a_gateway_and_a_dash_for_one_without() -> None:
    cpu = {"cpu_s": 0.75, "requests_sent": 500, "cpu_s_per_1000": 1.5}
    weights = ServiceWeights()
    routed = summarize(run_data("round-robin", hits=100, gateway=cpu), time_scale=1.0, weights=weights)
    direct = summarize(run_data("direct", hits=100), time_scale=1.0, weights=weights)
    assert routed["gateway"] == cpu and direct["gateway"] is None
    table = markdown_table([routed, direct]).splitlines()
    assert "| gateway CPU s per 1,000 requests | 1.50 | – |" in table
    assert (
        table.index("| gateway CPU s per 1,000 requests | 1.50 | – |")
        == table.index("| preemptions | 0 | 0 |") + 1
    )
    assert not any(line.startswith("| gateway CPU") for line in markdown_table([direct]).splitlines())
