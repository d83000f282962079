"""The multi-adapter benchmark: its workload, the adapter folder, its figures, and one live run.

Real: the generator, the folder builder (read back with Tandem's own `read_adapter_config`), the
figures' pure functions on hand-written samples and records, and in the live test everything —
redis-server, two `tandem sim` engines with `--enable-lora` resolving the generated folder, `tandem
router`, the driver, the per-second sampling. Nothing is faked; no assertion is on speed.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tandem.bench.adapterbench import (
    EngineSample,
    burst_peaks,
    imbalance,
    load_series,
    parse_engine_sample,
    placement,
    run_row,
    verdict,
)
from tandem.bench.adapterfloor import least_disk_loads, least_loads, least_loads_markdown
from tandem.bench.adapters import (
    MultiAdapterParams,
    adapter_names,
    burst_window,
    multi_adapter,
    write_adapter_folder,
)
from tandem.bench.catalog import make_workload
from tandem.bench.generators import zipf_shares
from tandem.bench.pool import PoolSettings, bench_service
from tandem.bench.records import DriveResult, RequestRecord
from tandem.cli.main import cli
from tandem.core.adapters import read_adapter_config


def test_adapter_popularity_follows_the_zipf_shares() -> None:
    params = MultiAdapterParams(
        adapters=20, zipf_s=1.1, rate=100, duration=100, prompt_tokens=2, output_tokens=1
    )
    w = multi_adapter(params, seed=4)
    counts = Counter(r.model for r in w.requests)
    assert set(counts) <= set(adapter_names(20)) and all(r.model == r.group for r in w.requests)
    total = len(w.requests)
    assert abs(total - 10_000) < 5 * 100, total
    for name, share in zip(adapter_names(20)[:5], zipf_shares(20, 1.1)[:5], strict=True):
        expected = total * share
        assert abs(counts[name] - expected) < 5 * expected**0.5, (name, counts[name], expected)
    ranked = [name for name, _ in counts.most_common(3)]
    assert ranked == ["a000", "a001", "a002"]


def test_the_burst_sends_the_hot_adapter_only_inside_its_window_at_about_its_rate() -> None:
    params = MultiAdapterParams(adapters=50, rate=2, duration=60, burst_rate=30, burst_start=20, burst_len=10,
                                prompt_tokens=2, output_tokens=1)  # fmt: skip
    assert burst_window(params) == (20.0, 30.0)
    w = multi_adapter(params, seed=0)
    hot = [r.offset_s for r in w.requests if r.model == "a049"]
    inside = [t for t in hot if 20 <= t < 30]
    assert abs(len(inside) - 300) < 5 * 300**0.5, len(inside)
    assert len(hot) - len(inside) <= 2, "outside the burst, the least popular adapter is rare"
    offsets = [r.offset_s for r in w.requests]
    assert offsets == sorted(offsets)
    calm = params.model_copy(update={"burst_rate": 0.0})
    quiet = multi_adapter(calm, seed=0)
    assert burst_window(calm) is None
    assert len(w.requests) - len(quiet.requests) == len(inside)


def test_the_workload_is_the_same_for_a_seed_and_named_as_its_adapters() -> None:
    first = make_workload("multi-adapter", {"adapters": "1000", "duration": "5"}, seed=1)
    assert first == make_workload("multi-adapter", {"adapters": "1000", "duration": "5"}, seed=1)
    assert first != make_workload("multi-adapter", {"adapters": "1000", "duration": "5"}, seed=2)
    assert adapter_names(1000)[0] == "a000" and adapter_names(1000)[-1] == "a999"
    assert adapter_names(1001)[-1] == "a1000" and adapter_names(1001)[0] == "a0000"


def test_the_folder_holds_one_config_per_adapter_that_the_resolver_accepts(tmp_path: Path) -> None:
    folder = write_adapter_folder(tmp_path / "adapters", adapter_names(3), base_model="qwen", rank=16)
    assert sorted(p.name for p in folder.iterdir()) == ["a000", "a001", "a002"]
    config = read_adapter_config(folder / "a001")
    assert (config.rank, config.base_model, config.peft_type) == (16, "qwen", "LORA")
    raw = json.loads((folder / "a002" / "adapter_config.json").read_text())
    assert raw["lora_alpha"] == 32 and raw["target_modules"]


def test_placement_counts_the_adapters_on_several_and_on_every_engine() -> None:
    got = placement({"e0": ["a", "b", "c"], "e1": ["b", "c"], "e2": ["c"]})
    assert got == {"adapters_per_engine": {"e0": 3, "e1": 2, "e2": 1}, "adapters_distinct": 3,
                   "adapters_on_several_engines": 2, "adapters_on_every_engine": 1}  # fmt: skip
    assert placement({})["adapters_on_every_engine"] == 0


METRICS = """\
# TYPE tandem_sim_lora_loads_total counter
tandem_sim_lora_loads_total{engine="0",model_name="qwen",source="disk"} 7.0
tandem_sim_lora_loads_total{engine="0",model_name="qwen",source="cpu"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 5.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen"} 11.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"} 1.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="qwen"} 2.0
"""


def test_an_engine_sample_reads_both_load_sources_the_queue_and_what_finished_there() -> None:
    s = parse_engine_sample(METRICS, t=1.5, engine="e0")
    # finished: length and stop; an aborted request (taken back by the gateway) finished elsewhere
    assert (s.disk_loads, s.cpu_loads, s.loads, s.waiting, s.running, s.finished) == (7, 9, 16, 3, 5, 12)
    # Only the families read are parsed: the rest of the page, even a line the parser would refuse,
    # costs the driving event loop nothing.
    ttft = "vllm:time_to_first_token_seconds"
    histogram = f'# TYPE {ttft} histogram\n{ttft}_bucket{{le="x"}} ?\n'
    again = parse_engine_sample(histogram + METRICS, t=1.5, engine="e0")
    assert (again.loads, again.waiting, again.running, again.finished) == (16, 3, 5, 12)


@pytest.mark.parametrize(("peaks", "expected"), [
    ({"a": 6, "b": 2, "c": 2, "d": 2}, 2.0),
    ({"a": 1, "b": 1}, 1.0),
    ({"a": 0, "b": 0}, None),
    ({}, None),
])  # fmt: skip
def test_imbalance_is_the_largest_peak_over_the_mean(peaks: dict[str, float], expected: float | None) -> None:
    assert imbalance(peaks) == expected


def test_with_prefill_and_decode_pools_the_imbalance_is_the_worst_pools_over_its_own_mean() -> None:
    """The target is "no engine's queue above 2× the pool's mean": prefill engines (rarely waiting)
    do not dilute the decode pool's mean, nor the reverse."""
    peaks = {"p0": 0.0, "p1": 0.0, "d0": 3.0, "d1": 1.0}
    pools = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"}
    assert imbalance(peaks) == 3.0, "as one pool"
    assert imbalance(peaks, pools) == 1.5
    assert imbalance({**peaks, "p0": 4.0}, pools) == 2.0, "the worse pool's figure"
    assert imbalance({"p0": 0.0, "d0": 0.0}, pools) is None


