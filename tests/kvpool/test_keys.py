"""The KV pool key layout (`tandem.kvpool.keys`): chained chunk hashes, keys, scopes, metadata and its tag.

Pure: nothing is faked because nothing does I/O.
"""

from __future__ import annotations

import hashlib

import pytest

from tandem.kvpool.keys import (
    DTYPE_TO_INT,
    MAC_BYTES,
    MEMORY_FORMAT_KV_2LTD,
    METADATA_BYTES,
    ChunkMetadata,
    LMCache03Hash,
    LMCacheCborHash,
    LMCacheHash,
    PoolKeys,
    PoolScope,
    TandemHash,
    check_chunk,
    chunk_hashes,
    chunk_key,
    chunk_mac,
    decode_metadata,
    encode_metadata,
    lmcache_none_hash,
    lmcache_salt_tag,
    model_pattern,
    parse_key,
    pool_key,
    scope_root,
    seal_metadata,
    split_metadata,
)

CHUNK = 256


def tokens(n: int, *, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def test_each_chunk_hash_depends_on_every_earlier_chunk() -> None:
    base = tokens(3 * CHUNK)
    changed_first = [999_999, *base[1:]]
    changed_second = base.copy()
    changed_second[CHUNK + 5] = 999_999
    h = chunk_hashes(base, CHUNK)
    h_first = chunk_hashes(changed_first, CHUNK)
    h_second = chunk_hashes(changed_second, CHUNK)
    assert all(a != b for a, b in zip(h, h_first, strict=True))
    assert h_second[0] == h[0]
    assert h_second[1] != h[1] and h_second[2] != h[2]


@pytest.mark.parametrize(("length", "chunks"), [(0, 0), (255, 0), (256, 1), (511, 1), (600, 2), (768, 3)])
def test_only_full_chunks_are_hashed(length: int, chunks: int) -> None:
    assert len(chunk_hashes(tokens(length), CHUNK)) == chunks


def test_a_chain_continues_from_a_parent_hash() -> None:
    head, tail = tokens(2 * CHUNK), tokens(CHUNK + 17, start=5000)
    whole = chunk_hashes(head + tail, CHUNK)
    continued = chunk_hashes(tail, CHUNK, parent=chunk_hashes(head, CHUNK)[-1])
    assert whole == chunk_hashes(head, CHUNK) + continued


def test_hashes_are_stable_across_calls_and_can_be_negative() -> None:
    hashes = chunk_hashes(tokens(64 * 16), 16)
    assert hashes == chunk_hashes(tokens(64 * 16), 16)
    assert any(h < 0 for h in hashes) and any(h > 0 for h in hashes)


def test_a_non_positive_chunk_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_hashes(tokens(10), 0)


@pytest.mark.parametrize(
    ("chunk_hash", "key"),
    [
        (-0x7CFEFDCCC681B183, "Qwen/Qwen2.5-7B-Instruct@1@0@-7cfefdccc681b183@bfloat16"),
        (0x56B9E850B372F0D9, "Qwen/Qwen2.5-7B-Instruct@1@0@56b9e850b372f0d9@bfloat16"),
    ],
)
def test_keys_follow_lmcache_model_world_worker_hash_dtype(chunk_hash: int, key: str) -> None:
    assert chunk_key(model="Qwen/Qwen2.5-7B-Instruct", chunk_hash=chunk_hash) == key


def test_a_model_pattern_escapes_glob_characters() -> None:
    assert model_pattern("a*b?[c]") == "a\\*b\\?\\[c]@*"


def test_metadata_round_trips_with_the_true_shape() -> None:
    raw = encode_metadata(length=262_144, dtype="bfloat16", layers=2, tokens=256, hidden=128)
    assert len(raw) == 28
    assert decode_metadata(raw) == ChunkMetadata(
        length=262_144,
        memory_format=MEMORY_FORMAT_KV_2LTD,
        dtype_int=DTYPE_TO_INT["bfloat16"],
        shape=(2, 2, 256, 128),
    )


def test_metadata_of_the_wrong_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="28 or 60 bytes"):
        decode_metadata(b"\x00" * 27)


@pytest.mark.parametrize(
    ("key", "model", "dtype", "suffix"),
    [
        ("qwen@1@0@-7cfefdccc681b183@bfloat16metadata", "qwen", "bfloat16", "metadata"),
        ("Qwen/Qwen2.5-7B@2@1@56b9e850b372f0d9@halfkv_bytes", "Qwen/Qwen2.5-7B", "half", "kv_bytes"),
        ("odd@name@1@0@ab@bfloat16@tag%xmetadata", "odd@name", "bfloat16@tag%x", "metadata"),
    ],
)
def test_a_chunk_key_parses_into_its_fields(key: str, model: str, dtype: str, suffix: str) -> None:
    parsed = parse_key(key)
    assert parsed is not None
    assert (parsed.model, parsed.dtype, parsed.suffix) == (model, dtype, suffix)
    assert parsed.base + parsed.suffix == key


