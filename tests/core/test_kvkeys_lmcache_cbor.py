"""LMCache's chunk hashes under `pre_caching_hash_algorithm: sha256_cbor` (`tandem.core.kvkeys.
LMCacheCborHash`), the setting Tandem gives LMCache engines.

Pure. The known answers are what LMCache 0.5.6's own `ChunkedTokenDatabase` printed
(`CacheEngineKey.to_string()`) in .venv-vllm (vLLM 0.32) for a model `/models/qwen` on 2 ranks in
bfloat16, tokens `range(600)`, under PYTHONHASHSEED=0 and with it unset;
tests/kvpool/test_lmcache_keys_vllm.py recomputes such keys against LMCache itself where it is
installed. The CBOR encoding is also checked byte for byte against hand-written RFC 8949 items.
"""

from __future__ import annotations

import hashlib

import pytest

from tandem.core.kvkeys import LMCacheCborHash, lmcache_cbor_chunk_hashes, lmcache_cbor_none_hash
from tandem.core.lmcachehash import _cbor_head, _cbor_uint
from tandem.kvpool.keys import PoolKeys


@pytest.mark.parametrize(
    ("seed", "none_hash", "keys"),
    [
        ("0", 5625442194607170974, ["b8a960cfcc69e7a5", "cc309e143d545625"]),
        (None, 11230124004819357437, ["31375f4bc7c57397", "675fd98cddfd2fcd"]),  # "vllm-none-hash"
    ],
)
def test_the_keys_are_lmcaches_own(seed: str | None, none_hash: int, keys: list[str]) -> None:
    assert lmcache_cbor_none_hash(seed) == none_hash
    pool = PoolKeys(model="/models/qwen", chunk_size=256, world_size=2, scheme=LMCacheCborHash(none_hash))
    assert pool.chunk_keys(list(range(600)), suffix="") == [
        f"/models/qwen@2@0@{key}@bfloat16" for key in keys
    ]


def test_the_none_hash_is_sha256_of_the_seeds_cbor_text() -> None:
    assert lmcache_cbor_none_hash("0") == int.from_bytes(hashlib.sha256(b"\x61\x30").digest()[:8], "big")


def test_a_chunk_hashes_the_cbor_array_of_parent_tokens_and_no_extra_keys() -> None:
    tokens = [0, 23, 24, 255, 256, 65535, 65536, 151935]
    encoded = (
        b"\x83" + b"\x05"  # [5,
        + b"\x88" + b"\x00" + b"\x17" + b"\x18\x18" + b"\x18\xff" + b"\x19\x01\x00" + b"\x19\xff\xff"
        + b"\x1a\x00\x01\x00\x00" + b"\x1a\x00\x02\x51\x7f"  # [tokens...],
        + b"\x80"  # []]
    )  # fmt: skip
    expected = int.from_bytes(hashlib.sha256(encoded).digest()[:8], "big")
    assert lmcache_cbor_chunk_hashes(tokens, 8, none_hash=5) == [expected]


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (255, "18ff"),
        (256, "190100"),
        (65535, "19ffff"),
        (65536, "1a00010000"),
        (2**32 - 1, "1affffffff"),
        (2**32, "1b0000000100000000"),
        (2**64 - 1, "1bffffffffffffffff"),
    ],
)
def test_unsigned_ints_take_cbors_shortest_form(value: int, encoded: str) -> None:
    assert _cbor_uint(value).hex() == encoded


def test_what_cbor_cannot_hold_here_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        _cbor_uint(-1)
    with pytest.raises(ValueError, match="64-bit"):
        _cbor_head(0, 2**64)


def test_the_scope_is_ignored_as_lmcache_ignores_cache_salt() -> None:
    scheme = LMCacheCborHash(5)
    assert scheme.chunk_hashes(list(range(512)), 256, scope="t1-a") == scheme.chunk_hashes(
        list(range(512)), 256
    )