def _record(
    i: int, arrival: float, *, ttft: float, ok: bool = True, group: str | None = None
) -> RequestRecord:
    r = RequestRecord(i, "bench", group, 10, arrival, start_s=arrival, end_s=arrival + 1.0,
                      completion_tokens=10, status=200 if ok else 500)  # fmt: skip
    r.token_times_s.append(arrival + ttft)
    if not ok:
        r.error = "boom"
    return r


def test_a_rows_loads_per_1000_count_both_sources_and_the_burst_peaks_only_inside_the_window() -> None:
    records = tuple(_record(i, float(i), ttft=0.1 if i < 5 else 0.5) for i in range(10))
    before = {"e0": EngineSample(0, "e0", 1, 1), "e1": EngineSample(0, "e1", 0, 0)}
    after = {"e0": EngineSample(10, "e0", 4, 5), "e1": EngineSample(10, "e1", 2, 2)}
    samples = [
        EngineSample(2, "e0", waiting=9),
        EngineSample(6, "e0", waiting=4),
        EngineSample(6, "e1", waiting=1),
    ]
    loaded = {"e0": ["a000"], "e1": ["a000", "a001"]}
    row = run_row("x", 0, result=DriveResult(records, 10.0), samples=samples, before=before, after=after,
                  window=(5.0, 8.0), time_scale=1.0, adapters=loaded)  # fmt: skip
    assert row["loads"] == 11 and row["disk_loads"] == 5 and row["loads_per_1000"] == 1100
    assert row["loads_by_engine"] == {"e0": 7, "e1": 4}
    assert row["adapters_on_every_engine"] == 1 and row["adapters_per_engine"] == {"e0": 1, "e1": 2}
    assert row["burst_waiting_peaks"] == {"e0": 4, "e1": 1}, "the sample at t=2 is before the burst"
    assert row["burst_queue_imbalance"] == pytest.approx(4 / 2.5)
    assert row["burst_ttft_p99_ms"] == pytest.approx(500) and row["errors"] == 0
    assert row["throughput_tok_s"] == pytest.approx(100 / 10)
    assert burst_peaks(samples, None, time_scale=1.0, running=False) == {}