def test_a_key_written_by_chunk_key_parses_back() -> None:
    key = chunk_key(model="m", chunk_hash=-0x1F, world_size=2, worker_id=1, dtype="half") + "kv_bytes"
    parsed = parse_key(key)
    assert parsed is not None
    assert (parsed.model, parsed.world_size, parsed.worker_id, parsed.chunk_hash) == ("m", 2, 1, "-1f")


@pytest.mark.parametrize(
    "key",
    ["session:42", "qwen@1@0@-7cfe@bfloat16", "qwen@x@0@7cfe@bfloat16metadata", "qwen@1@0@zz@bf16kv_bytes"],
)
def test_other_keys_do_not_parse(key: str) -> None:
    assert parse_key(key) is None


def test_pool_keys_name_chunks_as_lmcache_writes_them() -> None:
    """The expected strings are what LMCache 0.5.6's own ChunkedTokenDatabase printed (to_string) in
    .venv-vllm under PYTHONHASHSEED=0, for a model `/models/qwen` on 2 ranks in bfloat16."""
    none_hash = lmcache_none_hash("0")
    assert none_hash is not None
    keys = PoolKeys(model="/models/qwen", chunk_size=CHUNK, world_size=2, scheme=LMCacheHash(none_hash))
    assert keys.chunk_keys(list(range(600)), suffix="") == [
        "/models/qwen@2@0@5f05dec65811b7cc@bfloat16",
        "/models/qwen@2@0@-adc333b9eaa0e45@bfloat16",  # Python's `:x` of a negative hash
    ]
    assert keys.chunk_keys(list(range(CHUNK)))[0].endswith("@bfloat16metadata")
    parsed = parse_key(keys.chunk_keys(list(range(CHUNK)))[0])
    assert parsed is not None and (parsed.model, parsed.world_size, parsed.worker_id) == (
        "/models/qwen",
        2,
        0,
    )


def test_pool_keys_default_to_tandems_hash_on_one_rank() -> None:
    keys = PoolKeys(model="qwen", chunk_size=CHUNK)
    assert keys.chunk_keys(tokens(CHUNK)) == [
        chunk_key(model="qwen", chunk_hash=chunk_hashes(tokens(CHUNK), CHUNK)[0]) + "metadata"
    ]
    with pytest.raises(ValueError, match="chunk_size"):
        PoolKeys(model="qwen", chunk_size=0)


def test_pool_keys_pass_the_scope_to_the_hash_and_keep_the_shared_scope_by_default() -> None:
    keyed = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=TandemHash(key=KEY))
    prompt = tokens(2 * CHUNK)
    assert (
        keyed.chunk_keys(prompt) == keyed.chunk_keys(prompt, scope=None) == keyed.chunk_keys(prompt, scope="")
    )
    assert keyed.chunk_keys(prompt, suffix="", scope="t1-a") == [
        chunk_key(model="qwen", chunk_hash=h)
        for h in TandemHash(key=KEY).chunk_hashes(prompt, CHUNK, scope="t1-a")
    ]
    assert not set(keyed.chunk_keys(prompt, scope="t1-a")) & set(keyed.chunk_keys(prompt, scope="t1-b"))
    assert not set(keyed.chunk_keys(prompt)) & set(
        PoolKeys(model="qwen", chunk_size=CHUNK).chunk_keys(prompt)
    )


# --------------------------------------------------------------------------- adapters in the scope

ADAPTERS = (None, "sql", "chat")
SALTS = (None, "t1-a")
PROMPT = [1000 + i for i in range(600)]  # two full chunks and 88 tokens more


@pytest.mark.parametrize("key", [None, bytes(range(32))], ids=["unkeyed", "keyed"])
def test_the_same_prompt_as_base_and_under_two_adapters_with_and_without_a_salt_has_disjoint_keys(
    key: bytes | None,
) -> None:
    keys = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=TandemHash(key=key))
    named = {
        (salt, adapter): keys.chunk_keys(PROMPT, scope=PoolScope(cache_salt=salt, lora_name=adapter))
        for salt in SALTS
        for adapter in ADAPTERS
    }
    assert all(len(chunks) == 2 for chunks in named.values())
    assert len(set().union(*named.values())) == 2 * len(named)  # 6 scopes, 12 distinct keys


