"""The multi-turn, tenant-skew, burst, ramp and flood generators: shapes, statistics and determinism.

Real: the generators, Tandem's tokenizer and chat template (token counts are measured with
`encode`), the workload file dump. Nothing is faked; no I/O. Statistical checks use enough requests
that the tolerances hold for every seed tried, and fixed seeds so they are deterministic.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tandem.bench.catalog import WORKLOADS, make_workload
from tandem.bench.generators import (
    BurstParams,
    FloodParams,
    MultiTurnParams,
    RampParams,
    TenantSkewParams,
    burst,
    flood,
    multi_turn,
    ramp,
    ramp_rate,
    tenant_skew,
    zipf_shares,
)
from tandem.bench.workload_file import dump_jsonl
from tandem.bench.workloads import BenchRequest, WorkloadError, bounded
from tandem.core.tokenizer import encode, render_chat


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_is_the_same_for_a_seed_and_differs_between_seeds(name: str) -> None:
    small = {
        "multi-turn": {"sessions": "3"}, "ramp": {"peak_s": "5", "idle_s": "5", "tail_s": "5"},
        "azure-trace": {"length_scale": "0.02"}, "mooncake-trace": {"length_scale": "0.02"},
        "two-tenant": {"duration": "5"}, "tenant-skew": {"duration": "5"}, "burst": {"cycles": "1"},
        "flood": {"duration": "5", "heavy_streams": "4"},
    }  # fmt: skip
    params = small.get(name, {})
    first = dump_jsonl(make_workload(name, params, seed=7))
    assert first == dump_jsonl(make_workload(name, params, seed=7))
    assert first != dump_jsonl(make_workload(name, params, seed=8))


def test_each_turn_resends_the_whole_history_so_its_prompt_extends_the_previous_turn() -> None:
    w = multi_turn(MultiTurnParams(sessions=3, turns=4, system_prompt_tokens=50, user_tokens=10), seed=0)
    assert len(w.requests) == 12
    for session in ("s0", "s1", "s2"):
        turns = sorted((r for r in w.requests if r.group == session), key=lambda r: r.offset_s)
        prompts = [render_chat([dict(m) for m in r.messages or ()]) for r in turns]
        for earlier, later, turn in zip(prompts, prompts[1:], turns[1:], strict=False):
            assert later.startswith(earlier.removesuffix("<|im_start|>assistant\n"))
            roles = [m["role"] for m in turn.messages or ()]
            assert (
                roles[0] == "system"
                and roles[-1] == "user"
                and roles.count("assistant") == roles.count("user") - 1
            )
        assert [len(t.messages or ()) for t in turns] == [2, 4, 6, 8]
        assert len(encode(dict(turns[1].messages[2])["content"])) == 64  # type: ignore[index]


@pytest.mark.parametrize(("tenants", "s", "shares"), [
    (4, 1.0, [0.48, 0.24, 0.16, 0.12]),
    (3, 0.0, [1 / 3, 1 / 3, 1 / 3]),
    (2, 2.0, [0.8, 0.2]),
])  # fmt: skip
def test_zipf_shares(tenants: int, s: float, shares: list[float]) -> None:
    assert zipf_shares(tenants, s) == pytest.approx(shares)


def test_tenant_skew_gives_each_tenant_its_zipf_share_of_the_rate() -> None:
    params = TenantSkewParams(tenants=4, rate=50, duration=200, zipf_s=1.0, prompt_tokens=4, output_tokens=1)
    w = tenant_skew(params, seed=3)
    assert w.tenants and sorted(w.tenants) == ["t0", "t1", "t2", "t3"]
    counts = {t: sum(r.tenant == t for r in w.requests) for t in w.tenants}
    for tenant, share in zip(["t0", "t1", "t2", "t3"], zipf_shares(4, 1.0), strict=True):
        expected = 50 * 200 * share
        assert abs(counts[tenant] - expected) < 5 * expected**0.5, (tenant, counts[tenant], expected)


def test_a_burst_sends_only_in_its_on_periods_at_about_the_on_rate() -> None:
    params = BurstParams(cycles=4, on_s=10, off_s=20, rate_on=40, prompt_tokens=2, output_tokens=1)
    w = burst(params, seed=1)
    assert all(r.offset_s % 30 < 10 for r in w.requests)
    for cycle in range(4):
        n = sum(cycle * 30 <= r.offset_s < cycle * 30 + 10 for r in w.requests)
        assert abs(n - 400) < 5 * 20, (cycle, n)


@pytest.mark.parametrize(("t", "rate"), [
    (0, 0.5), (29.9, 0.5), (30, 0.5), (35, 8.25), (40, 16), (99.9, 16), (105, 8.25), (110, 0.5), (200, 0.5),
])  # fmt: skip
def test_the_ramp_rate_is_idle_then_linear_up_then_peak_then_linear_down(t: float, rate: float) -> None:
    assert ramp_rate(RampParams())(t) == pytest.approx(rate)


def test_ramp_arrivals_follow_its_rate_phase_by_phase() -> None:
    params = RampParams(idle_rate=1, peak_rate=30, idle_s=50, ramp_up_s=20, peak_s=50, ramp_down_s=20,
                        tail_s=50, prompt_tokens=2, output_tokens=1)  # fmt: skip
    offsets = [r.offset_s for r in ramp(params, seed=2).requests]
    phases = {(0, 50): 50, (50, 70): 310, (70, 120): 1500, (120, 140): 310, (140, 190): 50}
    for (start, end), expected in phases.items():
        n = sum(start <= t < end for t in offsets)
        assert abs(n - expected) < 5 * expected**0.5 + 5, (start, end, n, expected)
    assert max(offsets) < 190


def test_flood_is_a_closed_loop_heavy_tenant_and_a_poisson_light_one_of_the_same_shape() -> None:
    workload = flood(FloodParams(duration=60, heavy_streams=6, light_rate=2), seed=0)
    heavy = [r for r in workload.requests if r.tenant == "heavy"]
    light = [r for r in workload.requests if r.tenant == "light"]
    assert len(heavy) == 4 * 6 * 60, "4 requests per stream and second, all at t=0"
    assert all(r.offset_s == 0 for r in heavy)
    assert workload.closed_loop == {"heavy": 60.0}, "the heavy loop sends nothing after 60 s"
    assert workload.tenant_concurrency == {"heavy": 6, "light": None}, "the client never holds light back"
    assert workload.concurrency is None
    assert abs(len(light) - 120) < 5 * 120**0.5 and all(r.offset_s < 60 for r in light)
    for request in workload.requests:
        assert request.messages is not None and len(request.messages) == 1 and request.max_tokens == 64
        assert len(encode(request.messages[0]["content"])) == 256
    prompts = [r.messages[0]["content"] for r in workload.requests if r.messages is not None]
    assert len(set(prompts)) == len(prompts), "no two prompts share more than the chat template"


def test_flood_sizes_can_differ_per_tenant_and_the_completions_api_sends_plain_prompts() -> None:
    params = FloodParams(
        duration=10, heavy_streams=2, heavy_prompt_tokens=300, light_output_tokens=8, output_tokens=32,
        api="completions", heavy_tenant="big", light_tenant="small",
    )  # fmt: skip
    workload = flood(params, seed=1)
    sizes = {(r.tenant, len(encode(r.prompt or "")), r.max_tokens) for r in workload.requests}
    assert sizes == {("big", 300, 32), ("small", 256, 8)}
    assert workload.tenants == ("big", "small") and workload.closed_loop == {"big": 10.0}


def test_the_flood_light_requests_do_not_depend_on_the_heavy_parameters() -> None:
    def light(params: FloodParams) -> list[BenchRequest]:
        return [r for r in flood(params, seed=5).requests if r.tenant == "light"]

    assert light(FloodParams(duration=20)) == light(
        FloodParams(duration=20, heavy_streams=4, heavy_requests=10, heavy_prompt_tokens=99)
    )
    assert light(FloodParams(duration=20)) != light(FloodParams(duration=20, light_rate=3))


def test_flood_takes_explicit_heavy_requests_and_a_light_bound() -> None:
    workload = make_workload("flood", {"heavy_requests": "30", "light_concurrency": "3"}, seed=0)
    assert Counter(r.tenant for r in workload.requests)["heavy"] == 30
    assert workload.tenant_concurrency == {"heavy": 48, "light": 3}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"heavy_streams": "1000", "duration": "3600"}, "14400000 heavy requests .* set heavy_requests"),
        ({"light_tenant": "heavy"}, "heavy_tenant and light_tenant must differ"),
        ({"heavy_streams": "0"}, "heavy_streams: Input should be greater than or equal to 1"),
        ({"light_rate": "0"}, "light_rate: Input should be greater than 0"),
        ({"duration": "-1"}, "duration: Input should be greater than 0"),
        ({"light_prompt_tokens": "0"}, "light_prompt_tokens: Input should be greater than or equal to 1"),
        ({"api": "grpc"}, "api: Input should be 'chat' or 'completions'"),
        ({"streams": "4"}, "streams: unknown parameter"),
    ],
)
def test_flood_parameters_are_checked_and_errors_name_them(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        make_workload("flood", overrides, seed=0)


def test_a_duration_bound_ends_the_flood_loop_too() -> None:
    workload = make_workload("flood", {"duration": "40", "heavy_requests": "10"}, seed=0)
    cut = bounded(workload, requests=None, duration_s=10.0)
    assert cut.closed_loop == {"heavy": 10.0}
    assert all(r.offset_s < 10 for r in cut.requests)
    assert bounded(workload, requests=None, duration_s=None).closed_loop == {"heavy": 40.0}


def test_flood_output_spread_draws_lengths_within_the_band_and_keeps_the_mean() -> None:
    fixed = flood(FloodParams(duration=10, heavy_streams=4), seed=3)
    assert {r.max_tokens for r in fixed.requests} == {64}
    spread = flood(FloodParams(duration=10, heavy_streams=4, output_spread=0.5), seed=3)
    lengths = [r.max_tokens for r in spread.requests]
    assert min(lengths) >= 32 and max(lengths) <= 96 and len(set(lengths)) > 30
    assert abs(sum(lengths) / len(lengths) - 64) < 2
    assert [
        r.max_tokens
        for r in flood(FloodParams(duration=10, heavy_streams=4, output_spread=0.5), seed=3).requests
    ] == lengths
    # The light tenant's arrivals and prompts do not move with the spread.
    light = [(r.offset_s, r.messages) for r in spread.requests if r.tenant == "light"]
    assert light == [(r.offset_s, r.messages) for r in fixed.requests if r.tenant == "light"]