def test_the_burst_p99_is_the_hot_adapters_requests_in_the_window_beside_every_request_there() -> None:
    """Requests at 0..9 s, the window [4, 8): the hot adapter's (even indexes) answered in 0.1 s,
    another adapter's in 0.9 s. The burst's figure is the hot adapter's requests in the window
    (4, 6: 100 ms); the window's, every request in it (4..7: up to 900 ms)."""
    records = tuple(
        _record(i, float(i), ttft=0.1 if i % 2 == 0 else 0.9, group="hot" if i % 2 == 0 else "cold")
        for i in range(10)
    )
    sample = {"e0": EngineSample(0, "e0", 0, 0)}
    row = run_row("x", 0, result=DriveResult(records, 10.0), samples=[], before=sample, after=sample,
                  window=(4.0, 8.0), time_scale=1.0, hot="hot")  # fmt: skip
    assert row["burst_requests"] == 2 and row["burst_ttft_p99_ms"] == pytest.approx(100)
    assert row["window_ttft_p99_ms"] == pytest.approx(900)
    every = run_row("x", 0, result=DriveResult(records, 10.0), samples=[], before=sample, after=sample,
                    window=(4.0, 8.0), time_scale=1.0)  # fmt: skip
    assert every["burst_requests"] == 4 and every["burst_ttft_p99_ms"] == pytest.approx(900)


def test_the_verdict_compares_with_the_best_peer_of_each_figure() -> None:
    def cell(v: float | None) -> dict[str, float | None]:
        return {"mean": v, "max": v}

    def row(ttft: float, loads: float, tput: float, burst: float, queue: float | None, errors: int) -> Any:
        return {"errors": errors, "ttft_p90_ms": cell(ttft), "loads_per_1000": cell(loads),
                "throughput_tok_s": cell(tput), "burst_ttft_p99_ms": cell(burst),
                "window_ttft_p99_ms": cell(2 * burst), "burst_queue_imbalance": cell(queue)}  # fmt: skip

    table = {"tandem": row(40, 30, 100, 60, 1.5, 0), "rr": row(100, 200, 90, 100, 1.0, 0),
             "ca": row(90, 100, 95, 200, 3.0, 0)}  # fmt: skip
    checks = {c["target"]: c for c in verdict(table, ours="tandem")}
    assert checks["TTFT p90"]["best_peer"] == "ca" and checks["TTFT p90"]["ratio"] == pytest.approx(40 / 90)
    assert checks["adapter loads per 1,000 requests"]["ratio"] == pytest.approx(0.3)
    assert checks["throughput"]["best_peer"] == "ca" and checks["throughput"]["met"]
    assert checks["burst: TTFT p99 of the burst's requests"]["best_peer"] == "rr"
    window = checks["burst window: TTFT p99 of every request in it (not a target)"]
    assert window["best_peer"] == "rr" and window["ratio"] == pytest.approx(0.6) and window["met"] is None
    assert all(c["met"] for c in checks.values() if c["met"] is not None)
    table["tandem"]["burst_queue_imbalance"] = cell(2.5)
    assert not {c["target"]: c for c in verdict(table, ours="tandem")}[
        "burst: largest engine queue ÷ pool mean (worst repeat)"
    ]["met"]