# Computed before adapters joined the scope (commit 051f5e2's `tandem.core.kvkeys`): the base model's
# keys, salted or not, keyed or not, must stay these bytes, so chunks already in pools keep matching.
BEFORE_ADAPTERS = {
    (None, None): [-4371818112097449693, -8763346590559048906],
    (None, "t1-a"): [6065772619703598264, 7222603177765202808],
    (bytes(range(32)), None): [-8452652196203726444, 2588673510891762590],
    (bytes(range(32)), "t1-a"): [-5100695345770196606, 2032125459918946261],
}


@pytest.mark.parametrize(("key", "salt"), list(BEFORE_ADAPTERS))
def test_the_base_models_keys_are_the_bytes_they_were_before_adapters(
    key: bytes | None, salt: str | None
) -> None:
    scheme = TandemHash(key=key)
    for scope in (salt, PoolScope(cache_salt=salt), PoolScope(cache_salt=salt, lora_name="")):
        assert scheme.chunk_hashes(PROMPT, CHUNK, scope=scope) == BEFORE_ADAPTERS[(key, salt)]
    assert PoolKeys(model="qwen", chunk_size=CHUNK).chunk_keys(PROMPT) == [
        "qwen@1@0@-3cabd168fa2ff6dd@bfloat16metadata",
        "qwen@1@0@-799da94b3de714ca@bfloat16metadata",
    ]


def test_an_adapters_root_is_pinned_for_the_docs_worked_example() -> None:
    """docs/kvpool.md: key `bytes(range(32))`, adapter `sql`, no salt."""
    key = bytes(range(32))
    assert scope_root(PoolScope(lora_name="sql"), key=key) == 3526461272930537103
    assert scope_root(PoolScope(lora_name="sql")) == 3214754812834023545
    assert scope_root(PoolScope(cache_salt="t1-a", lora_name="sql"), key=key) == 6827639238824910383
    assert TandemHash(key=key).chunk_hashes([1, 2, 3, 4, 5], 2, scope=PoolScope(lora_name="sql")) == [
        8360595004382635530,
        -1722636529619351707,
    ]


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (PoolScope(cache_salt="sql"), PoolScope(lora_name="sql")),  # a salt named like an adapter
        (PoolScope(cache_salt="sql\x1ft1-a"), PoolScope(cache_salt="t1-a", lora_name="sql")),
        (PoolScope(lora_name="sql\x1fcache_salt\x1ft1-a"), PoolScope(cache_salt="t1-a", lora_name="sql")),
        (
            PoolScope(cache_salt="lora_name\x1f\x00\x00\x00\x00\x00\x00\x00\x03sql"),
            PoolScope(lora_name="sql"),
        ),
        (PoolScope(lora_name="sq"), PoolScope(lora_name="sql")),
    ],
    ids=["salt-as-adapter", "joined-salt", "adapter-spelling-a-salt", "salt-spelling-an-adapter", "prefix"],
)
def test_no_salt_or_adapter_name_can_spell_another_scope(one: PoolScope, other: PoolScope) -> None:
    """Salts reach the engines from clients that bypass the gateway too: the scope's encoding is
    one-to-one, so no chosen salt or adapter name lands in another scope's keys."""
    for key in (None, KEY):
        assert scope_root(one, key=key) != scope_root(other, key=key)


@pytest.mark.parametrize("scheme", [LMCacheHash(7), LMCacheCborHash(7)], ids=str)
def test_lmcaches_chain_carries_neither_salt_nor_adapter_and_its_keys_end_with_their_tags(
    scheme: object,
) -> None:
    """LMCache's chain is the same in every scope (vLLM #44250); the adapter and the salt are in its
    keys as the tags the gateway sends (LMCache 0.5.6's `CacheEngineKey.to_string()` with the request
    configs lmcache.tag.lora and lmcache.tag.salt, in that order)."""
    keys = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=scheme)  # type: ignore[arg-type]
    base = keys.chunk_keys(PROMPT)
    assert [k.split("@")[3] for k in keys.chunk_keys(PROMPT, scope="t1-a")] == [k.split("@")[3] for k in base]
    tenant = keys.chunk_keys(PROMPT, scope=PoolScope(cache_salt="t1-a"))
    assert tenant == keys.chunk_keys(PROMPT, scope="t1-a")
    tag = "@salt%" + lmcache_salt_tag("t1-a")
    assert tenant == [k.removesuffix("metadata") + tag + "metadata" for k in base]
    assert "t1-a" not in tenant[0], "the salt itself is not in the pool's key names"
    assert not set(tenant) & set(keys.chunk_keys(PROMPT, scope="t1-b"))
    sql = keys.chunk_keys(PROMPT, scope=PoolScope(cache_salt="t1-a", lora_name="sql"))
    chat = keys.chunk_keys(PROMPT, scope=PoolScope(lora_name="chat"))
    assert sql == [k.removesuffix("metadata") + "@lora%sql" + tag + "metadata" for k in base]
    assert chat == [k.removesuffix("metadata") + "@lora%chatmetadata" for k in base]
    assert all(parse_key(k) is not None and parse_key(k).model == "qwen" for k in sql + tenant)  # type: ignore[union-attr]
    assert keys.scheme.carries_scope is True and keys.scheme.carries_adapter is True
    assert TandemHash().carries_scope is True and TandemHash().carries_adapter is True


