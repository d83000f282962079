"""Tandem's chunk hashes (`tandem.core.kvkeys.TandemHash`): the unkeyed chain unchanged, scopes that
never share a key, and the keyed chain that nobody without the pool key can compute.

Pure: nothing is faked because nothing does I/O. The known answers are recomputed here from hashlib's
primitives, so a change to the chain (person strings, byte order, root derivation) fails loudly.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from tandem.core.kvkeys import (
    NONE_HASH,
    LMCache03Hash,
    LMCacheHash,
    PoolScope,
    TandemHash,
    chunk_hashes,
    keyed_chunk_hashes,
    lmcache_chunk_hashes,
    scope_root,
)

KEY = bytes(range(32))
TOKENS = [1, 2, 3, 4, 5]  # two full chunks of 2, a partial tail


def be64(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def signed(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def test_no_key_and_no_scope_is_the_chain_tandem_always_wrote() -> None:
    assert TandemHash().chunk_hashes(TOKENS, 2) == chunk_hashes(TOKENS, 2)
    assert TandemHash().chunk_hashes(TOKENS, 2) == [-8085663711985159315, -6514645794701453033]
    first = hashlib.sha256(be64(NONE_HASH) + struct.pack("<2I", 1, 2)).digest()
    assert TandemHash().chunk_hashes(TOKENS, 2)[0] == signed(first)


def test_the_keyed_chain_is_keyed_blake2b_from_a_keyed_root() -> None:
    root = signed(hashlib.blake2b(b"", digest_size=8, key=KEY, person=b"tandem-kv-root").digest())
    first = signed(
        hashlib.blake2b(
            be64(root) + struct.pack("<2I", 1, 2), digest_size=8, key=KEY, person=b"tandem-kv-chain"
        ).digest()
    )
    assert scope_root(key=KEY) == root == 2069546087608350159
    assert TandemHash(key=KEY).chunk_hashes(TOKENS, 2) == [first, -8430552242696690848]
    assert first == 6521123471800769786


@pytest.mark.parametrize(
    ("key", "scope", "expected"),
    [
        (KEY, "tenant-a", [1436352518673417182, 4520248979981839260]),
        (None, "tenant-a", [8105299288570354501, 3616763564972119261]),
    ],
)
def test_known_answers_in_a_scope(key: bytes | None, scope: str, expected: list[int]) -> None:
    assert TandemHash(key=key).chunk_hashes(TOKENS, 2, scope=scope) == expected


def test_a_scope_root_hashes_the_salt_with_its_own_person_when_unkeyed() -> None:
    message = b"cache_salt\x1ftenant-a"
    assert scope_root("tenant-a") == signed(
        hashlib.blake2b(message, digest_size=8, person=b"tandem-kv-scope").digest()
    )
    assert scope_root("tenant-a", key=KEY) == signed(
        hashlib.blake2b(message, digest_size=8, key=KEY, person=b"tandem-kv-root").digest()
    )


@pytest.mark.parametrize("key", [None, KEY])
def test_two_scopes_never_share_a_chunk_key(key: bytes | None) -> None:
    scheme = TandemHash(key=key)
    prompts = {
        scope: set(scheme.chunk_hashes(list(range(64)), 4, scope=scope)) for scope in (None, "a", "b", "ab")
    }
    for scope, hashes in prompts.items():
        for other, other_hashes in prompts.items():
            if other != scope:
                assert not hashes & other_hashes, (scope, other)


@pytest.mark.parametrize("key", [None, KEY])
def test_an_empty_salt_is_the_shared_scope(key: bytes | None) -> None:
    scheme = TandemHash(key=key)
    assert scheme.chunk_hashes(TOKENS, 2, scope="") == scheme.chunk_hashes(TOKENS, 2, scope=None)


def test_two_keys_never_share_a_chunk_key_and_neither_shares_the_unkeyed_chain() -> None:
    tokens = list(range(64))
    chains = [set(TandemHash(key=k).chunk_hashes(tokens, 4)) for k in (None, KEY, b"another key")]
    assert all(not a & b for i, a in enumerate(chains) for b in chains[i + 1 :])


@pytest.mark.parametrize(("key", "scope"), [(None, None), (None, "a"), (KEY, None), (KEY, "a")])
def test_a_chain_continues_from_its_last_hash(key: bytes | None, scope: str | None) -> None:
    scheme = TandemHash(key=key)
    head, tail = list(range(8)), list(range(100, 111))
    whole = scheme.chunk_hashes(head + tail, 4, scope=scope)
    start = scheme.chunk_hashes(head, 4, scope=scope)
    assert whole == start + scheme.extend(tail, 4, parent=start[-1])
    assert scheme.extend(head, 4, parent=scheme.root(scope)) == start


def test_each_keyed_hash_depends_on_every_earlier_chunk() -> None:
    base = list(range(12))
    changed = [999, *base[1:]]
    assert all(
        a != b
        for a, b in zip(
            keyed_chunk_hashes(base, 4, key=KEY, parent=0),
            keyed_chunk_hashes(changed, 4, key=KEY, parent=0),
            strict=True,
        )
    )


def test_only_full_chunks_are_hashed_by_the_keyed_chain() -> None:
    assert TandemHash(key=KEY).chunk_hashes(list(range(7)), 4) == TandemHash(key=KEY).chunk_hashes(
        list(range(4)), 4
    )
    assert TandemHash(key=KEY).chunk_hashes([1, 2, 3], 4) == []
    with pytest.raises(ValueError, match="chunk_size"):
        TandemHash(key=KEY).chunk_hashes(TOKENS, 0)


@pytest.mark.parametrize("key", [b"", bytes(65)])
def test_a_key_blake2b_cannot_take_is_rejected(key: bytes) -> None:
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        TandemHash(key=key)


def test_the_key_never_appears_in_a_repr() -> None:
    assert "\\x00\\x01" not in repr(TandemHash(key=KEY)) and repr(TandemHash(key=KEY)) == "TandemHash()"


def test_lmcache_schemes_ignore_the_scope_as_lmcache_ignores_cache_salt() -> None:
    tokens = list(range(512))
    for scheme in (LMCacheHash(7), LMCache03Hash(7)):
        assert scheme.chunk_hashes(tokens, 256, scope="tenant-a") == scheme.chunk_hashes(tokens, 256)
    assert LMCacheHash(7).chunk_hashes(tokens, 256) == lmcache_chunk_hashes(tokens, 256, none_hash=7)


@pytest.mark.parametrize("key", [None, KEY])
def test_a_kv_layout_is_a_scope_of_its_own_and_no_layout_changes_nothing(key: bytes | None) -> None:
    """Engines of two KV layouts (two images, a KV-relevant argument changed) share no chunk key, in
    any salt or adapter; a scope without a layout roots where it always did (chunks already stored keep
    their keys). The layout is length-prefixed: a layout that ends like another's salt is not that salt."""
    scheme = TandemHash(key=key)
    tokens = list(range(64))
    scopes = [
        PoolScope(cache_salt=salt, lora_name=lora, kv_layout=layout)
        for salt in (None, "t1")
        for lora in (None, "sql")
        for layout in (None, "3f1c0a9e5b7d2c41", "a93c17d0e2b45f68")
    ]
    chains = [set(scheme.chunk_hashes(tokens, 4, scope=s)) for s in scopes]
    assert all(not a & b for i, a in enumerate(chains) for b in chains[i + 1 :])
    for salt in (None, "t1"):
        assert scope_root(PoolScope(cache_salt=salt), key=key) == scope_root(salt, key=key)
    assert scope_root(PoolScope(kv_layout="g"), key=key) != scope_root(PoolScope(cache_salt="g"), key=key)
    assert scope_root(PoolScope(kv_layout="ab", cache_salt="c"), key=key) != scope_root(
        PoolScope(kv_layout="a", cache_salt="bc"), key=key
    )
