"""Paged KV blocks with prefix caching (`tandem.sim.engine.blocks.BlockPool`).

Pure: the pool is driven directly with token ids and their chained block hashes; the KV-event hook is
a list that records what the pool reports. Nothing is faked.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tandem.core.kvkeys import chunk_hashes, scope_root
from tandem.sim.engine.blocks import BlockPool, BlockRemoved, BlockStored, KVEvent
from tandem.sim.engine.requests import prompt_block_hashes

BS = 4  # small blocks keep the stories short


def seq(*values: int) -> list[int]:
    return list(values)


def allocate(
    pool: BlockPool, owner: str, tokens: Sequence[int], *, use_cache: bool = True, salt: str | None = None
) -> bool:
    hashes = prompt_block_hashes(tokens, BS, cache_salt=salt)
    hits = pool.cached_prefix(hashes, num_tokens=len(tokens)) if use_cache else []
    return pool.allocate(
        owner,
        num_tokens=len(tokens),
        token_ids=tokens,
        block_hashes=hashes,
        computed_blocks=hits,
        cache_salt=salt,
    )


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)],
)
def test_a_sequence_takes_its_tokens_divided_by_block_size_rounded_up(tokens: int, blocks: int) -> None:
    pool = BlockPool(num_blocks=8, block_size=BS)
    assert allocate(pool, "a", list(range(1, tokens + 1)))
    assert len(pool.blocks_of("a")) == blocks
    assert pool.usage() == blocks / 8


def test_a_shared_prefix_hits_the_cache_and_shares_its_blocks() -> None:
    pool = BlockPool(num_blocks=8, block_size=BS)
    first = seq(1, 2, 3, 4, 5, 6, 7, 8, 9)
    second = seq(1, 2, 3, 4, 5, 6, 7, 8, 50, 51)
    allocate(pool, "a", first)
    hits = pool.cached_prefix(chunk_hashes(second, BS), num_tokens=len(second))
    assert hits == list(pool.blocks_of("a")[:2])
    allocate(pool, "b", second)
    assert [pool.ref_count(b) for b in hits] == [2, 2]
    assert pool.num_free_blocks == 8 - 3 - 1  # b added only its third block


def test_a_fully_cached_sequence_still_leaves_one_block_to_compute() -> None:
    pool = BlockPool(num_blocks=8, block_size=BS)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8)
    allocate(pool, "a", tokens)
    assert len(pool.cached_prefix(chunk_hashes(tokens, BS), num_tokens=8)) == 1


def test_a_partial_block_is_never_cached() -> None:
    pool = BlockPool(num_blocks=8, block_size=BS)
    allocate(pool, "a", seq(1, 2, 3, 4, 5, 6))
    longer = seq(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert len(pool.cached_prefix(chunk_hashes(longer, BS), num_tokens=9)) == 1


def test_freed_blocks_stay_cached_until_their_space_is_needed() -> None:
    pool = BlockPool(num_blocks=4, block_size=BS)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8)
    allocate(pool, "a", tokens)
    a_blocks = pool.blocks_of("a")
    pool.free("a")
    assert pool.usage() == 0.0
    assert all(pool.is_cached(h) for h in chunk_hashes(tokens, BS))
    assert allocate(pool, "b", [*tokens, 9])
    assert pool.blocks_of("b")[:2] == a_blocks  # both of a's blocks are hits
    assert pool.usage() == 3 / 4


def test_eviction_takes_the_least_recently_freed_block_and_a_sequence_tail_first() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(num_blocks=4, block_size=BS, on_event=events.append)
    older, newer = seq(1, 2, 3, 4, 5, 6, 7, 8), seq(11, 12, 13, 14, 15, 16, 17, 18)
    allocate(pool, "old", older)
    allocate(pool, "new", newer)
    pool.free("old")
    pool.free("new")
    old_hashes, new_hashes = chunk_hashes(older, BS), chunk_hashes(newer, BS)
    events.clear()
    assert allocate(pool, "c", seq(90, 91, 92), use_cache=False)
    assert events == [BlockRemoved((old_hashes[1],))]  # old's tail goes first
    assert allocate(pool, "d", seq(80, 81, 82), use_cache=False)
    assert pool.is_cached(new_hashes[0]) and pool.is_cached(new_hashes[1])
    assert not pool.is_cached(old_hashes[0]) and not pool.is_cached(old_hashes[1])


def test_an_allocation_that_does_not_fit_changes_nothing() -> None:
    pool = BlockPool(num_blocks=3, block_size=BS)
    allocate(pool, "a", seq(1, 2, 3, 4, 5))
    assert not allocate(pool, "b", list(range(100, 109)))
    assert pool.blocks_of("b") == ()
    assert pool.num_free_blocks == 1


def test_ref_counts_fall_to_zero_only_when_every_holder_freed() -> None:
    pool = BlockPool(num_blocks=6, block_size=BS)
    shared = seq(1, 2, 3, 4, 5, 6, 7, 8, 9)
    allocate(pool, "a", shared)
    allocate(pool, "b", shared)
    block = pool.blocks_of("a")[0]
    pool.free("a")
    assert pool.ref_count(block) == 1
    assert pool.usage() > 0
    pool.free("b")
    assert pool.ref_count(block) == 0
    assert pool.usage() == 0.0


def test_taking_a_cached_free_block_removes_it_from_the_free_queue() -> None:
    pool = BlockPool(num_blocks=4, block_size=BS)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8, 9)
    allocate(pool, "a", tokens)
    pool.free("a")
    assert pool.num_free_blocks == 4
    allocate(pool, "b", tokens)  # two hits + one new block
    assert pool.num_free_blocks == 1


def test_stored_blocks_are_reported_with_their_parent_and_tokens() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(num_blocks=8, block_size=BS, on_event=events.append)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
    hashes = chunk_hashes(tokens, BS)
    pool.allocate("a", num_tokens=6, token_ids=tokens, block_hashes=hashes)
    pool.allocate("a", num_tokens=13, token_ids=tokens, block_hashes=hashes)
    assert events == [
        BlockStored((hashes[0],), None, (1, 2, 3, 4), BS),
        BlockStored((hashes[1], hashes[2]), hashes[0], (5, 6, 7, 8, 9, 10, 11, 12), BS),
    ]


def test_a_prefix_already_held_by_another_block_is_not_stored_twice() -> None:
    events: list[KVEvent] = []
    pool = BlockPool(num_blocks=8, block_size=BS, on_event=events.append)
    tokens = seq(1, 2, 3, 4, 5)
    allocate(pool, "a", tokens)
    allocate(pool, "b", tokens, use_cache=False)  # computed again, e.g. both arrived together
    assert [e for e in events if isinstance(e, BlockStored)] == [
        BlockStored((chunk_hashes(tokens, BS)[0],), None, (1, 2, 3, 4), BS)
    ]


def test_without_a_salt_block_hashes_are_the_chunk_hashes_from_the_default_root() -> None:
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8)
    assert prompt_block_hashes(tokens, BS, cache_salt=None) == chunk_hashes(tokens, BS)
    salted = prompt_block_hashes(tokens, BS, cache_salt="a")
    assert salted == chunk_hashes(tokens, BS, parent=scope_root("a"))
    assert not set(salted) & set(chunk_hashes(tokens, BS))


def test_equal_tokens_under_different_salts_share_no_block_and_equal_salts_share_as_before() -> None:
    pool = BlockPool(num_blocks=12, block_size=BS)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8, 9)
    allocate(pool, "a", tokens, salt="tenant-a")
    for salt in ("tenant-b", None):
        assert pool.cached_prefix(prompt_block_hashes(tokens, BS, cache_salt=salt), num_tokens=9) == []
    same = pool.cached_prefix(prompt_block_hashes(tokens, BS, cache_salt="tenant-a"), num_tokens=9)
    assert same == list(pool.blocks_of("a")[:2])
    allocate(pool, "b", tokens, salt="tenant-b")
    assert not set(pool.blocks_of("a")) & set(pool.blocks_of("b"))


def test_a_salted_sequences_first_block_carries_the_salt_in_its_extra_keys() -> None:
    """As vLLM: `(salt,)` on block 0 of the sequence only; a later run, chained to its parent, has None."""
    events: list[KVEvent] = []
    pool = BlockPool(num_blocks=8, block_size=BS, on_event=events.append)
    tokens = seq(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
    hashes = prompt_block_hashes(tokens, BS, cache_salt="t")
    pool.allocate("a", num_tokens=9, token_ids=tokens, block_hashes=hashes, cache_salt="t")
    pool.allocate("a", num_tokens=13, token_ids=tokens, block_hashes=hashes, cache_salt="t")
    assert events == [
        BlockStored((hashes[0], hashes[1]), None, tuple(tokens[:8]), BS, (("t",), None)),
        BlockStored((hashes[2],), hashes[1], (9, 10, 11, 12), BS, (None,)),
    ]
