"""The harness end to end: `tandem bench --policy ... --direct` on 2 simulated engines.

Real: everything — redis-server, `tandem sim` engines and `tandem router` as child processes on
127.0.0.1 (started by the harness through tandem.local), the driver's HTTP streams, the engines'
/metrics, the report files; vllm-router too in the peer test when its binary is installed (the
`bench` extra); as `--peer-command` routers, the tests' own stdlib proxy (forward_router.py) and a
`tandem sim` standing in for a router. Nothing is faked. The engines run at time scale 100 and the
workload is a handful of short requests; assertions are on counts, fields and processes, never on
speed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tandem.bench.targets import find_vllm_router
from tandem.cli.main import cli

TINY = ["--engines", "2", "--time-scale", "100", "--param", "groups=2", "--param", "prompts_per_group=3",
        "--param", "system_prompt_tokens=256", "--param", "question_tokens=16", "--param", "output_tokens=4",
        "--param", "rate=inf", "--request-timeout", "60", "--no-plots"]  # fmt: skip


def run_bench(tmp_path: Path, *targets: str) -> tuple[dict[str, Any], str]:
    result = CliRunner().invoke(cli, ["bench", *targets, *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / "bench.json").read_text()), result.stdout


def assert_stopped(run: dict[str, Any]) -> None:
    for child in run["children"]:
        assert child["returncode"] is not None, f"{child['name']} was not waited for"
        with pytest.raises(ProcessLookupError):
            os.kill(child["pid"], 0)


def test_each_policy_and_direct_run_cold_on_their_own_engines_and_every_child_stops(tmp_path: Path) -> None:
    doc, table = run_bench(tmp_path, "--policy", "round-robin", "--direct")
    assert [r["label"] for r in doc["runs"]] == ["round-robin", "direct"]
    routed, direct = doc["runs"]
    for run in doc["runs"]:
        assert run["requests"]["total"] == 6 and run["requests"]["ok"] == 6, run["requests"]
        overall = run["engines"]["overall"]
        assert overall is not None and overall["delta"]["prompt_tokens"] > 0
        assert 0.0 <= overall["prefix_hit_rate"] <= 1.0
        assert overall["delta"]["requests"] == 6, "the engines' counters started from zero (cold engines)"
        assert_stopped(run)
    assert sorted(c["role"] for c in routed["children"]) == ["decode", "decode", "kvpool", "router"]
    cpu = routed["gateway"]
    assert cpu["requests_sent"] == 6 and cpu["cpu_s"] >= 0 and cpu["cpu_s_per_1000"] >= 0, cpu
    assert direct["gateway"] is None, "direct has no gateway"
    assert doc["aggregate"]["round-robin"]["gateway_cpu_per_1000"]["n"] == 1
    assert sorted(c["role"] for c in direct["children"]) == ["decode", "kvpool"]
    assert len(routed["load"]["requests_per_engine"]) == 2
    assert sum(routed["load"]["requests_per_engine"].values()) == 6
    assert direct["engines"]["overall"]["prefix_hit_rate"] > 0, "one engine sees every group's prefix again"
    assert doc["settings"]["time_scale"] == 100.0 and doc["machine"]["nproc"] >= 1
    assert "| metric | round-robin | direct |" in table
    (row,) = [line for line in table.splitlines() if line.startswith("| gateway CPU s per 1,000 requests |")]
    routed_cell, direct_cell = row.strip("| ").split(" | ")[1:]
    assert float(routed_cell) >= 0 and direct_cell == "–", row
    assert sorted(p.name for p in tmp_path.glob("requests-*.jsonl")) == [
        "requests-direct.jsonl",
        "requests-round-robin.jsonl",
    ]


@pytest.mark.skipif(
    find_vllm_router(python=sys.executable) is None,
    reason="vllm-router is not installed (pip install 'vllm-router==0.1.17', the bench extra)",
)
def test_a_peer_router_runs_in_front_of_the_same_engines(tmp_path: Path) -> None:
    doc, table = run_bench(tmp_path, "--peer", "vllm-router:cache_aware")
    (run,) = doc["runs"]
    assert run["label"] == "vllm-router:cache_aware"
    assert run["requests"]["ok"] == 6
    assert run["engines"]["overall"]["delta"]["requests"] == 6
    assert sorted(c["name"] for c in run["children"]) == ["decode-0", "decode-1", "redis", "vllm-router"]
    assert_stopped(run)
    assert "| metric | vllm-router:cache_aware |" in table


PEERS = ["--peer", "vllm-router:round_robin"] if find_vllm_router(python=sys.executable) else []


def test_the_overhead_sweep_runs_direct_and_the_router_on_one_engine(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [
        "bench", "--overhead-sweep", "1,4", "--sweep-requests", "8", "--sweep-probe-pairs", "6",
        "--policy", "round-robin", "--no-plots", "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "overhead.json").read_text())
    labels = ["direct", "round-robin"]
    levels = [r for r in doc["rows"] if not r.get("probe")]
    expected = [(label, c) for label in labels for c in (1, 4)]
    assert [(r["label"], r["concurrency"]) for r in levels] == expected
    # The C = 1 probe: the gateway only, 6 pairs alternating with the engine, none failed.
    (probed,) = [r for r in doc["rows"] if r.get("probe")]
    assert (probed["label"], probed["pairs"], probed["errors"]) == ("round-robin", 6, 0)
    assert probed["direct_ttft_p50_ms"] > 0 and probed["gateway_ttft_p50_ms"] > 0
    assert doc["probe"]["round-robin"]["added_ttft_p50_ms"]["n"] == 1
    assert "| round-robin | " in result.stdout and "raw-socket client" in result.stdout
    for row in levels:
        assert row["ok"] == row["requests"] == 8 and row["errors"] == 0, row
        assert row["ttft_p50_ms"] > 0 and row["requests_per_s"] > 0
        if row["label"] == "direct":
            assert row["gateway_cpu_s"] is None and row["gateway_cpu_s_per_1000"] is None, row
        else:
            assert row["gateway_cpu_s"] >= 0 and row["gateway_cpu_s_per_1000"] >= 0, row
    for label in labels[1:]:
        for c in (1, 4):
            added = doc["levels"][label][str(c)]["added_ttft_p50_ms"]
            assert added["n"] == 1 and added["mean"] is not None
        assert doc["sustained"][label]["concurrency"] in (1, 4)
        assert doc["levels"][label]["1"]["gateway_cpu_s_per_1000"]["n"] == 1
    assert "| round-robin: gateway CPU s per 1,000 req |" in result.stdout
    assert (
        "| concurrency | direct TTFT p50 / p99 (ms) | round-robin: added TTFT p50 / p99 (ms)" in result.stdout
    )


def test_the_capacity_profile_finds_the_highest_rate_one_engine_serves_within_the_slo(tmp_path: Path) -> None:
    """4,000-token prompts: one simulated H100 engine prefills about 6 a second, so 1 req/s is served
    within a 3 s TTFT objective and 60 req/s (ten times its capacity) is not."""
    result = CliRunner().invoke(cli, [
        "bench", "--direct", "--capacity-profile", "1,60", "--capacity-seconds", "3", "--workload", "ramp",
        "--param", "prompt_tokens=4000", "--param", "output_tokens=8", "--time-scale", "10",
        "--slo-ttft-ms", "3000", "--slo-tpot-ms", "1000", "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "capacity.json").read_text())
    assert [(r["label"], r["rate"]) for r in doc["rows"]] == [("direct", 1.0), ("direct", 60.0)]
    slow, fast = doc["rows"]
    assert slow["ok"] == slow["requests"] >= 1 and slow["attainment"] == 1.0
    assert fast["requests"] > 100 and fast["attainment"] < 0.5
    assert doc["capacity"] == {"direct": 1.0} and slow["wall_rps"] == 10.0
    assert "`--oracle prefill=10 --oracle decode=10`" in (tmp_path / "capacity.md").read_text()


@pytest.mark.skipif(not PEERS, reason="vllm-router is not installed (the bench extra)")
def test_the_peer_in_pd_mode_sends_prefill_then_decode_through_the_sims_kv_pool(tmp_path: Path) -> None:
    doc, _ = run_bench(tmp_path, "--peer", "vllm-router:round_robin", "--pd")
    (run,) = doc["runs"]
    assert run["requests"]["ok"] == 6, run["requests"]
    assert sorted(c["role"] for c in run["children"]) == ["decode", "decode", "kvpool", "prefill", "router"]
    prefill, *decode = run["load"]["requests_per_engine"].values()
    assert prefill == 6 and sum(decode) == 6, "every request: a prefill on P, then a decode on a D"
    assert run["engines"]["overall"]["delta"]["external_hits"] > 0, (
        "decode loaded the prefill's KV from Redis"
    )


PYTHON = shlex.quote(sys.executable)
FORWARD = f"{PYTHON} {shlex.quote(str(Path(__file__).with_name('forward_router.py')))}"


def test_a_command_peer_runs_in_front_of_the_same_engines_with_its_placeholders_filled(
    tmp_path: Path,
) -> None:
    command = f"fwd={FORWARD} --host {{host}} --port {{port}} --model {{model}} {{decode_urls_space}}"
    doc, table = run_bench(tmp_path, "--peer-command", command, "--direct")
    assert [r["label"] for r in doc["runs"]] == ["fwd", "direct"]
    run = doc["runs"][0]
    assert run["target"] == {
        "kind": "command",
        "policy": None,
        "command": command.partition("=")[2],
        "replicas": 1,
    }
    assert run["requests"]["ok"] == 6 and run["requests"]["errors"] == 0, run["requests"]
    assert list(run["load"]["requests_per_engine"].values()) == [3, 3], "both engines, in turn"
    assert sorted(c["name"] for c in run["children"]) == ["decode-0", "decode-1", "peer-fwd", "redis"]
    assert run["gateway"]["requests_sent"] == 6 and run["gateway"]["cpu_s_per_1000"] >= 0, run["gateway"]
    assert_stopped(run)
    assert "| metric | fwd | direct |" in table
    assert (tmp_path / "requests-fwd.jsonl").exists()
    assert (tmp_path / "runs" / "fwd" / "logs" / "peer-fwd.log").exists()


def test_a_command_peer_runs_in_the_overhead_sweep(tmp_path: Path) -> None:
    sim = (
        f"sim={PYTHON} -m tandem.cli sim --host {{host}} --port {{port}} --served-model-name {{model}} "
        "--time-scale 1000 --log-level warning"
    )
    result = CliRunner().invoke(cli, [
        "bench", "--overhead-sweep", "2", "--sweep-requests", "6", "--sweep-probe-pairs", "0",
        "--peer-command", sim, "--no-plots", "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "overhead.json").read_text())
    assert [(r["label"], r["ok"], r["errors"]) for r in doc["rows"]] == [("direct", 6, 0), ("sim", 6, 0)]
    assert doc["rows"][1]["gateway_cpu_s_per_1000"] >= 0 and doc["rows"][0]["gateway_cpu_s_per_1000"] is None
    assert "| sim: gateway CPU s per 1,000 req |" in result.stdout


def test_a_command_peer_that_exits_at_start_is_reported_with_exit_code_1(tmp_path: Path) -> None:
    command = f"bad={PYTHON} -c 'import sys; sys.exit(3)' {{port}}"
    result = CliRunner().invoke(cli, ["bench", "--peer-command", command, *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "peer-bad exited with code 3 while starting" in result.stderr
    (run,) = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert run["requests"]["total"] == 0 and "peer-bad exited with code 3" in run["notes"][0]


FLOOD = ["--workload", "flood", "--isolation", "--engines", "2", "--engine-arg=--max-num-seqs=2",
         "--time-scale", "10", "--param", "duration=3", "--param", "heavy_streams=8",
         "--param", "light_rate=2", "--request-timeout", "60"]  # fmt: skip


def test_isolation_runs_the_light_tenant_alone_then_the_flood_on_fresh_engines_per_repeat(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        cli, ["bench", "--policy", "tandem", *FLOOD, "--repeat", "2", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "bench.json").read_text())
    isolation = doc["isolation"]
    assert isolation["spec"] == {"heavy": "heavy", "light": "light", "window_s": 3.0}
    assert doc["settings"]["isolation"] == isolation["spec"]
    assert [(r["label"], r["repeat"], r["phase"]) for r in doc["runs"]] == [
        ("tandem", 0, "flood"),
        ("tandem", 1, "flood"),
    ]
    assert [(r["repeat"], r["phase"]) for r in isolation["alone_runs"]] == [(0, "alone"), (1, "alone")]
    for alone, flood, row in zip(isolation["alone_runs"], doc["runs"], isolation["runs"], strict=True):
        assert list(alone["fairness"]["tenants"]) == ["light"], "alone: the light tenant only"
        assert list(flood["fairness"]["tenants"]) == ["heavy", "light"]
        assert alone["engines"]["overall"]["delta"]["requests"] == alone["requests"]["ok"], "fresh engines"
        assert flood["requests"]["closed_loop_unsent"] > 0, "the heavy loop stopped at the end, not dry"
        light = flood["fairness"]["tenants"]["light"]["requests"]
        assert row["light_requests"] == light == alone["requests"]["total"], "the same light requests"
        assert 0 <= row["light_ok"] + row["light_429"] <= light and row["light_alone_ok"] > 0
        assert row["isolation_ratio_p90"] > 0 and row["isolation_ratio_p50"] > 0
        assert row["heavy_requests_per_s"] is not None and row["heavy_output_tokens_per_s"] > 0
        assert isinstance(row["heavy_429"], int) and "service_gap_backlogged" in row
        assert row["heavy_unsent"] == flood["requests"]["closed_loop_unsent"]
        for run in (alone, flood):
            assert_stopped(run)
    assert isolation["aggregate"]["tandem"]["isolation_ratio_p90"]["n"] == 2
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("| isolation ratio: light TTFT p90")]
    assert re.fullmatch(r"\| [^|]+ \| [0-9.]+ \([0-9.]+–[0-9.]+\) \|", line), "median (min–max) of 2"
    rows = ("light 429s", "light other errors", "heavy 429s", "heavy other errors", "heavy completed req/s",
            "light ok under flood", "heavy not sent (loop ended)", "light share while both backlogged",
            "service gap while both backlogged (VTC units)")  # fmt: skip
    for row in rows:
        assert f"| {row} | " in result.stdout
    assert {p.name for p in tmp_path.glob("requests-*.jsonl")} == {
        "requests-tandem.jsonl", "requests-tandem-r1.jsonl", "requests-tandem-alone.jsonl",
        "requests-tandem-alone-r1.jsonl",
    }  # fmt: skip
    assert (tmp_path / "service-over-time.png").stat().st_size > 0
    assert (tmp_path / "isolation.png").stat().st_size > 0


def test_a_variants_own_arguments_reach_its_gateway_and_no_other(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [
        "bench", "--policy", "round-robin", "--variant", "bad=round-robin --fairness=nope", *TINY,
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 1, result.output
    good, bad = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert good["label"] == "round-robin" and good["requests"]["ok"] == 6, (
        "the policy's gateway has no such flag"
    )
    assert bad["target"] == {
        "kind": "tandem",
        "policy": "round-robin",
        "router_args": ["--fairness=nope"],
        "replicas": 1,
    }
    assert bad["requests"]["total"] == 0 and "router exited with code 2 while starting" in bad["notes"][0]


def test_gateway_replicas_share_the_flood_and_their_fair_queue_counters_while_direct_runs_once(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(cli, [
        "bench", "--policy", "tandem", "--direct", "--gateway-replicas", "2",
        "--router-arg=--counter-sync-interval=0.02", *FLOOD, "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["settings"]["gateway_replicas"] == {"tandem": 2}
    tandem = [r for r in (*doc["isolation"]["alone_runs"], *doc["runs"]) if r["label"] == "tandem"]
    assert [r["phase"] for r in tandem] == ["alone", "flood"], "isolation: both phases through the replicas"
    for run in tandem:
        assert run["target"] == {"kind": "tandem", "policy": "tandem", "replicas": 2}
        routers = sorted(c["name"] for c in run["children"] if c["role"] == "router")
        assert routers == ["router-0", "router-1"]
        first, second = run["gateway_replicas"]
        assert first["url"] != second["url"]
        assert first["requests"] > 0 and second["requests"] > 0, "the spread reached both replicas"
        assert first["requests"] + second["requests"] == run["requests"]["sent"]
        assert first["counter_syncs_ok"] > 0 and second["counter_syncs_ok"] > 0, "they shared counters"
        assert run["gateway"]["cpu_s_per_1000"] is not None and run["gateway"]["cpu_s"] >= 0
        assert_stopped(run)
    flood = tandem[1]
    logs = tmp_path / "runs" / "flood" / "tandem" / "logs"
    for index, name in enumerate(("router-0.log", "router-1.log")):
        lines = [json.loads(x) for x in (logs / name).read_text().splitlines() if x.startswith("{")]
        served = [(e["request_id"], e["tenant"]) for e in lines if e["msg"] == "request" and "tenant" in e]
        numbers = {int(request_id.removeprefix("bench-tandem-")) for request_id, _ in served}
        assert numbers and {i % 2 for i in numbers} == {index}, f"{name}: request i goes to replica i mod 2"
        assert {tenant for _, tenant in served} == {"heavy", "light"}, f"{name}: both tenants reached it"
    assert flood["requests"]["sent"] == sum(r["requests"] for r in flood["gateway_replicas"])
    (direct,) = [r for r in doc["runs"] if r["label"] == "direct"]
    assert direct["target"] == {"kind": "direct", "policy": None} and direct["gateway_replicas"] == []
    assert not [c for c in direct["children"] if c["role"] == "router"], "direct has no gateway"
    assert "- gateway replicas: tandem: 2 replicas" in result.stdout
    assert re.search(r"\| requests per gateway replica \| \d+ / \d+ \| – \|", result.stdout)
    assert re.search(r"\| gateway replicas \| 2 \| – \|", result.stdout)


def test_a_restarted_start_warms_the_engines_through_one_gateway_and_measures_a_fresh_one(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(cli, [
        "bench", "--policy", "round-robin", "--start", "restarted", "--warmup", "3",
        "--engine-arg=--max-num-seqs=4", *TINY, "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "bench.json").read_text())
    (run,) = doc["runs"]
    assert run["label"] == "round-robin@restarted" and run["target"]["start"] == "restarted"
    assert run["requests"]["ok"] == 6
    assert run["engines"]["overall"]["delta"]["requests"] == 6, "the warm-up is not measured"
    # Under the results: the least TTFT any router reaches on these engines, from a cold start and
    # after the 3 warm-up requests (their system prompts then count as computed).
    floor = doc["settings"]["ttft_floor"]
    assert floor["warmup"] == 3 and floor["cold"]["p50"] > 0
    assert floor["warm"]["p50"] < floor["cold"]["p50"], "the warmed-up system prompts are computed"
    assert "## The least TTFT any router could give these requests" in result.stdout
    assert "| after the 3 warm-up requests (restarted, warm) |" in result.stdout
    logs = tmp_path / "runs" / "round-robin@restarted" / "logs"
    warmup = [
        json.loads(x) for x in (logs / "router.warmup.log").read_text().splitlines() if x.startswith("{")
    ]
    fresh = [json.loads(x) for x in (logs / "router.log").read_text().splitlines() if x.startswith("{")]
    assert len([e for e in warmup if e["msg"] == "request"]) == 3, (
        "the warm-up went through the first gateway"
    )
    assert len([e for e in fresh if e["msg"] == "request"]) == 6, "the run through a fresh one"
    # Both gateways got the run's salt key, so the fresh one salts tenants' prompts as the first did
    # and reuses what it left in the engines (a gateway without one draws its own and says so).
    for log in (warmup, fresh):
        assert [e for e in log if e["msg"] == "router ready"], "the gateway did not start"
        assert not [e for e in log if "TANDEM_CACHE_KEY is not set" in e["msg"]]
    # Nothing declared by default: the engines got --max-num-seqs, the gateway's spec did not.
    config = (tmp_path / "runs" / "round-robin@restarted" / "router.yaml").read_text()
    assert "--max-num-seqs" not in config
    engine_argv = next(c["argv"] for c in run["children"] if c["role"] == "decode")
    assert "--max-num-seqs" in " ".join(engine_argv)
