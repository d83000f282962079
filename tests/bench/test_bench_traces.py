"""Trace replay (Azure CSV, Mooncake JSONL) and the shipped synthetic samples.

Real: the parsers, the workload builders, Tandem's tokenizer (prompt lengths and shared prefixes are
measured on token ids), the sample generators and the shipped sample files. Nothing is faked; the
only I/O is reading the package's data files and `tmp_path`.
"""

from __future__ import annotations

import json
import math
import statistics
from importlib import resources
from pathlib import Path

import pytest

from tandem.bench.catalog import make_workload
from tandem.bench.tracegen import AZURE_CONV, MOONCAKE_CONVERSATION, SAMPLE_FILES
from tandem.bench.traces import (
    MooncakeParams,
    TraceParams,
    azure_workload,
    mooncake_workload,
    parse_azure,
    parse_mooncake,
)
from tandem.bench.workloads import WorkloadError
from tandem.core.tokenizer import encode

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:46.9000000,20,3
2023-11-16 18:15:48.1805900,5,1
"""


def mooncake_line(ts: int, length: int, output: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts, "input_length": length, "output_length": output, "hash_ids": ids})


MOONCAKE = "\n".join([
    mooncake_line(1000, 1100, 10, [0, 1, 2]),
    mooncake_line(4000, 1500, 5, [0, 1, 3]),
    mooncake_line(4000, 600, 2, [0, 4]),
    mooncake_line(7000, 1024, 1, [0, 1]),
]) + "\n"  # fmt: skip


def test_azure_rows_become_offsets_from_the_first_row_with_the_traced_lengths() -> None:
    rows = parse_azure(AZURE, name="a.csv")
    assert [round(r.offset_s, 4) for r in rows] == [0.0, 0.2194, 1.5]
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(374, 44), (20, 3), (5, 1)]


def test_an_azure_replay_has_exact_prompt_lengths_and_speed_divides_time() -> None:
    w = azure_workload(TraceParams(speed=2.0), seed=0, text=AZURE, name="a.csv")
    assert [len(encode(r.prompt or "")) for r in w.requests] == [374, 20, 5]
    assert [r.max_tokens for r in w.requests] == [44, 3, 1]
    assert w.requests[2].offset_s == pytest.approx(0.75)
    scaled = azure_workload(TraceParams(length_scale=0.5, max_input_tokens=100), seed=0, text=AZURE, name="a")
    assert [len(encode(r.prompt or "")) for r in scaled.requests] == [100, 10, 2]


H = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize(("text", "message"), [
    ("time,in,out\n", "a.csv:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens"),
    (H, "a.csv: no requests"),
    (H + "yesterday,1,1\n", "a.csv:2: TIMESTAMP: expected YYYY-MM-DD"),
    (H + "2023-11-16 18:15:46,x,1\n", "a.csv:2: ContextTokens: expected an integer"),
    (H + "2023-11-16 18:15:46,5,0\n", "a.csv:2: GeneratedTokens: must be >= 1"),
    (H + "2023-11-16 18:15:46,5\n", "a.csv:2: expected 3 columns, got 2"),
])  # fmt: skip
def test_bad_azure_lines_name_the_line_and_the_field(text: str, message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        parse_azure(text, name="a.csv")
    assert str(err.value).startswith(message)


def test_mooncake_prompts_share_a_prefix_exactly_where_their_hash_ids_do() -> None:
    w = mooncake_workload(MooncakeParams(length_scale=0.125), seed=0, text=MOONCAKE, name="m.jsonl")
    assert w.params["block_tokens"] == 64
    ids = [encode(r.prompt or "") for r in w.requests]
    assert [len(i) for i in ids] == [138, 188, 75, 128]  # round(length × 64 / 512)

    def common(a: list[int], b: list[int]) -> int:
        return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    # rows in arrival order: [0,1,2] 1100, [0,1,3] 1500, [0,4] 600, [0,1] 1024
    assert common(ids[0], ids[1]) >= 128 and ids[0][:128] == ids[1][:128]  # blocks 0 and 1
    assert ids[0][128:138] != ids[1][128:138]  # block 2 vs block 3
    assert ids[0][:64] == ids[2][:64] and ids[0][64:75] != ids[2][64:75]  # block 0 only
    assert ids[3] == ids[0][:128]  # exactly blocks 0 and 1
    assert [r.offset_s for r in w.requests] == [0.0, 3.0, 3.0, 6.0]
    assert [r.max_tokens for r in w.requests] == [1, 1, 1, 1]  # 10, 5, 2, 1 × 0.125, at least 1


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "m:1: invalid JSON"),
    ('[1, 2]', "m:1: expected a JSON object"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "m:1: hash_ids: missing"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [0]}', "m:1: timestamp: expected"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}',
     "m:1: input_length: must be >= 1"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}',
     "m:1: hash_ids: 1 ids for input_length 600 (expected ceil(600/512) = 2)"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}',
     "m:1: hash_ids: expected a list"),
])  # fmt: skip
def test_bad_mooncake_lines_name_the_line_and_the_field(line: str, message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        parse_mooncake(line + "\n", name="m")
    assert str(err.value).startswith(message)


def test_a_trace_file_is_read_from_the_file_parameter_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(MOONCAKE)
    w = make_workload("mooncake-trace", {"file": str(path), "length_scale": "0.125"}, seed=0)
    assert len(w.requests) == 4 and w.params["trace"] == "trace.jsonl"
    with pytest.raises(WorkloadError, match="cannot read"):
        make_workload("azure-trace", {"file": str(tmp_path / "nope.csv")}, seed=0)


@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
def test_the_shipped_samples_are_exactly_what_the_generators_make(name: str) -> None:
    shipped = resources.files("tandem.bench.data").joinpath(name).read_text(encoding="utf-8")
    assert shipped == SAMPLE_FILES[name]()
    assert len(shipped.encode()) < 200_000


def test_the_azure_sample_has_the_source_traces_statistics() -> None:
    rows = parse_azure(
        resources.files("tandem.bench.data").joinpath("azure-conv-sample.csv").read_text(), name="s"
    )
    rate = len(rows) / rows[-1].offset_s
    assert rate == pytest.approx(AZURE_CONV.rate, rel=0.15)
    logs = [math.log(r.input_tokens) for r in rows]
    assert statistics.mean(logs) == pytest.approx(AZURE_CONV.inputs.mu, abs=0.15)
    assert statistics.median(r.output_tokens for r in rows) == pytest.approx(
        math.exp(AZURE_CONV.outputs.mu), rel=0.2
    )


def test_the_mooncake_sample_has_the_source_traces_statistics_and_prefix_reuse() -> None:
    rows = parse_mooncake(
        resources.files("tandem.bench.data").joinpath("mooncake-conversation-sample.jsonl").read_text(),
        name="s",
    )
    assert all(r.hash_ids[0] == 0 for r in rows)
    assert statistics.median(r.input_tokens for r in rows) == pytest.approx(6909, rel=0.2)
    assert len(rows) / rows[-1].offset_s == pytest.approx(MOONCAKE_CONVERSATION.rate, rel=0.25)
    seen: set[int] = set()
    reused = total = 0
    for r in rows:
        lead = next((k for k, h in enumerate(r.hash_ids) if h not in seen), len(r.hash_ids))
        reused, total = reused + lead, total + len(r.hash_ids)
        seen.update(r.hash_ids)
    assert reused / total == pytest.approx(0.366, abs=0.05)  # the source trace's ideal prefix reuse
