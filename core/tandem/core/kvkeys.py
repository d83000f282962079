"""The chained chunk hashes of the KV pool's keys: Tandem's own, and LMCache's.

Both chain over full chunks only, so chunk i identifies the whole prefix up to its end:
`h_i = H(h_{i-1}, tokens[i*C:(i+1)*C])`; a prompt's partial tail chunk has no hash. Both can be
negative (keys then read `...@-7cfefdccc681b183@...`).

- Tandem's (`chunk_hashes`, `TandemHash`): the simulator's block hashes and Tandem's vLLM connector.
  Unkeyed and unscoped (`TandemHash()`): `h_{-1} = 0`, H = the first 8 bytes (big-endian, signed) of
  SHA-256 over the parent as 8 signed big-endian bytes followed by the tokens as little-endian uint32
  (ids above 2**32-1 are reduced mod 2**32). The same in every process, whatever PYTHONHASHSEED is.
  A *scope* (`PoolScope`: vLLM's `cache_salt`, the tenant's, and the LoRA adapter's `lora_name`)
  gives the chain its own root (`scope_root`), so two scopes' equal prompts never share a key: not two
  tenants', not the base model's and an adapter's, not two adapters'; unkeyed, anyone can still
  compute a scope's keys.
  Keyed (`TandemHash(key=K)`, the pool secret `TANDEM_KV_POOL_KEY`): H is keyed BLAKE2b-64 over the
  same bytes (`keyed_chunk_hashes`) and the root is keyed BLAKE2b of the scope (no scope: a fixed
  shared scope). Without K nobody can compute a key, aim a write at another tenant's chunk or
  collide with it; the 8-byte output keeps keys in LMCache's layout (`...@-7cfe...@bfloat16`).
- LMCache's (`lmcache_chunk_hashes`, `LMCacheHash`): what LMCache 0.5.6's `ChunkedTokenDatabase`
  computes inside vLLM 0.32 with its default `pre_caching_hash_algorithm: builtin` and
  `save_unfull_chunk: False`. vLLM's `get_hash_fn_by_name` does not know `builtin`, so LMCache falls
  back to Python's `hash`: `H(parent, chunk) = hash((parent, tuple(chunk), ()))` and
  `h_{-1} = NONE_HASH = hash(os.environ["PYTHONHASHSEED"])` (vLLM's `init_none_hash`, called by
  LMCache in the engine process). The tuple hash of ints does not depend on the hash secret (ints
  hash to themselves mod 2**61-1, tuples combine with xxHash's rounds, CPython ≥ 3.8, 64-bit), so
  this process may call `hash` on the tuple itself; the seed's str hash does depend on it, so
  `lmcache_none_hash` computes it as the engine's CPython does (`tandem.core.pyhash`, CPython ≥ 3.11).
  Without PYTHONHASHSEED the engines' keys are random per process.
- LMCache's with `pre_caching_hash_algorithm: sha256_cbor` (`lmcache_cbor_chunk_hashes`,
  `LMCacheCborHash`), what Tandem configures LMCache with (`tandem.kvpool.engine_config.lmcache_env`):
  LMCache takes vLLM's `sha256_cbor` (SHA-256 of `cbor2.dumps(x, canonical=True)`) and folds each
  digest to `int.from_bytes(d[:8], "big")` (unsigned): `H(parent, chunk) = fold(sha256_cbor((parent,
  tuple(chunk), ())))`, `h_{-1} = fold(sha256_cbor(seed))` with seed the engines' PYTHONHASHSEED, or
  vLLM 0.32's fixed `"vllm-none-hash"` when unset (`lmcache_cbor_none_hash`). No dependence on
  Python's hash, so any process computes it; the CBOR of non-negative ints and arrays is encoded in
  `tandem.core.lmcachehash`. Checked against LMCache 0.5.6's own `ChunkedTokenDatabase` in a vLLM
  0.32 process (tests/kvpool/test_lmcache_keys_vllm.py, .venv-vllm).
- LMCache 0.3's (`lmcache03_chunk_hashes`, `LMCache03Hash`): LMCache 0.3.9 (the default engine image's,
  `lmcache/vllm-openai:v0.3.9`) hashes `(parent, tuple(chunk), None)` from the same NONE_HASH. `None`
  hashes to the constant 4238894112 on CPython ≥ 3.12 (the vLLM images' Python; on 3.11 and earlier
  it is the object's address, so such engines' keys differ per process), and a tuple's hash depends
  only on its elements' hashes, so the int 4238894112 stands in for it here (`PY312_NONE_HASH`).
  Checked against LMCache 0.3.9's own `ChunkedTokenDatabase` in a vLLM 0.11 process (the known-answer
  keys in tests/core/test_kvkeys_lmcache03.py).

Scopes and LMCache: LMCache 0.5.6's `LMCacheConnectorV1` (the one Tandem configures) never reads a
request's `cache_salt` nor its `lora_request`: `vllm_v1_adapter.py` mentions neither,
`ChunkedTokenDatabase` chains `_hash_tokens(chunk, prefix_hash)` with no extra keys (so `()`; its
comment: "Ignore extra keys for now ... (e.g., LoRA ID)"), and `CacheEngineKey` holds only the model,
world size, worker, chunk hash, dtype and `lmcache.tag.*` request configs. Equal prompts of two tenants,
or of the base model and an adapter, therefore share LMCache's chunk hashes (vLLM #44250); the LMCache
schemes accept `scope` and ignore it in the chain, as LMCache does. (Only LMCache's multi-process
connector, `LMCacheMPConnector`, carries the salt.)
The adapter and the salt reach LMCache 0.5.6's keys as tags instead (`carries_scope`,
`carries_adapter`): the gateway sends every adapter or salted request to LMCache engines with
`kv_transfer_params: {"lmcache.tag.lora": <adapter>, "lmcache.tag.salt": <hash of the cache_salt>}`
(each only when there is one; `lmcache_params`, `lmcache_salt_tag`), which vLLM 0.32 hands to the
connector as the request's `sampling_params.extra_args["kv_transfer_params"]`; LMCache 0.5.6 keeps
its `lmcache.*` entries as the request's configs (`extract_request_configs_from_sampling_params`)
and `CacheEngineKey` appends each `lmcache.tag.<name>` to the key it stores and looks up, in that
order, `...@bfloat16@lora%sql@salt%<32 hex>` (`lmcache_tags`). So an adapter's chunks and the base model's (or
another adapter's) are different keys in the pool, and so are two tenants' (two salts). LMCache 0.3
has no tags (`LMCache03Hash`: neither carries).

LMCache's chains themselves (the functions `lmcache_*_hashes` and `lmcache*_none_hash`) live in
`tandem.core.lmcachehash`, re-exported here; this module keeps Tandem's chain, the scopes, the tags
and the key schemes.

The pool's key layout built on them (LMCache's `model@world_size@worker_id@chunk_hash@dtype` plus the
`kv_bytes`/`metadata` pair) lives in `tandem.kvpool.keys`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tandem.core.blockhash import le32
from tandem.core.lmcachehash import (
    PY312_NONE_HASH,
    check_chunk_size,
    lmcache03_chunk_hashes,
    lmcache_cbor_chunk_hashes,
    lmcache_cbor_none_hash,
    lmcache_chunk_hashes,
    lmcache_none_hash,
)

__all__ = [
    "LMCACHE_ADAPTER_PARAM",
    "LMCACHE_SALT_PARAM",
    "NONE_HASH",
    "PY312_NONE_HASH",
    "ChunkHashScheme",
    "LMCache03Hash",
    "LMCacheCborHash",
    "LMCacheHash",
    "PoolScope",
    "Scope",
    "TandemHash",
    "chunk_hashes",
    "keyed_chunk_hashes",
    "lmcache03_chunk_hashes",
    "lmcache_cbor_chunk_hashes",
    "lmcache_cbor_none_hash",
    "lmcache_chunk_hashes",
    "lmcache_none_hash",
    "lmcache_params",
    "lmcache_salt_tag",
    "lmcache_tags",
    "scope_root",
]

NONE_HASH = 0
#: BLAKE2b personalisations (at most 16 bytes) keep the keyed chain, its roots and unkeyed scope roots
#: in separate domains: no chunk hash can be replayed as a root or the reverse.
_CHAIN_PERSON = b"tandem-kv-chain"
_ROOT_PERSON = b"tandem-kv-root"
_SCOPE_PERSON = b"tandem-kv-scope"
#: The largest BLAKE2b key.
MAX_KEY_BYTES = 64


def chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, parent: int = NONE_HASH) -> list[int]:
    """Tandem's chained hashes of every *full* chunk of `token_ids`; a partial tail chunk has none.

    `parent` continues a chain: `chunk_hashes(b, C, parent=chunk_hashes(a, C)[-1])` equals the tail of
    `chunk_hashes(a + b, C)` when `len(a)` is a multiple of `C` (the simulator extends block hashes
    this way as a sequence grows, instead of rehashing it from the start).
    """
    check_chunk_size(chunk_size)
    data = le32(token_ids[: len(token_ids) // chunk_size * chunk_size])  # every full chunk, packed at once
    stride = 4 * chunk_size
    hashes: list[int] = []
    for start in range(0, len(data), stride):
        digest = hashlib.sha256(parent.to_bytes(8, "big", signed=True))
        digest.update(data[start : start + stride])
        parent = int.from_bytes(digest.digest()[:8], "big", signed=True)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class PoolScope:
    """Whose chunks a prompt's are: the request's `cache_salt` (the tenant's) and the LoRA adapter it
    runs under, by name (vLLM's `request.lora_request.lora_name`; the gateway's `model`). None or ""
    in either: none (vLLM treats an empty salt as none). `PoolScope()` is the shared base-model scope.

    The adapter's path is left out on purpose: prefill and decode engines resolve one adapter at
    different paths, and the gateway, which computes the same keys, knows only the name (docs/kvpool.md).
    """

    cache_salt: str | None = None
    lora_name: str | None = None
    #: The engines' KV-layout generation (the `tandem.dev/kv-layout` label's value: what makes one
    #: engine's KV unreadable to another, an image or a KV-relevant argument), when the engines put it
    #: in their keys (the operator's engines do): engines of two generations never share a chunk.
    kv_layout: str | None = None


#: A scope as the key functions take it: a `PoolScope`, a bare `cache_salt` (shorthand for
#: `PoolScope(cache_salt=s)`), or None (the shared base-model scope).
Scope = PoolScope | str | None

#: The LMCache request config whose value LMCache 0.5.6 adds to its keys as the tag `lora%<value>`.
LMCACHE_ADAPTER_PARAM = "lmcache.tag.lora"
#: The one for the request's `cache_salt` (the tenant's), the tag `salt%<value>`; its value is
#: `lmcache_salt_tag(salt)`, not the salt.
LMCACHE_SALT_PARAM = "lmcache.tag.salt"
_SALT_TAG_PERSON = b"tandem-lmc-salt"


def lmcache_salt_tag(salt: str) -> str:
    """The value of a salt's LMCache tag: BLAKE2b-128 of the salt (personalised), in hex. LMCache
    writes tags into its key names, which anyone who can list the pool reads; a one-way hash keeps
    two salts apart there without showing the salt itself (with which a client of an engine could
    reach that tenant's prefix cache in vLLM).

    >>> len(lmcache_salt_tag("t1-ab")), lmcache_salt_tag("t1-ab") == lmcache_salt_tag("t1-ac")
    (32, False)
    """
    return hashlib.blake2b(salt.encode(), digest_size=16, person=_SALT_TAG_PERSON).hexdigest()


def lmcache_params(*, adapter: str | None = None, salt: str | None = None) -> dict[str, str]:
    """The LMCache request configs the gateway sends with a request to LMCache engines (in its
    `kv_transfer_params`), in the order LMCache appends them to its keys: the adapter's tag, then the
    salt's (`lmcache_salt_tag`); empty for a base-model request without a salt (module docstring).

    >>> lmcache_params(adapter="sql", salt="t1-ab") == {
    ...     "lmcache.tag.lora": "sql", "lmcache.tag.salt": lmcache_salt_tag("t1-ab")}
    True
    """
    params: dict[str, str] = {}
    if adapter:
        params[LMCACHE_ADAPTER_PARAM] = adapter
    if salt:
        params[LMCACHE_SALT_PARAM] = lmcache_salt_tag(salt)
    return params


def lmcache_tags(scope: Scope) -> str:
    """What LMCache 0.5.6's `CacheEngineKey.to_string()` appends for a request in `scope` that the
    gateway tagged (`lmcache_params`): `@lora%<name>` for an adapter's, `@salt%<lmcache_salt_tag>` for
    a salted one, both in that order, nothing for the shared base scope (module docstring).

    >>> lmcache_tags(PoolScope(lora_name="sql")), lmcache_tags(None)
    ('@lora%sql', '')
    >>> lmcache_tags(PoolScope(lora_name="sql", cache_salt="t1")) == "@lora%sql" + lmcache_tags("t1")
    True
    """
    if isinstance(scope, PoolScope):
        params = lmcache_params(adapter=scope.lora_name, salt=scope.cache_salt)
    else:
        params = lmcache_params(salt=scope)
    return "".join(f"@{name.removeprefix('lmcache.tag.')}%{value}" for name, value in params.items())


def scope_root(scope: Scope = None, *, key: bytes | None = None) -> int:
    """The parent of a scope's first chunk, `h_{-1}` (module docstring): the one function every writer
    and reader of Tandem's keys roots a prompt's chain with. `scope`: `PoolScope` (salt and adapter), a
    bare salt, or None; the scope is encoded by `_scope_bytes` (empty for the shared base scope).

    - no key, the shared base scope: `NONE_HASH` (0), so `TandemHash()` is the chain Tandem always wrote;
    - no key, another scope: BLAKE2b-64 of the scope's bytes (personalised): separate, not secret;
    - a key: keyed BLAKE2b-64 of the scope's bytes, the shared scope included (an empty message), so
      keyed and unkeyed pools never share a key.

    Base-model scopes hash what they hashed before adapters joined the pool (a salt `s`:
    `"cache_salt\x1f" + s`), so chunks already stored keep their keys.

    >>> scope_root() == scope_root(PoolScope()) == NONE_HASH
    True
    >>> scope_root("tenant-a") == scope_root(PoolScope(cache_salt="tenant-a")) != scope_root("tenant-b")
    True
    >>> len({scope_root(PoolScope(lora_name=a)) for a in (None, "sql", "chat")})
    3
    >>> scope_root(key=b"k") != scope_root(key=b"l")
    True
    """
    message = _scope_bytes(scope)
    if key is None:
        if not message:
            return NONE_HASH
        digest = hashlib.blake2b(message, digest_size=8, person=_SCOPE_PERSON).digest()
    else:
        digest = hashlib.blake2b(message, digest_size=8, key=_checked_key(key), person=_ROOT_PERSON).digest()
    return int.from_bytes(digest, "big", signed=True)


def keyed_chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, key: bytes, parent: int) -> list[int]:
    """The keyed chain: `h_i = BLAKE2b-64(key, person="tandem-kv-chain")(be64(h_{i-1}) || le32(chunk_i))`,
    signed big-endian, over every full chunk, from `parent` (`scope_root(scope, key=key)` for a prompt's
    start, the last hash to continue a chain as `chunk_hashes` does).

    Worked example (tests/core/test_kvkeys_tandem.py pins it): key `bytes(range(32))`, chunk size 2,
    tokens `[1, 2, 3, 4, 5]`, shared scope: the root is 2069546087608350159; chunk 0 hashes
    `be64(root) || 01 00 00 00 02 00 00 00` to 6521123471800769786, chunk 1 continues from it, and
    the 5th token (a partial chunk) has no hash.
    """
    check_chunk_size(chunk_size)
    data = le32(token_ids[: len(token_ids) // chunk_size * chunk_size])
    stride = 4 * chunk_size
    template = hashlib.blake2b(digest_size=8, key=_checked_key(key), person=_CHAIN_PERSON)
    hashes: list[int] = []
    for start in range(0, len(data), stride):
        digest = template.copy()  # the keyed state, built once: a copy per chunk is cheaper than a new key
        digest.update(parent.to_bytes(8, "big", signed=True))
        digest.update(data[start : start + stride])
        parent = int.from_bytes(digest.digest(), "big", signed=True)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class TandemHash:
    """Tandem's chain (module docstring): the simulator and Tandem's vLLM connector. `key` is the pool
    secret (1 to 64 bytes; `tandem.kvpool.client.pool_key_from_env`) or None for the unkeyed SHA-256
    chain; it never appears in a repr.

    `root(scope)` and `extend(tokens, C, parent=...)` split `chunk_hashes` for writers that grow a
    chain as a sequence grows (the simulator's blocks):
    `extend(b, C, parent=chunk_hashes(a, C, scope=s)[-1])` is the tail of `chunk_hashes(a + b, C, scope=s)`
    when `len(a)` is a multiple of `C`.
    """

    key: bytes | None = field(default=None, repr=False)
    name: ClassVar[str] = "tandem"
    #: Whether the keys carry the scope (salt and adapter): readers may rely on them to keep tenants'
    #: and adapters' KV apart.
    carries_scope: ClassVar[bool] = True
    #: Whether the keys carry the adapter (in the chain here; as a tag in LMCache's).
    carries_adapter: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.key is not None:
            _checked_key(self.key)

    def root(self, scope: Scope = None) -> int:
        """The parent of the first chunk in `scope` (`scope_root`)."""
        return scope_root(scope, key=self.key)

    def extend(self, token_ids: Sequence[int], chunk_size: int, *, parent: int) -> list[int]:
        """The chain over `token_ids`' full chunks from `parent`."""
        if self.key is None:
            return chunk_hashes(token_ids, chunk_size, parent=parent)
        return keyed_chunk_hashes(token_ids, chunk_size, key=self.key, parent=parent)

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int, *, scope: Scope = None) -> list[int]:
        """The hash of every full chunk of a prompt in `scope` (`PoolScope`: salt and adapter; a bare
        salt; None: shared)."""
        return self.extend(token_ids, chunk_size, parent=self.root(scope))


@dataclass(frozen=True, slots=True)
class LMCacheHash:
    """LMCache's builtin-hash chain from the engines' NONE_HASH (`lmcache_chunk_hashes`)."""

    none_hash: int
    name: ClassVar[str] = "lmcache"
    carries_scope: ClassVar[bool] = True  # not the chain: the keys' tags (`lmcache_tags`)
    carries_adapter: ClassVar[bool] = True  # as a tag (`lmcache_tags`)

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int, *, scope: Scope = None) -> list[int]:
        """LMCache's keys for the prompt; `scope` is ignored, as LMCache ignores `cache_salt` and the
        adapter."""
        del scope  # LMCache 0.5.6's keys carry neither salt nor adapter (module docstring)
        return lmcache_chunk_hashes(token_ids, chunk_size, none_hash=self.none_hash)


@dataclass(frozen=True, slots=True)
class LMCacheCborHash:
    """LMCache's `sha256_cbor` chain from the engines' NONE_HASH (`lmcache_cbor_chunk_hashes`).
    `builtin_none_hash`: the same engines' builtin NONE_HASH (`lmcache_none_hash`) where there is one,
    for readers that also try LMCache 0.3's keys (0.3 does not know `sha256_cbor` and hashes with
    Python's `hash`; `tandem.kvpool.engine_keys.key_alternatives`)."""

    none_hash: int
    builtin_none_hash: int | None = None
    name: ClassVar[str] = "lmcache-sha256_cbor"
    carries_scope: ClassVar[bool] = True  # not the chain: the keys' tags (`lmcache_tags`)
    carries_adapter: ClassVar[bool] = True  # as a tag (`lmcache_tags`)

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int, *, scope: Scope = None) -> list[int]:
        """LMCache's keys for the prompt; `scope` is ignored, as LMCache ignores `cache_salt` and the
        adapter."""
        del scope  # LMCache 0.5.6's keys carry neither salt nor adapter (module docstring)
        return lmcache_cbor_chunk_hashes(token_ids, chunk_size, none_hash=self.none_hash)


