"""`tandem bench` on the command line: flag errors, workload files, and endpoint mode end to end.

Real: click's in-process runner, the whole bench pipeline (workload → driver over loopback HTTP →
engine /metrics scrape → report files). Faked: the endpoint and its /metrics are
`tests.bench.fake_openai` on a uvicorn server. The harness mode is in test_bench_harness.py.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tests.bench.fake_openai import FakeState, create_app
from tests.servers import run_uvicorn

from tandem.bench.targets import find_vllm_router
from tandem.cli.main import cli

SMALL = ["--param", "groups=2", "--param", "prompts_per_group=2", "--param", "system_prompt_tokens=64",
         "--param", "question_tokens=8", "--param", "output_tokens=3", "--param", "rate=inf",
         "--no-plots"]  # fmt: skip


def bench(*args: str) -> Result:
    return CliRunner().invoke(cli, ["bench", *args])


@pytest.fixture
def endpoint() -> Iterator[str]:
    with run_uvicorn(create_app(FakeState())) as url:
        yield url


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --url (endpoint mode) or --policy/--variant/--peer/--peer-command/--direct (harness"),
        (["--variant", "fcfs=tandem", "--url", "http://127.0.0.1:9/v1"], "not both or neither"),
        (["--variant", "fcfs=nope"], "--variant fcfs: the policy is 'nope'; choose from tandem"),
        (["--variant", "tandem=tandem --fairness=fcfs"], "--variant tandem: the label 'tandem' is taken"),
        (["--url", "http://127.0.0.1:9/v1", "--direct"], "not both or neither"),
        (["--direct", "--engine-metrics", "http://x"], "--engine-metrics is for endpoint mode"),
        (["--policy", "round-robin,nope"], "--policy 'nope': choose from "),
        (["--peer", "sglang:cache_aware"], "--peer 'sglang:cache_aware': the only peer is vllm-router"),
        (["--peer", "vllm-router:kv_aware"], "policy must be one of round_robin, cache_aware"),
        (["--peer", "vllm-router:cache_aware", "--vllm-router", "/nonexistent/vllm-router"],
         "--vllm-router /nonexistent/vllm-router: no such file"),
        (["--peer-command", "p=r --port {port} {colour} {size}"],
         "--peer-command p: unknown placeholder(s) {colour}, {size}; known: {host}, {port}"),
        (["--peer-command", "r --port {port}"], "expected NAME=TEMPLATE"),
        (["--peer-command", "a/b=r --port {port}"], "NAME must be letters, digits and -_."),
        (["--peer-command", "direct=r --port {port}"], "the label 'direct' is taken"),
        (["--peer-command", "p=/nonexistent/router --port {port}"],
         "--peer-command p: '/nonexistent/router' is not an executable file, nor on PATH"),
        (["--url", "http://127.0.0.1:9/v1", "--peer-command", "p=r {port}"], "not both or neither"),
        (["--direct", "--param", "groups=0"], "workload shared-prefix: groups: Input should be greater"),
        (["--direct", "--workload", "two-tenant", "--param", "colour=red"], "colour: unknown parameter"),
        (["--direct", "--workload-file", "w.jsonl", "--param", "groups=2"], "cannot be combined"),
        (["--url", "http://127.0.0.1:9/v1", "--workload", "flood", "--isolation"],
         "--isolation runs in harness mode (it restarts the engines)"),
        (["--direct", "--isolation"], "--isolation needs a workload with a heavy_tenant and a light_tenant"),
        (["--direct", "--workload", "burst", "--isolation"], "(flood, two-tenant); burst has none"),
        (["--direct", "--workload", "flood", "--isolation", "--overhead-sweep", "1"], "are separate modes"),
        (["--policy", "tandem", "--gateway-replicas", "0"],
         "--gateway-replicas '0': expected a whole number from 1 to 64"),
        (["--policy", "tandem", "--gateway-replicas", "two"], "--gateway-replicas 'two': expected a whole"),
        (["--policy", "tandem", "--gateway-replicas", "65"], "--gateway-replicas '65': expected a whole"),
        (["--policy", "tandem", "--gateway-replicas", "-1"], "--gateway-replicas '-1': expected a whole"),
        (["--url", "http://127.0.0.1:9/v1", "--gateway-replicas", "2"],
         "--gateway-replicas starts Tandem's gateway N times, in harness mode: give --policy or --variant"),
        (["--policy", "tandem", "--overhead-sweep", "1", "--gateway-replicas", "2"],
         "the sweep measures one gateway process"),
        (["--url", "http://127.0.0.1:9/v1", "--oracle", "prefill=2"], "--oracle needs --timeline"),
        (["--url", "http://127.0.0.1:9/v1", "--timeline", "http://127.0.0.1:9", "--oracle", "prefill"],
         "--oracle 'prefill': expected POOL=RPS[:START_S[:MIN]]"),
        (["--url", "http://127.0.0.1:9/v1", "--capacity-profile", "2"],
         "--capacity-profile runs in harness mode (a cold run per rate)"),
        (["--direct", "--capacity-profile", "two"], "--capacity-profile: 'two' is not a number"),
        (["--direct", "--capacity-profile", "2,0"], "--capacity-profile: '0' is not a positive finite rate"),
        (["--direct", "--capacity-profile", "inf"], "--capacity-profile: 'inf' is not a positive finite"),
        (["--direct", "--capacity-profile", " , "], "--capacity-profile: give request rates"),
        (["--direct", "--capacity-profile", "2", "--overhead-sweep", "1"], "are separate modes"),
        (["--direct", "--peer", "vllm-router:round_robin", "--gateway-replicas", "2"],
         "--gateway-replicas 2 runs Tandem's gateway as replicas: give --policy or --variant"),
    ],
)  # fmt: skip
def test_bad_flags_end_with_one_line_and_exit_code_2(args: list[str], message: str | None) -> None:
    result = bench(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem: error: ")
    if message is not None:
        assert message in lines[0]


def test_a_missing_vllm_router_binary_is_found_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_vllm_router(python=str(tmp_path / "python")) is None
    beside = tmp_path / "vllm-router"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(beside.stat().st_mode | stat.S_IXUSR)
    assert find_vllm_router(python=str(tmp_path / "python")) == str(beside)


def test_a_dumped_workload_file_drives_an_endpoint_and_the_results_are_written(
    endpoint: str, tmp_path: Path
) -> None:
    path = tmp_path / "w.jsonl"
    dumped = bench("--dump-workload", str(path), *SMALL)
    assert dumped.exit_code == 0, dumped.output
    assert len(path.read_text().splitlines()) == 4
    out = tmp_path / "out"
    result = bench(
        "--url",
        f"{endpoint}/v1",
        "--engine-metrics",
        endpoint,
        "--workload-file",
        str(path),
        "--out",
        str(out),
        "--no-plots",
    )
    assert result.exit_code == 0, result.output
    assert "| metric | endpoint |" in result.stdout
    assert "| requests ok / total | 4 / 4 |" in result.stdout
    assert "[endpoint] running 4 requests" in result.stderr
    doc = json.loads((out / "bench.json").read_text())
    (run,) = doc["runs"]
    assert run["requests"]["ok"] == 4
    assert run["engines"]["overall"]["prefix_hit_rate"] == 0.5, "the fake engine hits half of every prompt"
    assert doc["workload"]["name"] == "file:w.jsonl" and doc["machine"]["nproc"] >= 1
    assert len((out / "requests-endpoint.jsonl").read_text().splitlines()) == 4
    assert (out / "bench.md").read_text().startswith("# tandem bench: file:w.jsonl")


def test_a_run_where_nothing_succeeds_exits_1(endpoint: str, tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"offset_s": 0, "max_tokens": 2, "prompt": "status-500"}\n')
    result = bench(
        "--url", f"{endpoint}/v1", "--workload-file", str(path), "--out", str(tmp_path / "o"), "--no-plots"
    )
    assert result.exit_code == 1
    assert (
        result.stderr.strip().splitlines()[-1].startswith("tandem: error: run endpoint: no request succeeded")
    )
    assert (tmp_path / "o" / "bench.json").exists(), "results are written anyway"


def test_repeated_runs_are_aggregated_as_mean_and_spread_with_plots(endpoint: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = bench("--url", f"{endpoint}/v1", "--repeat", "3", *SMALL[:-1], "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "bench.json").read_text())
    assert [(r["label"], r["repeat"]) for r in doc["runs"]] == [
        ("endpoint", 0),
        ("endpoint", 1),
        ("endpoint", 2),
    ]
    assert doc["aggregate"]["endpoint"]["ok"] == {
        "n": 3,
        "mean": 4.0,
        "sd": 0.0,
        "median": 4.0,
        "min": 4.0,
        "max": 4.0,
    }
    assert doc["aggregate"]["endpoint"]["ttft_p50"]["n"] == 3
    assert "3 runs per target" in result.stdout and "| metric (mean ± sd) | endpoint |" in result.stdout
    assert "| SLO attainment | 100.0% |" in result.stdout, "the fake endpoint answers well within 1 s"
    names = sorted(p.name for p in out.glob("requests-*.jsonl"))
    assert names == ["requests-endpoint-r1.jsonl", "requests-endpoint-r2.jsonl", "requests-endpoint.jsonl"]
    assert (out / "ttft-cdf.png").stat().st_size > 0 and (out / "requests-timeline.png").stat().st_size > 0