def fewest_misses(sequence: list[str], slots: int) -> int:
    """Every eviction choice tried (exhaustive search over the cache's states): the true optimum."""
    states: dict[frozenset[str], int] = {frozenset(): 0}
    for name in sequence:
        following: dict[frozenset[str], int] = {}
        for held, misses in states.items():
            if name in held:
                options = [(held, misses)]
            elif len(held) < slots:
                options = [(held | {name}, misses + 1)]
            else:
                options = [((held - {out}) | {name}, misses + 1) for out in held]
            for state, m in options:
                following[state] = min(m, following.get(state, m))
        states = following
    return min(states.values())


@pytest.mark.parametrize("seed", range(8))
def test_the_least_disk_loads_are_the_optimum_of_every_eviction_choice(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(6)]
    sequence = [rng.choice(names) for _ in range(14)]
    for slots in (1, 2, 3):
        assert least_disk_loads(sequence, slots=slots) == fewest_misses(sequence, slots), (sequence, slots)


def test_the_floor_counts_a_gpu_copy_per_disk_read_and_compares_with_the_best_peer() -> None:
    sequence = list(itertools.chain.from_iterable(["a", "b", "c"] for _ in range(4)))  # a b c a b c ...
    bound = least_loads(sequence, slots=2, best_peer=1000.0)
    # Two slots over a cycle of three: Belady misses 3 at the start, then one every other request.
    assert least_disk_loads(sequence, slots=2) == 7
    assert bound["least_disk_loads_per_1000"] == pytest.approx(7000 / 12)
    assert bound["least_loads_per_1000"] == pytest.approx(14000 / 12)
    assert bound["least_ratio_to_best_peer"] == pytest.approx(14 / 12)
    assert bound["distinct_adapters"] == 3 and bound["least_share_reading_disk"] == pytest.approx(7 / 12)


def test_with_the_gpu_slots_known_the_floor_counts_their_copies_and_the_warm_floor_is_those_alone() -> None:
    sequence = list(itertools.chain.from_iterable(["a", "b", "c"] for _ in range(4)))
    bound = least_loads(sequence, slots=2, gpu_slots=1, best_peer=1000.0)
    # One GPU slot: every request after a different adapter's is a copy (12); two CPU entries: 7 reads.
    assert bound["least_gpu_copies_per_1000"] == pytest.approx(12000 / 12)
    assert bound["least_loads_per_1000"] == pytest.approx((7 + 12) * 1000 / 12)
    assert bound["least_warm_loads_per_1000"] == pytest.approx(12000 / 12)
    assert bound["least_warm_ratio_to_best_peer"] == pytest.approx(1.0)
    assert "copies into the 1 GPU slots alone: 1000 loads per 1,000" in least_loads_markdown(bound)
    # With as many GPU slots as CPU entries, the copies are the reads: 2 × reads, as without them.
    same = least_loads(sequence, slots=2, gpu_slots=2, best_peer=None)
    assert (
        same["least_loads_per_1000"] == least_loads(sequence, slots=2, best_peer=None)["least_loads_per_1000"]
    )
    assert least_loads(sequence, slots=2, best_peer=None)["least_warm_loads_per_1000"] is None
    with pytest.raises(ValueError, match="as many pools"):
        least_loads(sequence, slots=[2, 2], gpu_slots=[1], best_peer=None)


def test_with_prefill_and_decode_pools_each_pool_reads_on_its_own() -> None:
    """A disaggregated request needs its adapter on a prefill and on a decode engine: the floor is
    each pool's least reads added up (and said per pool), not one pool's over all the entries."""
    sequence = list(itertools.chain.from_iterable(["a", "b", "c"] for _ in range(4)))
    both = least_loads(sequence, slots=[2, 3], best_peer=1000.0)
    assert both["least_disk_loads_per_1000"] == pytest.approx((7 + 3) * 1000 / 12)
    assert both["least_share_reading_disk"] == pytest.approx(7 / 12), "the pool where most must read"
    assert (both["slots"], both["pools"]) == (5, [2, 3])
    one = least_loads(sequence, slots=5, best_peer=None)
    assert one["least_disk_loads_per_1000"] == pytest.approx(3000 / 12), "five entries in one pool: 3 reads"
    assert "2 + 3 CPU-tier entries (prefill and decode pools" in least_loads_markdown(both)