@dataclass(frozen=True, slots=True)
class LMCache03Hash:
    """LMCache 0.3's builtin-hash chain (`lmcache03_chunk_hashes`); its keys have another layout
    (`tandem.kvpool.keys.PoolKeys`)."""

    none_hash: int
    name: ClassVar[str] = "lmcache-0.3"
    carries_scope: ClassVar[bool] = False  # LMCache's keys carry neither salt nor adapter
    carries_adapter: ClassVar[bool] = False  # LMCache 0.3 has no tags

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int, *, scope: Scope = None) -> list[int]:
        """LMCache 0.3's keys for the prompt; `scope` is ignored, as LMCache ignores `cache_salt` and
        the adapter."""
        del scope  # neither does LMCache 0.3
        return lmcache03_chunk_hashes(token_ids, chunk_size, none_hash=self.none_hash)


#: How a writer hashes a prompt's chunks.
ChunkHashScheme = TandemHash | LMCacheHash | LMCacheCborHash | LMCache03Hash


def _scope_bytes(scope: Scope) -> bytes:
    """A scope as the roots hash it, one-to-one (no two scopes share bytes):

    - the shared base scope: b"";
    - a salt `s` alone: `"cache_salt\x1f" + utf8(s)` (as before adapters joined the pool);
    - an adapter `a`: `"lora_name\x1f" + be64(len(utf8(a))) + utf8(a)`, followed by the salt's bytes
      above when there is a salt;
    - a KV layout `g`: `"kv_layout\x1f" + be64(len(utf8(g))) + utf8(g)`, followed by all of the above.

    Base encodings start with `c` or are empty, adapter encodings with `l`, layout encodings with `k`;
    a length prefix ends each name, so what follows it is the rest alone. Example: adapter `sql`, no
    salt → `6c6f72615f6e616d651f` `0000000000000003` `73716c`.
    """
    if isinstance(scope, PoolScope):
        salt, adapter, layout = scope.cache_salt, scope.lora_name, scope.kv_layout
    else:
        salt, adapter, layout = scope, None, None
    salted = b"cache_salt\x1f" + salt.encode() if salt else b""
    if adapter:
        name = adapter.encode()
        salted = b"lora_name\x1f" + len(name).to_bytes(8, "big") + name + salted
    if not layout:
        return salted
    generation = layout.encode()
    return b"kv_layout\x1f" + len(generation).to_bytes(8, "big") + generation + salted


def _checked_key(key: bytes) -> bytes:
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"a pool key must be 1 to {MAX_KEY_BYTES} bytes, got {len(key)}")
    return key
