"""The precise prefix index (`tandem.router.discovery.kvevents.index.PrecisePrefixIndex`) as stories.

Pure: decoded events are built directly; engine block hashes are arbitrary ints (the index must not
care how the engine hashes). Nothing is faked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.core.blockhash import block_keys, scope_key
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.kvevents.decode import AllBlocksCleared, BlockRemoved, BlockStored
from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
from tandem.router.types import RequestView

A = "http://127.0.0.1:8101"
B = "http://127.0.0.1:8102"
BS = 4
PROMPT = tuple(range(100, 118))  # 18 tokens: 4 full blocks and 2 tokens


@dataclass(frozen=True)
class KeyedTokens:
    """A `KeyedPrompt` whose keys (for blocks of `BS`) were computed by its owner, as the gateway does."""

    keys: Sequence[int]

    def block_keys(self, block_size: int, /) -> Sequence[int]:
        assert block_size == BS
        return self.keys


def stored(first: int, tokens: tuple[int, ...], *, parent: int | None = None, **extra: object) -> BlockStored:
    """Blocks of `tokens` with engine hashes first, first+1, ..."""
    count = len(tokens) // BS
    return BlockStored(tuple(range(first, first + count)), parent, tokens, BS, **extra)  # type: ignore[arg-type]


def test_a_stored_chain_matches_its_full_blocks_and_the_prefixes_of_other_prompts() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8])])
    index.apply(A, [stored(12, PROMPT[8:16], parent=11)])  # the next two blocks, chained to block 1
    assert index.longest_prefix([A], PROMPT) == {A: 16}  # the 2 tail tokens never match
    shares_one_block = (*PROMPT[:4], 999, *PROMPT[5:])
    assert index.longest_prefix([A], shares_one_block) == {A: 4}
    assert index.longest_prefix([A], (7, 7, 7, 7, 7)) == {A: 0}
    assert index.longest_prefix([A], PROMPT[:3]) == {A: 0}  # no full block
    assert index.stats(A).blocks == 4 and index.stats(A).block_size == BS


def test_removing_a_block_breaks_the_chain_from_that_block_on() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:16])])
    index.apply(A, [BlockRemoved((12,))])
    assert index.longest_prefix([A], PROMPT) == {A: 8}
    index.apply(A, [BlockRemoved((10,))])
    assert index.longest_prefix([A], PROMPT) == {A: 0}
    assert index.stats(A).blocks == 2  # blocks 1 and 3 stay until the engine removes them too
    index.apply(A, [BlockRemoved((999,))])
    assert index.stats(A).unmapped == 1


def test_all_blocks_cleared_empties_only_that_endpoint() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8])])
    index.apply(B, [stored(50, PROMPT[:8])])
    index.apply(A, [AllBlocksCleared()])
    assert index.longest_prefix(None, PROMPT) == {A: 0, B: 8}
    index.apply(A, [stored(10, PROMPT[:4])])  # and it fills again
    assert index.longest_prefix([A], PROMPT) == {A: 4}


def test_longest_prefix_is_per_endpoint_and_unknown_endpoints_match_nothing() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:16])])
    index.apply(B, [stored(10, PROMPT[:4])])  # same engine hashes on another engine: independent
    unknown = "http://127.0.0.1:9999"
    assert index.longest_prefix([A, B, unknown], PROMPT) == {A: 16, B: 4, unknown: 0}
    assert index.longest_prefix(None, PROMPT) == {A: 16, B: 4}
    source: PrefixSource = index
    assert source.match([B], RequestView(request_id="r", prompt_token_ids=tuple(PROMPT))) == {B: 4}


def test_memory_is_bounded_and_the_least_recently_stored_chain_goes_first() -> None:
    index = PrecisePrefixIndex(max_blocks_per_endpoint=4)
    chains = [tuple(range(s, s + 8)) for s in (0, 1000, 2000)]
    for first, tokens in zip((10, 20, 30), chains, strict=True):
        index.apply(A, [stored(first, tokens)])
    stats = index.stats(A)
    assert (stats.blocks, stats.evicted) == (4, 2)
    assert [index.longest_prefix([A], c)[A] for c in chains] == [0, 8, 8]
    index.apply(A, [BlockRemoved((10,))])  # the evicted block's engine hash is forgotten too
    assert index.stats(A).unmapped == 1


def test_a_run_whose_parent_is_unknown_is_tracked_but_never_matches() -> None:
    """Events before it were missed: the tokens in front of the run are unknown."""
    index = PrecisePrefixIndex()
    index.apply(A, [stored(12, PROMPT[8:16], parent=11)])
    index.apply(A, [stored(14, (*PROMPT[16:18], 1, 2), parent=13)])  # its child chains on
    assert index.longest_prefix([A], PROMPT) == {A: 0}
    assert index.longest_prefix([A], PROMPT[8:16]) == {A: 0}  # not mistaken for a prompt start
    assert (index.stats(A).blocks, index.stats(A).detached_stores) == (3, 1)
    index.apply(A, [BlockRemoved((12, 13, 14))])
    assert index.stats(A).blocks == 0


def test_a_block_stays_while_any_medium_holds_it() -> None:
    """CPU offload announces a copy of known blocks without their tokens; removal is per medium."""
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8], medium="GPU")])
    index.apply(A, [BlockStored((10, 11), None, (), BS, medium="CPU")])
    index.apply(A, [BlockRemoved((10, 11), medium="GPU")])
    assert index.longest_prefix([A], PROMPT) == {A: 8}
    index.apply(A, [BlockRemoved((10, 11), medium="CPU")])
    assert index.longest_prefix([A], PROMPT) == {A: 0}
    index.apply(A, [BlockStored((77,), None, (), BS, medium="CPU")])  # nothing known to copy
    assert index.stats(A).unmapped == 1


def test_lora_blocks_live_in_their_own_key_space() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8], lora_name="sql-adapter")])
    assert index.longest_prefix([A], PROMPT) == {A: 0}
    assert index.longest_prefix([A], PROMPT, lora_name="sql-adapter") == {A: 8}


def test_salted_chains_match_only_under_their_salt() -> None:
    """A salt scopes the chain that starts with it; its children (parented, no salt of their own)
    stay in that scope, and the keys are those the gateway computes under `scope_key`."""
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8], cache_salt="tenant-a")])
    index.apply(A, [stored(12, PROMPT[8:16], parent=11)])
    assert index.longest_prefix([A], PROMPT, cache_salt="tenant-a") == {A: 16}
    assert index.longest_prefix([A], PROMPT, cache_salt="tenant-b") == {A: 0}
    assert index.longest_prefix([A], PROMPT) == {A: 0}
    gateway_keys = block_keys(PROMPT, BS, parent=scope_key(cache_salt="tenant-a"))
    assert index.match([A], KeyedTokens(gateway_keys)) == {A: 16}


def test_an_adapter_and_a_salt_scope_together() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8], lora_name="sql", cache_salt="tenant-a")])
    assert index.longest_prefix([A], PROMPT, lora_name="sql", cache_salt="tenant-a") == {A: 8}
    assert index.longest_prefix([A], PROMPT, lora_name="sql") == {A: 0}
    assert index.longest_prefix([A], PROMPT, cache_salt="tenant-a") == {A: 0}


def test_sliding_window_groups_of_hybrid_models_are_ignored() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(10, PROMPT[:8], group_idx=0, kv_cache_spec_kind="full_attention")])
    index.apply(A, [stored(10, PROMPT[:8], group_idx=1, kv_cache_spec_kind="sliding_window")])
    index.apply(A, [BlockRemoved((10, 11), group_idx=1)])  # the window slid: not a prefix eviction
    assert index.longest_prefix([A], PROMPT) == {A: 8}


def test_block_size_comes_from_the_events_unless_given() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [BlockStored((1,), None, PROMPT[:8], 8)])
    assert index.longest_prefix([A], PROMPT) == {A: 8}
    assert index.longest_prefix([A], PROMPT, block_size=4) == {A: 0}  # other keys
    assert block_keys(PROMPT[:8], 8)[0] != block_keys(PROMPT[:4], 4)[0]


def test_an_engine_hash_announced_again_under_another_chain_moves() -> None:
    index = PrecisePrefixIndex()
    index.apply(A, [stored(12, PROMPT[4:8], parent=99)])  # detached first (parent unknown)
    index.apply(A, [stored(11, PROMPT[:4]), stored(12, PROMPT[4:8], parent=11)])  # then in full
    assert index.longest_prefix([A], PROMPT) == {A: 8}
    assert index.stats(A).blocks == 2
    index.forget(A)
    assert index.endpoints() == [] and index.stats(A).blocks == 0