def test_the_plot_series_counts_loads_since_the_first_sample_and_the_busiest_engine() -> None:
    samples = [
        {"t": 0.0, "engine": "a", "disk_loads": 2, "cpu_loads": 2, "waiting": 0, "running": 1},
        {"t": 0.0, "engine": "b", "disk_loads": 0, "cpu_loads": 0, "waiting": 0, "running": 0},
        {"t": 1.0, "engine": "a", "disk_loads": 3, "cpu_loads": 4, "waiting": 2, "running": 3},
        {"t": 1.0, "engine": "b", "disk_loads": 1, "cpu_loads": 1, "waiting": 0, "running": 1},
    ]
    assert load_series({"samples": samples}, time_scale=2.0) == {
        "t": [0.0, 2.0],
        "loads": [0, 5],
        "busiest": [1, 5],
    }


def test_a_live_run_counts_the_engines_adapter_loads_with_no_errors(tmp_path: Path) -> None:
    args = ["bench", "--workload", "multi-adapter", "--param", "adapters=6", "--param", "rate=8",
            "--param", "duration=4", "--param", "prompt_tokens=32", "--param", "output_tokens=4",
            "--param", "burst_rate=4", "--param", "burst_start=1", "--param", "burst_len=2",
            "--policy", "tandem", "--adapters-bench", "--engines", "2", "--max-loras", "2",
            "--max-cpu-loras", "3", "--time-scale", "1", "--no-plots", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "adapters.json").read_text())
    assert doc["pool"]["max_cpu_loras"] == 3 and "max_cpu_loras 3" in (tmp_path / "adapters.md").read_text()
    (row,) = doc["rows"]
    assert 25 <= row["requests"] <= 60 and row["errors"] == 0, row
    assert row["loads"] > 0 and row["disk_loads"] > 0, "the engines loaded adapters through the resolver"
    assert row["loads_per_1000"] == pytest.approx(row["loads"] * 1000 / row["requests"])
    assert sum(row["adapters_per_engine"].values()) >= 2, row["adapters_per_engine"]
    # Every request finished on an engine; one the gateway re-sent after a connect timeout of its
    # own (a CPU-starved event loop, docs/decisions.md) may have finished on the first engine too.
    finished = sum(row["requests_by_engine"].values())
    assert row["requests"] <= finished <= row["requests"] * 1.05, (finished, row["requests"])
    assert 2 <= row["adapters_distinct"] <= 6
    assert len(row["loads_by_engine"]) == 2
    timeline = json.loads((tmp_path / "adapter-timelines.json").read_text())
    assert len(timeline) == 1 and len(timeline[0]["samples"]) >= 2 * 2, "sampled each second, both engines"
    assert "| tandem |" in (tmp_path / "adapters.md").read_text()
    floor = doc["least_loads"]
    assert floor["slots"] == 2 * 3 and floor["requests"] == row["requests"], "3 CPU-tier entries per engine"
    assert floor["least_loads_per_1000"] <= row["loads_per_1000"], "no placement beats the floor"
    assert floor["gpu_pools"] == [2 * 2] and floor["least_warm_loads_per_1000"] <= row["loads_per_1000"]
    assert "Least any placement could reach" in (tmp_path / "adapters.md").read_text()


def test_the_engines_cpu_tier_reaches_the_service_and_may_not_be_below_the_gpu_slots(tmp_path: Path) -> None:
    pool = PoolSettings(max_loras=2, max_cpu_loras=16)
    lora = bench_service(pool, policy="tandem", direct=False).spec.engine.lora
    assert lora is not None and (lora.max_loras, lora.max_cpu_loras) == (2, 16)
    default = bench_service(PoolSettings(max_loras=2), policy="tandem", direct=False).spec.engine.lora
    assert default is not None and default.max_cpu_loras is None  # vLLM's default: --max-loras
    args = ["bench", "--workload", "multi-adapter", "--param", "adapters=4", "--param", "duration=1",
            "--adapters-bench", "--max-loras", "4", "--max-cpu-loras", "2", "--policy", "tandem",
            "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "--max-cpu-loras (2) must be >= --max-loras (4)" in result.output
