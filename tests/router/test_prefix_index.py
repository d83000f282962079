"""The approximate prefix index as stories: what was routed where, in blocks, bounded per endpoint.

Pure: token ids are made up; keys are `tandem.core.blockhash.block_keys` (real), computed by the
prompt (`RequestView.block_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.router.scheduling_builders import A, B

from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.scheduling.prefix import ApproximatePrefixIndex
from tandem.router.types import RequestView

PROMPT = list(range(1, 1031))  # 64 full blocks of 16, 6 tokens left over


def p(tokens: Sequence[int]) -> RequestView:
    """A prompt of these tokens (it hashes its own block keys)."""
    return RequestView(request_id="r", prompt_token_ids=tuple(tokens))


def test_a_recorded_prompt_matches_in_full_blocks_on_its_endpoint_only() -> None:
    index = ApproximatePrefixIndex()
    index.record(A.url, p(PROMPT))
    assert index.match([A.url, B.url], p(PROMPT)) == {A.url: 1024, B.url: 0}
    assert index.match([A.url], p(PROMPT[:500] + [0] * 530)) == {A.url: 496}  # 31 blocks, then it differs
    assert index.match([A.url], p([0, *PROMPT])) == {A.url: 0}  # a different first block: nothing


def test_it_is_a_prefix_source() -> None:
    source: PrefixSource = ApproximatePrefixIndex()
    assert source.match(["http://x:1"], p(PROMPT)) == {"http://x:1": 0}


def test_eviction_eats_prompts_from_the_end_so_their_start_still_matches() -> None:
    index = ApproximatePrefixIndex()
    index.configure(A.url, block_size=16, capacity_blocks=80)
    index.record(A.url, p(PROMPT))  # 64 blocks
    other = list(range(50_000, 50_000 + 32 * 16))
    index.record(A.url, p(other))  # 32 more: 16 of the first prompt's go, from its end
    assert index.blocks(A.url) == 80
    assert index.match([A.url], p(PROMPT)) == {A.url: 48 * 16}
    assert index.match([A.url], p(other)) == {A.url: 32 * 16}
    assert index.fill(A.url) == 1.0


def test_the_engines_block_size_replaces_the_default_and_empties_the_endpoint() -> None:
    index = ApproximatePrefixIndex(default_block_size=16)
    index.record(A.url, p(PROMPT))
    index.configure(A.url, block_size=16, capacity_blocks=None)  # unchanged: kept
    assert index.blocks(A.url) == 64
    index.configure(A.url, block_size=32, capacity_blocks=None)
    assert (index.blocks(A.url), index.block_size(A.url)) == (0, 32)
    index.record(A.url, p(PROMPT))
    assert index.match([A.url], p(PROMPT)) == {A.url: 1024}
    assert index.blocks(A.url) == 32


def test_a_smaller_capacity_evicts_the_least_recent_blocks() -> None:
    index = ApproximatePrefixIndex()
    index.record(A.url, p(PROMPT))
    index.configure(A.url, block_size=None, capacity_blocks=10)
    assert index.match([A.url], p(PROMPT)) == {A.url: 160}
    assert index.fill(A.url) == 1.0


def test_endpoints_that_left_are_forgotten() -> None:
    index = ApproximatePrefixIndex()
    index.record(A.url, p(PROMPT))
    index.record(B.url, p(PROMPT))
    index.forget([B.url])
    assert (index.blocks(A.url), index.blocks(B.url), index.fill(A.url)) == (0, 64, 0.0)


def test_a_prompt_shorter_than_a_block_records_and_matches_nothing() -> None:
    index = ApproximatePrefixIndex()
    index.record(A.url, p([1, 2, 3]))
    assert (index.blocks(A.url), index.match([A.url], p([1, 2, 3]))) == (0, {A.url: 0})


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(1, 3), min_size=0, max_size=40), min_size=1, max_size=12),
    capacity=st.integers(1, 30),
)
def test_matches_found_by_binary_search_equal_a_walk_whatever_was_recorded_and_evicted(
    prompts: list[list[int]], capacity: int
) -> None:
    """Prompts over a tiny alphabet share prefixes often; a small capacity evicts often."""
    index = ApproximatePrefixIndex()
    index.configure(A.url, block_size=2, capacity_blocks=capacity)
    for tokens in prompts:
        index.record(A.url, p(tokens))
        for probe in prompts:
            keys = p(probe).block_keys(2)
            walked = next((i for i, key in enumerate(keys) if not index.holds(A.url, key)), len(keys))
            assert index.match([A.url], p(probe)) == {A.url: walked * 2}
