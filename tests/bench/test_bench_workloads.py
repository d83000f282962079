"""Workload generators and the workload file format.

Real: the generators, Tandem's tokenizer (token counts are measured with `encode`), the JSONL
parser. Nothing is faked; no I/O except `tmp_path` files.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path

import pytest

from tandem.bench.catalog import make_workload, parse_overrides
from tandem.bench.text import words
from tandem.bench.workload_file import dump_jsonl, load, parse_jsonl
from tandem.bench.workloads import (
    SharedPrefixParams,
    TwoTenantParams,
    WorkloadError,
    bounded,
    poisson_offsets,
    shared_prefix,
    two_tenant,
)
from tandem.core.tokenizer import encode, render_chat

SMALL = SharedPrefixParams(groups=4, prompts_per_group=5, system_prompt_tokens=300, question_tokens=40)


@pytest.mark.parametrize("n_tokens", [0, 1, 2, 3, 7, 16, 129, 2048])
def test_filler_text_has_exactly_the_requested_token_count(n_tokens: int) -> None:
    for seed in range(5):
        assert len(encode(words(random.Random(seed), n_tokens))) == n_tokens


def test_the_same_seed_gives_the_same_workload_and_another_seed_a_different_one() -> None:
    assert shared_prefix(SMALL, seed=7) == shared_prefix(SMALL, seed=7)
    assert shared_prefix(SMALL, seed=7).requests != shared_prefix(SMALL, seed=8).requests
    assert two_tenant(TwoTenantParams(duration=5), seed=3) == two_tenant(TwoTenantParams(duration=5), seed=3)


def test_shared_prefix_has_groups_of_prompts_sharing_one_system_prompt_each() -> None:
    workload = shared_prefix(SMALL, seed=1)
    assert len(workload.requests) == 4 * 5
    by_group: dict[str, set[str]] = {}
    questions = set()
    for request in workload.requests:
        assert request.messages is not None
        system, user = request.messages
        assert (system["role"], user["role"]) == ("system", "user")
        assert len(encode(system["content"])) == 300
        assert len(encode(user["content"])) == 40
        assert request.max_tokens == SMALL.output_tokens
        by_group.setdefault(str(request.group), set()).add(system["content"])
        questions.add(user["content"])
    assert sorted(by_group) == ["g0", "g1", "g2", "g3"]
    assert all(len(systems) == 1 for systems in by_group.values())
    assert len({next(iter(s)) for s in by_group.values()}) == 4, "each group has its own system prompt"
    assert len(questions) == 20, "every question is distinct"


def test_shared_prefix_requests_are_shuffled_across_groups() -> None:
    groups = [r.group for r in shared_prefix(SMALL, seed=1).requests]
    runs = sum(1 for a, b in itertools.pairwise(groups) if a != b)
    assert runs > 4, f"requests came group by group: {groups}"


def test_a_chat_prompt_is_the_system_and_question_tokens_plus_the_template() -> None:
    request = shared_prefix(SMALL, seed=1).requests[0]
    assert request.messages is not None
    overhead = len(encode(render_chat([{"role": "system", "content": ""}, {"role": "user", "content": ""}])))
    assert len(encode(render_chat(request.messages))) == 300 + 40 + overhead


def test_completions_api_puts_system_prompt_and_question_in_one_prompt() -> None:
    workload = shared_prefix(SMALL.model_copy(update={"api": "completions"}), seed=1)
    request = workload.requests[0]
    assert request.api == "completions" and request.messages is None
    assert request.prompt is not None and len(encode(request.prompt)) == 300 + 1 + 40  # "\n\n" is one token


@pytest.mark.parametrize(
    ("rate", "expect_all_zero"),
    [(math.inf, True), (4.0, False)],
)
def test_arrivals_start_at_zero_and_never_go_back(rate: float, expect_all_zero: bool) -> None:
    offsets = poisson_offsets(random.Random(0), rate=rate, count=200)
    assert offsets[0] == 0.0
    assert offsets == sorted(offsets)
    assert (max(offsets) == 0.0) == expect_all_zero


def test_poisson_arrivals_average_the_rate() -> None:
    offsets = poisson_offsets(random.Random(0), rate=4.0, count=2001)
    assert 2000 / offsets[-1] == pytest.approx(4.0, rel=0.1)


def test_two_tenants_have_their_own_rates_lengths_and_header_value() -> None:
    params = TwoTenantParams(
        duration=60, heavy_rate=8, light_rate=1, heavy_prompt_tokens=500, light_prompt_tokens=50
    )
    workload = two_tenant(params, seed=0)
    counts = Counter(r.tenant for r in workload.requests)
    assert counts["heavy"] / 60 == pytest.approx(8, rel=0.2)
    assert counts["light"] / 60 == pytest.approx(1, rel=0.4)
    assert workload.tenants == ("heavy", "light")
    assert [r.offset_s for r in workload.requests] == sorted(r.offset_s for r in workload.requests)
    assert all(r.offset_s < 60 for r in workload.requests)
    for request in workload.requests:
        assert request.messages is not None
        size = len(encode(request.messages[-1]["content"]))
        assert size == (500 if request.tenant == "heavy" else 50)


@pytest.mark.parametrize(
    ("name", "pairs", "message"),
    [
        ("nope", [], "unknown workload 'nope'; choose from shared-prefix, two-tenant"),
        ("shared-prefix", ["groupz=3"], "groupz: unknown parameter"),
        ("shared-prefix", ["groups=0"], "groups: Input should be greater than or equal to 1"),
        ("shared-prefix", ["rate=fast"], "rate: Input should be a valid number"),
        ("two-tenant", ["light_tenant=heavy"], "heavy_tenant and light_tenant must differ"),
    ],
)
def test_bad_workload_names_and_parameters_are_named_in_the_error(
    name: str, pairs: list[str], message: str
) -> None:
    with pytest.raises(WorkloadError, match=message):
        make_workload(name, parse_overrides(pairs), seed=0)


def test_overrides_accept_dashes_and_coerce_strings() -> None:
    workload = make_workload(
        "shared-prefix", parse_overrides(["prompts-per-group=2", "groups=3", "rate=inf"]), seed=0
    )
    assert len(workload.requests) == 6
    assert workload.params["rate"] == math.inf
    with pytest.raises(WorkloadError, match="expected key=value"):
        parse_overrides(["groups"])


def test_bounds_keep_the_first_requests_arriving_before_the_duration() -> None:
    workload = make_workload("shared-prefix", {"rate": "10"}, seed=0)
    assert len(bounded(workload, requests=5, duration_s=None).requests) == 5
    early = bounded(workload, requests=None, duration_s=2.0).requests
    assert early and all(r.offset_s < 2.0 for r in early)
    assert early == workload.requests[: len(early)]


def test_a_workload_file_round_trips_and_is_sorted_by_offset(tmp_path: Path) -> None:
    workload = make_workload("shared-prefix", {"groups": "3", "rate": "5", "api": "completions"}, seed=2)
    path = tmp_path / "w.jsonl"
    path.write_text(dump_jsonl(workload))
    loaded = load(path)
    assert loaded.requests == workload.requests
    assert loaded.name == "file:w.jsonl"
    shuffled = "\n".join(reversed(dump_jsonl(workload).splitlines()))
    assert parse_jsonl(shuffled, name="x").requests == workload.requests
    tenants = make_workload("two-tenant", {"duration": "3"}, seed=2)
    assert parse_jsonl(dump_jsonl(tenants), name="t").requests == tenants.requests


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"offset_s": 0, "max_tokens": 4}', "f:2: exactly one of prompt and messages is required"),
        ('{"offset_s": 0, "max_tokens": 4, "prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
         "f:2: exactly one of prompt and messages is required"),
        ('{"offset_s": -1, "max_tokens": 4, "prompt": "a"}', "f:2: offset_s: Input should be greater"),
        ('{"offset_s": 0, "max_tokens": 0, "prompt": "a"}', "f:2: max_tokens: Input should be greater"),
        ('{"offset_s": 0, "max_tokens": 4, "prompt": "a", "tenantt": "x"}', "f:2: tenantt: Extra inputs"),
        ('{"offset_s": 0, "max_tokens": 4, "messages": [{"role": "robot", "content": ""}]}', "f:2: messages"),
        ("not json", "f:2: Invalid JSON"),
    ],
)  # fmt: skip
def test_a_bad_workload_file_line_is_named_with_its_number(line: str, message: str) -> None:
    good = '{"offset_s": 0, "max_tokens": 4, "prompt": "hello"}'
    with pytest.raises(WorkloadError, match=message):
        parse_jsonl(f"{good}\n{line}\n", name="f")


def test_an_empty_or_missing_workload_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no requests"):
        parse_jsonl("\n\n", name="f")
    with pytest.raises(WorkloadError, match="cannot read"):
        load(tmp_path / "absent.jsonl")