def test_lmcache_03s_keys_carry_no_adapter_and_say_so() -> None:
    keys = PoolKeys(model="qwen", chunk_size=CHUNK, scheme=LMCache03Hash(7))
    scoped = keys.chunk_keys(PROMPT, scope=PoolScope(cache_salt="t1-a", lora_name="sql"))
    assert scoped == keys.chunk_keys(PROMPT)
    assert keys.scheme.carries_scope is False and keys.scheme.carries_adapter is False


# --------------------------------------------------------------------------- the chunk tag

KEY = bytes(range(32))
NAME = "qwen@1@0@1f@bfloat16"
HEADER = encode_metadata(length=4, dtype="bfloat16", layers=1, tokens=1, hidden=1)


def test_the_pool_key_is_blake2b_of_the_secret() -> None:
    assert pool_key("secret").hex() == "afc10c1d183233fb793ece57cafad4ee48630d7270ac3eda236389f3dab8b3b8"
    assert len(pool_key("x" * 1000)) == 32
    with pytest.raises(ValueError, match="empty"):
        pool_key("")


def test_the_chunk_mac_is_keyed_blake2b_over_the_length_prefixed_name_and_header_then_the_bytes() -> None:
    expected = hashlib.blake2b(
        len(NAME).to_bytes(8, "big") + NAME.encode() + (28).to_bytes(8, "big") + HEADER + b"kv",
        key=KEY,
        digest_size=32,
        person=b"tandem-kv-mac",
    ).digest()
    assert chunk_mac(KEY, NAME, HEADER, b"kv") == expected
    assert chunk_mac(KEY, NAME, bytes(28), b"kv").hex() == (
        "81a33859c73245444b416574dcd22f6c9cdfbc8d786e3b8aba9c35c30af69dbf"
    )


def test_a_sealed_value_is_the_header_then_its_tag_and_still_decodes() -> None:
    sealed = seal_metadata(KEY, name=NAME, metadata=HEADER, kv_bytes=b"kvkv")
    assert len(sealed) == METADATA_BYTES + MAC_BYTES == 60
    assert split_metadata(sealed) == (HEADER, chunk_mac(KEY, NAME, HEADER, b"kvkv"))
    assert decode_metadata(sealed) == decode_metadata(HEADER)
    with pytest.raises(ValueError, match="28 or 60 bytes"):
        decode_metadata(sealed[:-1])


@pytest.mark.parametrize(
    ("name", "metadata", "kv_bytes", "verdict"),
    [
        (NAME, "sealed", b"kvkv", "ok"),
        (NAME, HEADER, b"kvkv", "untagged"),  # LMCache's value, or a writer without the key
        (NAME, "sealed", b"kvkX", "mac"),  # bytes corrupted or swapped
        (NAME, "sealed", b"kvkv" + b"\x00", "mac"),  # bytes of another length
        ("qwen@1@0@2f@bfloat16", "sealed", b"kvkv", "mac"),  # a valid chunk copied under another name
        (NAME, "short", b"kvkv", "mac"),  # a truncated tag
        (NAME, "other-key", b"kvkv", "mac"),  # sealed with another key
        (NAME, "forged-header", b"kvkv", "mac"),  # the header changed after sealing
    ],
)
def test_a_chunk_loads_only_when_its_tag_verifies(
    name: str, metadata: object, kv_bytes: bytes, verdict: str
) -> None:
    sealed = seal_metadata(KEY, name=NAME, metadata=HEADER, kv_bytes=b"kvkv")
    values = {
        "sealed": sealed,
        "short": sealed[:-1],
        "other-key": seal_metadata(b"other", name=NAME, metadata=HEADER, kv_bytes=b"kvkv"),
        "forged-header": encode_metadata(length=8, dtype="bfloat16", layers=1, tokens=1, hidden=1)
        + sealed[28:],
    }
    raw = values[metadata] if isinstance(metadata, str) else metadata
    assert isinstance(raw, bytes)
    assert check_chunk(KEY, name=name, metadata=raw, kv_bytes=kv_bytes) == verdict
