"""Tenant isolation maths: the isolation ratio, the heavy tenant's throughput in its window, 429 and
other error counts, shares while both were backlogged, medians over repeats and the table; which
workloads have a light tenant to isolate; and each tenant's cumulative service over time (the plot's
data).

Real: the pure functions of `tandem.bench.isolation` and `tandem.bench.fairness.service_curves`, the
workload generators and matplotlib (the bar chart is written to a temporary directory). Faked:
requests are `Timed` values written by hand (engine seconds); no server or clock is involved.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.bench import plots
from tandem.bench.catalog import make_workload
from tandem.bench.fairness import ServiceWeights, service_curves
from tandem.bench.isolation import (
    IsolationSpec,
    aggregate_rows,
    alone_workload,
    isolation_document,
    isolation_markdown,
    isolation_row,
    isolation_spec,
    isolation_table,
    light_ttft,
    other_errors,
    ratio,
    status_count,
    window_throughput,
)
from tandem.bench.stats import Timed
from tandem.bench.workloads import WorkloadError, bounded

SPEC = IsolationSpec(heavy="heavy", light="light", window_s=10.0)


def req(
    tenant: str,
    *,
    start: float = 0.0,
    tokens: tuple[float, ...] = (),
    end: float | None = None,
    completion: int | None = None,
    status: int | None = 200,
    prompt: int = 100,
) -> Timed:
    """A request sent at `start` (arrival too) whose content chunks came at `tokens`; ok when it got
    200 and tokens."""
    ok = status == 200 and bool(tokens)
    return Timed(
        tenant=tenant, ok=ok, arrival=start, start=start, token_times=tokens,
        end=end if end is not None else (tokens[-1] if tokens else start), prompt_tokens=prompt,
        completion_tokens=completion if completion is not None else len(tokens), status=status,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("numerator", "denominator", "expected"),
    [
        (0.090, 0.060, 1.5),
        (0.060, 0.060, 1.0),
        (0.030, 0.060, 0.5),
        (None, 0.060, None),
        (0.090, None, None),
        (0.090, 0.0, None),
    ],
)
def test_a_ratio_needs_both_numbers_and_a_positive_denominator(
    numerator: float | None, denominator: float | None, expected: float | None
) -> None:
    assert ratio(numerator, denominator) == (None if expected is None else pytest.approx(expected))


#: 32 chunks: 20 every half second from 0 to 9.5 s, 12 after 10 s.
STREAMING_32_CHUNKS = tuple(0.5 * i for i in range(20)) + tuple(10.5 + i for i in range(12))


@pytest.mark.parametrize(
    ("requests", "window", "expected"),
    [
        # 25 requests ended by 10 s → 2.5 req/s; one token each → 2.5 tokens/s.
        ([req("heavy", tokens=(float(i % 10),)) for i in range(25)], 10.0, (2.5, 2.5)),
        # 64 tokens in 32 chunks, 20 of them by 10 s: 40 tokens, and the request had not ended.
        ([req("heavy", tokens=STREAMING_32_CHUNKS, completion=64)], 10.0, (0.0, 4.0)),
        # a failed request's tokens were still delivered; it is no ok request.
        (
            [req("heavy", tokens=(1.0, 2.0), status=200, end=3.0), req("heavy", tokens=(4.0,), status=500)],
            5.0,
            (0.2, 0.6),
        ),
        # another tenant's requests do not count.
        ([req("light", tokens=(1.0,))], 10.0, (0.0, 0.0)),
        ([], 0.0, (None, None)),
    ],
)
def test_the_heavy_throughput_counts_what_ended_and_what_streamed_within_the_window(
    requests: list[Timed], window: float, expected: tuple[float | None, float | None]
) -> None:
    rps, tps = window_throughput(requests, tenant="heavy", window_s=window)
    assert (rps, tps) == (
        (None, None) if expected[0] is None else (pytest.approx(expected[0]), pytest.approx(expected[1]))
    )


def test_the_window_counts_chunks_at_its_edge_and_ends_on_it() -> None:
    # 64 tokens in 32 chunks at 0..31 s: 11 chunks by 10 s (0, 1, ..., 10) → 22 tokens; ends at 31 s.
    streaming = req("heavy", tokens=tuple(float(t) for t in range(32)), completion=64)
    rps, tps = window_throughput([streaming], tenant="heavy", window_s=10.0)
    assert rps == 0.0 and tps == pytest.approx(2.2)
    assert window_throughput([req("heavy", tokens=(10.0,))], tenant="heavy", window_s=10.0) == (0.1, 0.1)


def test_429s_and_other_errors_are_counted_per_tenant_apart() -> None:
    requests = [req("light", status=429), req("heavy", status=429), req("heavy", status=429),
                req("heavy", status=503), req("heavy", tokens=(1.0,)), req("heavy", status=None),
                req("light", status=200)]  # fmt: skip
    assert status_count(requests, tenant="light") == 1
    assert status_count(requests, tenant="heavy") == 2
    assert status_count(requests, tenant="heavy", status=503) == 1
    assert other_errors(requests, tenant="heavy") == 2, "the 503 and the one without an answer"
    assert other_errors(requests, tenant="light") == 1, "200 without a token is no success"


def test_a_request_never_sent_is_no_error() -> None:
    never = Timed(tenant="heavy", ok=False, arrival=0.0, start=None, token_times=(), end=None,
                  prompt_tokens=None, completion_tokens=None, status=None)  # fmt: skip
    assert other_errors([never], tenant="heavy") == 0 and status_count([never], tenant="heavy") == 0


def test_the_light_ttft_is_over_its_ok_requests_only() -> None:
    requests = [req("light", start=0.0, tokens=(t,)) for t in (0.1, 0.2, 0.3, 0.4, 0.5)]
    requests += [req("light", start=0.0, tokens=(9.0,), status=500), req("heavy", tokens=(7.0,))]
    p50, p90 = light_ttft(requests, SPEC)
    assert p50 == pytest.approx(0.3) and p90 == pytest.approx(0.46)


def test_one_repeat_compares_the_light_tenant_under_flood_with_alone() -> None:
    alone = [req("light", start=s, tokens=(s + 0.06,)) for s in (0.0, 1.0, 2.0)]
    flood = [req("light", start=s, tokens=(s + 0.09,)) for s in (0.0, 1.0, 2.0)]
    flood += [req("light", start=3.0, status=429)]
    flood += [req("heavy", start=0.0, tokens=(1.0, 2.0), end=2.0, completion=4) for _ in range(5)]
    flood += [req("heavy", status=429), req("heavy", status=502), req("light", status=500)]
    fairness = {
        "service_gap_backlogged": 1234.0, "backlogged_s": 2.5,
        "tenants": {"heavy": {"share_backlogged": 0.75}, "light": {"share_backlogged": 0.25}},
    }  # fmt: skip
    row = isolation_row(
        label="tandem", repeat=1, flood=flood, alone=alone, spec=SPEC, fairness=fairness, unsent=17
    )
    assert row["isolation_ratio_p90"] == pytest.approx(1.5) and row["isolation_ratio_p50"] == pytest.approx(
        1.5
    )
    assert row["light_ttft_alone_p90_s"] == pytest.approx(0.06)
    assert row["light_ttft_flood_p90_s"] == pytest.approx(0.09)
    assert (row["light_requests"], row["light_ok"], row["light_alone_ok"]) == (5, 3, 3)
    assert (row["light_429"], row["heavy_429"], row["heavy_sent"]) == (1, 1, 7)
    assert (row["light_errors"], row["heavy_errors"], row["heavy_unsent"]) == (1, 1, 17)
    assert (row["heavy_share_backlogged"], row["light_share_backlogged"]) == (0.75, 0.25)
    assert row["heavy_requests_per_s"] == pytest.approx(0.5), "5 ok heavy requests ended by 10 s"
    assert row["heavy_output_tokens_per_s"] == pytest.approx(2.0), "20 tokens over 10 s"
    assert (row["service_gap_backlogged"], row["backlogged_s"]) == (1234.0, 2.5)
    assert (row["label"], row["repeat"]) == ("tandem", 1)


def test_a_failed_alone_run_leaves_the_ratio_undefined() -> None:
    flood = [req("light", tokens=(0.1,))]
    row = isolation_row(label="x", repeat=0, flood=flood, alone=[], spec=SPEC, fairness={})
    assert row["isolation_ratio_p90"] is None and row["light_ttft_flood_p90_s"] == pytest.approx(0.1)
    assert row["service_gap_backlogged"] is None and row["light_share_backlogged"] is None


def rows_for(label: str, ratios: list[float | None]) -> list[dict[str, object]]:
    return [{"label": label, "repeat": i, "isolation_ratio_p90": r, "light_ttft_alone_p90_s": 0.05,
             "light_429": 0} for i, r in enumerate(ratios)]  # fmt: skip


def test_repeats_are_summarised_per_target_by_their_median_and_range() -> None:
    agg = aggregate_rows(
        rows_for("tandem", [1.2, 3.0, 1.4]) + rows_for("vllm-router:round_robin", [8.0, None])
    )
    tandem, peer = agg["tandem"]["isolation_ratio_p90"], agg["vllm-router:round_robin"]["isolation_ratio_p90"]
    assert (tandem["n"], tandem["median"], tandem["min"], tandem["max"]) == (3, 1.4, 1.2, 3.0)
    assert (peer["n"], peer["median"]) == (1, 8.0), "a run without a ratio is left out"
    assert agg["tandem"]["heavy_429"]["n"] == 0


def test_the_isolation_table_has_one_column_per_target_in_display_units() -> None:
    agg = aggregate_rows(rows_for("tandem", [1.2, 3.0, 1.4]) + rows_for("fcfs", [8.0]))
    table = isolation_table(agg, IsolationSpec(heavy="big", light="small", window_s=40.0))
    lines = table.splitlines()
    assert lines[0] == "| metric (median (min–max) over repeats) | tandem | fcfs |"
    assert "| isolation ratio: small TTFT p90, flood ÷ alone | 1.40 (1.20–3.00) | 8.00 |" in lines
    assert "| small TTFT p90 alone (ms) | 50 (50–50) | 50 |" in lines
    assert "| small 429s | 0 (0–0) | 0 |" in lines
    assert "| big 429s | – | – |" in lines


def test_flood_and_two_tenant_name_their_tenants_and_window() -> None:
    flood = make_workload("flood", {"heavy_streams": "4", "duration": "5", "light_tenant": "quiet"}, seed=0)
    assert isolation_spec(flood) == IsolationSpec(heavy="heavy", light="quiet", window_s=5.0)
    assert isolation_spec(flood, cut_s=2.0).window_s == 2.0
    assert isolation_spec(bounded(flood, requests=None, duration_s=3.0)).window_s == 3.0
    two = make_workload("two-tenant", {"duration": "7"}, seed=0)
    assert isolation_spec(two) == IsolationSpec(heavy="heavy", light="light", window_s=7.0)


def test_a_workload_without_a_light_tenant_cannot_be_isolated() -> None:
    with pytest.raises(WorkloadError, match="--isolation needs a workload with a heavy_tenant and a light"):
        isolation_spec(make_workload("shared-prefix", {}, seed=0))


def test_alone_is_the_light_tenants_requests_unchanged() -> None:
    flood = make_workload("flood", {"heavy_streams": "4", "duration": "5"}, seed=3)
    alone = alone_workload(flood, isolation_spec(flood))
    assert alone.requests == tuple(r for r in flood.requests if r.tenant == "light")
    assert alone.tenants == ("light",) and alone.closed_loop == {}
    assert alone.tenant_concurrency == flood.tenant_concurrency


def test_service_curves_accumulate_prompts_at_the_first_token_and_output_per_chunk() -> None:
    requests = [
        req("a", tokens=(1.0, 1.5), completion=4, prompt=10),
        req("b", tokens=(0.5,), completion=1, prompt=3),
        req("a", tokens=(), status=500),
        req("c", tokens=(), status=429),
    ]
    curves = service_curves(requests, ServiceWeights(input=1, output=2))
    assert curves == {
        "a": ([1.0, 1.0, 1.5], [10.0, 14.0, 18.0]),
        "b": ([0.5, 0.5], [3.0, 5.0]),
        "c": ([], []),
    }


def test_the_markdown_section_names_the_tenants_and_the_window() -> None:
    section = isolation_markdown(isolation_document(SPEC, rows_for("tandem", [2.0])))
    assert section[0] == "## Isolation under a flood: light alone, then under heavy's flood"
    assert "heavy's completed requests over [0, 10 s] ÷ 10 s" in section[2]
    assert "Medians" not in section[2], "one run: nothing to take a median of"
    assert "| isolation ratio: light TTFT p90, flood ÷ alone | 2.00 |" in section[-1]
    three = isolation_markdown(isolation_document(SPEC, rows_for("tandem", [2.0, 1.0, 4.0])))
    assert "Medians over 3 repeats" in three[2]
    assert "| isolation ratio: light TTFT p90, flood ÷ alone | 2.00 (1.00–4.00) |" in three[-1]


@pytest.mark.skipif(not plots.available(), reason="matplotlib (the bench extra) is not installed")
def test_the_isolation_bar_chart_draws_each_target_and_skips_what_is_undefined(tmp_path: Path) -> None:
    agg = aggregate_rows(
        [{"label": "tandem", "repeat": i, "light_ttft_alone_p90_s": 0.05, "light_ttft_flood_p90_s": f,
          "isolation_ratio_p90": f / 0.05} for i, f in enumerate((0.1, 0.2, 0.15))]
        + [{"label": "broken", "repeat": 0, "light_ttft_flood_p90_s": 0.3}]
    )  # fmt: skip
    keys = {
        "alone": "light_ttft_alone_p90_s",
        "flood": "light_ttft_flood_p90_s",
        "ratio": "isolation_ratio_p90",
    }
    bars = {label: {k: agg[label][key] for k, key in keys.items()} for label in agg}
    assert bars["broken"]["alone"]["median"] is None and bars["tandem"]["ratio"]["median"] == pytest.approx(
        3.0
    )
    path = tmp_path / "isolation.png"
    plots.isolation_bars(bars, path, title="t", light="light")
    assert path.read_bytes().startswith(b"\x89PNG")
