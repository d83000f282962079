"""`tandem bench --many-services`: one gateway in front of N services against one gateway each.

Real: the pure parts of `tandem.bench.manyservices` (the workload, where each request goes, the
summary and its verdict), and one small live run through `tandem bench` (Redis, simulated engines
and gateways as child processes on 127.0.0.1) whose engines' counters say every model's requests
reached that model's engines, in every configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.bench.manyservices import ManySettings, request_urls, summarize, workload
from tandem.bench.workloads import BenchRequest
from tandem.cli.bench import bench


def test_the_workload_cycles_the_models_and_shares_prefixes_within_a_model_only() -> None:
    s = ManySettings(services=3, requests=60, groups=2, prefix_tokens=32, suffix_tokens=4)
    work = workload(s)
    assert [r.model for r in work.requests[:6]] == ["model-0", "model-1", "model-2"] * 2
    assert work.concurrency == s.concurrency and all(r.offset_s == 0 for r in work.requests)
    prefixes: dict[str, set[str]] = {}
    for r in work.requests:
        assert r.prompt is not None and r.group is not None and r.group.startswith(f"{r.model}/")
        prefixes.setdefault(r.group, set()).add(r.prompt.split(".")[0][:60])
    assert all(len(p) == 1 for p in prefixes.values()), "a group's requests share their prefix"
    firsts = [next(iter(p)) for p in prefixes.values()]
    assert len(set(firsts)) == len(firsts), "no two groups (of one model or two) share a prefix"
    assert workload(s) == work, "deterministic in the seed"
    assert workload(ManySettings(services=3, requests=60, groups=2, prefix_tokens=32, seed=1)) != work


def test_each_request_goes_to_its_models_urls_in_turn() -> None:
    requests = [BenchRequest(0, "t", 1, "p", model=m) for m in ("a", "b", "a", "a", "b")]
    urls = request_urls(requests, {"a": ["a0", "a1"], "b": ["b0"]})
    assert urls == ("a0", "b0", "a1", "a0", "b0")
    with pytest.raises(KeyError):
        request_urls([BenchRequest(0, "t", 1, "p", model="c")], {"a": ["a0"]})


def row(config: str, repeat: int, p50: float, cpu: float | None, hits: dict[str, float]) -> dict[str, object]:
    return {"config": config, "repeat": repeat, "requests": 10, "errors": 0, "ttft_p50_ms": p50,
            "ttft_p90_ms": p50 * 2, "cpu_s_per_1000": cpu, "hit_rate": hits}  # fmt: skip


def test_the_verdict_compares_shared_with_own_over_direct_per_repeat() -> None:
    rows = [
        row("direct", 0, 10.0, None, {"m0": 0.5, "m1": 0.6}),
        row("own", 0, 14.0, 4.0, {"m0": 0.50, "m1": 0.60}),
        row("shared", 0, 12.0, 3.0, {"m0": 0.49, "m1": 0.63}),
        row("direct", 1, 20.0, None, {"m0": 0.5, "m1": 0.6}),
        row("own", 1, 24.0, 6.0, {"m0": 0.50, "m1": 0.60}),
        row("shared", 1, 22.0, 3.0, {"m0": 0.49, "m1": 0.63}),
    ]
    summary = summarize(rows)
    # added TTFT: own 4 and 4 ms, shared 2 and 2 ms over the same repeat's direct
    assert summary["configs"]["own"]["added_ttft_p50_ms"]["mean"] == pytest.approx(4.0)
    assert summary["configs"]["shared"]["added_ttft_p50_ms"]["mean"] == pytest.approx(2.0)
    verdict = summary["verdict"]
    assert verdict["cpu_ratio"] == pytest.approx(3.0 / 5.0)
    assert verdict["added_ttft_ratio"] == pytest.approx(0.5)
    assert verdict["hit_rate_gap_points"] == pytest.approx(3.0)
    assert summarize([r for r in rows if r["config"] != "shared"])["verdict"] == {}


def test_many_services_refuses_the_harness_targets() -> None:
    result = CliRunner().invoke(bench, ["--many-services", "2", "--policy", "tandem"])
    assert result.exit_code == 2
    assert "--many-services runs its own configurations" in result.stderr


@pytest.mark.e2e
def test_a_small_run_sends_every_model_to_its_own_engines_in_every_configuration(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--many-services", "2", "--engines", "1", "--requests", "40", "--max-concurrency", "8",
            "--sweep-probe-pairs", "20", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "many-services.json").read_text())
    assert [(r["config"], r["errors"]) for r in doc["rows"]] == [("direct", 0), ("own", 0), ("shared", 0)]
    for r in doc["rows"]:
        assert r["engine_requests"] == {"model-0": 20, "model-1": 20}, r["config"]
    assert {"own", "shared"} <= {r["config"] for r in doc["rows"] if r["cpu_s_per_1000"] is not None}
    assert "shared ÷ own" in (out / "many-services.md").read_text()
    probes = [r["probe"] for r in doc["rows"] if r["config"] != "direct"]
    assert [(p["pairs"], p["errors"]) for p in probes] == [(20, 0), (20, 0)]
    assert all(p["added_ttft_p50_ms"] is not None for p in probes)
