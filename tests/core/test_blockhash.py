"""Router prefix keys (`tandem.core.blockhash`). Pure functions on token ids; nothing is faked."""

from __future__ import annotations

import struct

import pytest
import xxhash

from tandem.core.blockhash import MASK64, ROOT_KEY, block_keys, namespace_key


def test_the_pinned_vector_does_not_change_by_accident() -> None:
    assert block_keys([1, 2], 2) == [0x0389E2C8892D5450]


def test_a_key_is_xxh3_of_the_blocks_le32_ids_seeded_by_the_previous_key() -> None:
    first = xxhash.xxh3_64_intdigest(struct.pack("<3I", 7, 8, 9), 0)
    second = xxhash.xxh3_64_intdigest(struct.pack("<3I", 10, 11, 2**32 - 1), first)
    assert block_keys([7, 8, 9, 10, 11, 2**32 - 1, 12], 3) == [first, second]


@pytest.mark.parametrize(("tokens", "keys"), [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (9, 2)])
def test_only_full_blocks_have_keys(tokens: int, keys: int) -> None:
    assert len(block_keys(list(range(tokens)), 4)) == keys


def test_keys_chain_so_equal_keys_mean_equal_prefixes() -> None:
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    whole = block_keys(a + b, 4)
    assert block_keys(b, 4, parent=block_keys(a, 4)[-1]) == whole[1:]
    assert block_keys([9, 2, 3, 4, 5, 6, 7, 8], 4)[1] != whole[1]  # same block, other prefix
    assert all(0 <= key <= MASK64 for key in whole)


def test_the_root_picks_a_key_space() -> None:
    tokens = [1, 2, 3, 4]
    assert namespace_key("") == ROOT_KEY
    lora = namespace_key("sql-adapter")
    assert lora not in (ROOT_KEY, namespace_key("other"))
    assert block_keys(tokens, 4, parent=lora) != block_keys(tokens, 4)


def test_token_ids_are_taken_modulo_2_32_and_block_size_must_be_positive() -> None:
    assert block_keys([2**32 + 1, 2], 2) == block_keys([1, 2], 2)
    with pytest.raises(ValueError, match="positive"):
        block_keys([1], 0)
