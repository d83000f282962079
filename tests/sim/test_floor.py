"""The least TTFT a workload's requests could have on a simulated engine (`tandem.sim.engine.floor`)
and `tandem dev ttft-floor`. Pure: token ids and the time model; the command through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.cli.main import cli
from tandem.sim.engine.floor import least_ttfts, prefill_seconds
from tandem.sim.engine.profiles import get_profile
from tandem.sim.engine.timemodel import BatchShape, step_time

H100 = get_profile("qwen2.5-7b-h100")
SYSTEM = list(range(1, 2049))  # 2,048 tokens: 128 full blocks of 16


def one_step(new: int, context: int) -> float:
    return step_time(H100, BatchShape(num_seqs=1, new_tokens=new, context_tokens=context)).total_s


def test_a_prompt_seen_first_costs_its_whole_prefill_and_again_only_its_last_block() -> None:
    first, again = least_ttfts([SYSTEM, SYSTEM], H100)
    assert first == pytest.approx(0.06495, abs=1e-4), "timemodel's worked example: 64.95 ms"
    # Fully cached, the last token is computed, and with it its whole block: a hit covers at most
    # (2,048 - 1) // 16 = 127 blocks, as in vLLM and the simulator (`blocks.py`).
    assert again == pytest.approx(one_step(16, 2048))


def test_only_whole_blocks_of_a_shared_start_count_and_warm_up_prompts_count_too() -> None:
    question = list(range(50_000, 50_100))
    other = list(range(60_000, 60_100))
    floors = least_ttfts([SYSTEM + question, SYSTEM + other, SYSTEM[:-8] + other], H100)
    assert floors[1] == pytest.approx(one_step(100, 2148)), "its system prompt was computed: 100 new tokens"
    # The third shares 2,040 tokens: 127 whole blocks (2,032 tokens); the 8 tokens of block 128 are new.
    assert floors[2] == pytest.approx(one_step(2140 - 2032, 2140))
    (warmed,) = least_ttfts([SYSTEM + other], H100, warm=[SYSTEM + question])
    assert warmed == pytest.approx(floors[1])
    with pytest.raises(ValueError, match="block_size"):
        least_ttfts([SYSTEM], H100, block_size=0)


def test_a_request_that_arrives_while_its_prefix_is_computed_waits_for_it_or_computes_it_itself() -> None:
    question = list(range(50_000, 50_100))
    first, soon, late = least_ttfts([SYSTEM, SYSTEM + question, SYSTEM + question[:50]], H100,
                                    arrivals=[0.0, 0.020, 1.0])  # fmt: skip
    assert first == pytest.approx(0.06495, abs=1e-4)
    # 20 ms in, the system prompt's KV exists at 64.95 ms at the earliest: wait 44.95 ms, then the
    # 100-token question (block 129's 4 tokens before it were not a whole block of the prompt).
    assert soon == pytest.approx(first - 0.020 + one_step(2148 - 2048, 2148))
    assert late == pytest.approx(one_step(2098 - 2048, 2098)), "a second later it is long done"
    apart = least_ttfts([SYSTEM, SYSTEM + question], H100)
    assert apart[1] == pytest.approx(one_step(100, 2148)), "without arrival times: far apart"
    with pytest.raises(ValueError, match="2 arrival times for 3 prompts"):
        least_ttfts([SYSTEM, SYSTEM, SYSTEM], H100, arrivals=[0.0, 1.0])


def test_a_shared_prefix_is_ready_at_the_end_of_the_step_that_computes_it_not_of_the_prompt() -> None:
    long_prompt = list(range(1, 8193))  # 8,192 tokens: two 4,096-token steps with a budget of 4,096
    first_step = one_step(4096, 4096)
    sibling = long_prompt[:4096] + [7] * 16  # shares the first step's 256 blocks
    floors = least_ttfts([long_prompt, sibling], H100, max_num_batched_tokens=4096,
                         arrivals=[0.0, first_step - 0.010])  # fmt: skip
    assert floors[0] == pytest.approx(first_step + one_step(4096, 8192))
    assert floors[1] == pytest.approx(0.010 + one_step(16, 4112)), "ready after the first step"


def test_blocks_a_later_request_computes_sooner_are_ready_at_its_time() -> None:
    question = list(range(50_000, 50_016))
    # The first prompt arrives last: the second computes the shared system prompt itself at 0 s,
    # and the third (at 0.5 s) finds it ready then, not at the first's 10 s.
    floors = least_ttfts([SYSTEM, SYSTEM + question, SYSTEM + question + [9]], H100,
                         arrivals=[10.0, 0.0, 0.5])  # fmt: skip
    assert floors[1] == pytest.approx(one_step(2064, 2064)), "waiting 10 s is worse: it computes it all"
    assert floors[2] == pytest.approx(one_step(1, 2065))


def test_a_prompt_over_the_step_budget_is_computed_in_several_steps() -> None:
    chunked = prefill_seconds(H100, novel=2048, cached=0, max_num_batched_tokens=512)
    assert chunked == pytest.approx(sum(one_step(512, 512 * (k + 1)) for k in range(4)))
    assert chunked > prefill_seconds(H100, novel=2048, cached=0, max_num_batched_tokens=8192)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        prefill_seconds(H100, novel=1, cached=0, max_num_batched_tokens=0)


def test_the_command_prints_the_floors_percentiles_and_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    system = "policy " * 1500
    lines = [
        {"offset_s": i * 0.1, "max_tokens": 8, "messages": [{"role": "system", "content": system},
                                                            {"role": "user", "content": f"question {i}"}]}
        for i in range(5)
    ]  # fmt: skip
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = CliRunner().invoke(cli, ["dev", "ttft-floor", str(workload), "--top", "1"])
    assert result.exit_code == 0, result.output
    head, largest = result.output.splitlines()
    assert head.startswith("w.jsonl: 5 requests, least TTFT (ms): p50 ") and " p99 " in head
    assert largest.startswith("  request 0 at 0.000 s: "), "the first request computes the system prompt"
    halved = CliRunner().invoke(cli, ["dev", "ttft-floor", str(workload), "--time-scale", "2", "--top", "0"])
    p50 = float(head.split("p50 ")[1].split(",")[0])
    assert float(halved.output.split("p50 ")[1].split(",")[0]) == pytest.approx(p50 / 2, abs=0.06)
    close = tmp_path / "close.jsonl"  # the same five 20 ms apart: the later ones wait for the first
    text = "".join(json.dumps({**line, "offset_s": i * 0.02}) + "\n" for i, line in enumerate(lines))
    close.write_text(text, encoding="utf-8")
    ranked = CliRunner().invoke(cli, ["dev", "ttft-floor", str(close), "--top", "2"]).output.splitlines()
    first_ms = float(ranked[1].split(": ")[1].split(" ms")[0])
    assert ranked[2].startswith("  request 1 at 0.020 s: ")
    assert float(ranked[2].split(": ")[1].split(" ms")[0]) == pytest.approx(first_ms - 20 + 6.6, abs=0.2)
    missing = CliRunner().invoke(cli, ["dev", "ttft-floor", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 1 and "none.jsonl: cannot read" in missing.output
