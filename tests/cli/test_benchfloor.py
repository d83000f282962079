"""The TTFT floor `tandem bench` prints under a harness run (`tandem.cli.benchfloor`). Pure: a
workload, the pool's settings and the simulator's time model; no server."""

from __future__ import annotations

import pytest

from tandem.bench.harness import PoolSettings
from tandem.bench.workloads import BenchRequest, Workload
from tandem.cli.benchfloor import bench_floor, floor_markdown, prompt_ids
from tandem.sim.engine.floor import least_ttfts
from tandem.sim.engine.profiles import get_profile

SYSTEM = "policy " * 1500  # about 3,000 tokens


def chats(offsets: list[float], **fields: object) -> Workload:
    requests = tuple(
        BenchRequest(offset_s=t, tenant="default", max_tokens=4, messages=(
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}))
        for i, t in enumerate(offsets)
    )  # fmt: skip
    return Workload(name="chats", requests=requests, **fields)  # type: ignore[arg-type]


def test_the_floor_is_the_simulators_per_start_in_engine_ms() -> None:
    workload = chats([0.0, 0.02, 1.0, 2.0])
    floor = bench_floor(workload, PoolSettings(), starts=["cold", "warm"])
    assert floor is not None and floor["warmup"] == 16
    expected = least_ttfts(prompt_ids(workload), get_profile("qwen2.5-7b-h100"),
                           arrivals=[0.0, 0.02, 1.0, 2.0])  # fmt: skip
    assert floor["cold"]["max"] == pytest.approx(max(expected) * 1000)
    assert floor["cold"]["max"] > 50 > floor["warm"]["max"], "every prompt was warmed up: no prefill"
    assert "warm" not in (bench_floor(workload, PoolSettings(), starts=["cold"]) or {})


def test_the_engines_step_budget_is_read_from_their_arguments() -> None:
    workload = chats([0.0])
    whole = bench_floor(workload, PoolSettings(), starts=["cold"])
    chunked = bench_floor(
        workload, PoolSettings(engine_args=("--max-num-batched-tokens=512",)), starts=["cold"]
    )
    assert whole is not None and chunked is not None
    assert chunked["cold"]["max"] > whole["cold"]["max"], "six steps of 512 tokens cost more than one"


def test_a_closed_loop_workload_has_no_floor_and_the_markdown_says_nothing() -> None:
    assert bench_floor(chats([0.0], closed_loop={"heavy": 10.0}), PoolSettings(), starts=["cold"]) is None
    assert floor_markdown(None) == ""
    text = floor_markdown(bench_floor(chats([0.0, 1.0]), PoolSettings(warmup_requests=1), starts=["warm"]))
    assert "| start | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |" in text
    assert "| cold | " in text and "| after the 1 warm-up requests (restarted, warm) | " in text
