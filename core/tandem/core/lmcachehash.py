"""LMCache's chained chunk hashes, computed outside the engine: the builtin-hash chain of LMCache 0.5.6
and of LMCache 0.3, and the `sha256_cbor` one (the schemes, their roots and why this process can
reproduce them are in `tandem.core.kvkeys`' docstring, which re-exports these names).

Pure functions of token ids and a NONE_HASH: the key schemes (`tandem.core.kvkeys.LMCacheHash`,
`LMCacheCborHash`, `LMCache03Hash`) call them, so each chain is written once. Like Tandem's chain they
hash full chunks only: a prompt's partial tail chunk has no hash.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

from tandem.core.pyhash import parse_seed, str_hash

__all__ = [
    "PY312_NONE_HASH",
    "VLLM_DEFAULT_NONE_HASH_SEED",
    "check_chunk_size",
    "lmcache03_chunk_hashes",
    "lmcache_cbor_chunk_hashes",
    "lmcache_cbor_none_hash",
    "lmcache_chunk_hashes",
    "lmcache_none_hash",
]

#: `hash(None)` on CPython 3.12 and later (a constant there; the object's address before).
PY312_NONE_HASH = 4238894112
#: vLLM 0.32's NONE_HASH seed for a cryptographic hash when PYTHONHASHSEED is unset
#: (`kv_cache_utils.DEFAULT_NONE_HASH_SEED`).
VLLM_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def lmcache_none_hash(python_hash_seed: str | None) -> int | None:
    """LMCache's NONE_HASH (the first chunk's parent) in engines whose environment has
    `PYTHONHASHSEED=python_hash_seed`, or None where nobody can reproduce it (unset or `random`: the
    engine's str hashes are random; `tandem.core.kvkeys`' docstring).

    It is `hash(python_hash_seed)` as the engine computes it. `""` gives 0 (vLLM reads the empty value
    as a seed and the empty string hashes to 0 under any secret). Example: `"0"` → 5313149338359954478.
    """
    if python_hash_seed is None:
        return None
    if python_hash_seed == "":
        return 0
    seed = parse_seed(python_hash_seed)
    return None if seed is None else str_hash(python_hash_seed, seed=seed)


def lmcache_chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, none_hash: int) -> list[int]:
    """LMCache 0.5.6's chained hashes of every full chunk of `token_ids` (`tandem.core.kvkeys`'
    docstring), starting from `none_hash` (`lmcache_none_hash`). Example: under PYTHONHASHSEED=0, the
    chunk `range(256)` hashes to `hash((5313149338359954478, tuple(range(256)), ()))`."""
    return _builtin_chain(token_ids, chunk_size, none_hash=none_hash, extra=())


def lmcache03_chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, none_hash: int) -> list[int]:
    """LMCache 0.3's chain (`tandem.core.kvkeys`' docstring): `hash((parent, tuple(chunk), None))` as
    an engine on CPython ≥ 3.12 computes it, from `none_hash`."""
    return _builtin_chain(token_ids, chunk_size, none_hash=none_hash, extra=PY312_NONE_HASH)


def lmcache_cbor_none_hash(python_hash_seed: str | None) -> int:
    """LMCache's NONE_HASH under `sha256_cbor` in engines whose PYTHONHASHSEED is `python_hash_seed`
    (None: unset, vLLM 0.32's fixed seed): the first 8 bytes, big-endian, of SHA-256 over the seed's
    CBOR text string. Example: `"0"` hashes `61 30` (a 1-byte text, "0")."""
    seed = VLLM_DEFAULT_NONE_HASH_SEED if python_hash_seed is None else python_hash_seed
    encoded = seed.encode()
    return _fold(hashlib.sha256(_cbor_head(3, len(encoded)) + encoded).digest())


def lmcache_cbor_chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, none_hash: int) -> list[int]:
    """LMCache 0.5.6's chain under `sha256_cbor` (`tandem.core.kvkeys`' docstring) over every full
    chunk, from `none_hash` (`lmcache_cbor_none_hash`). Each chunk hashes the CBOR array
    `[parent, [tokens...], []]`: `83`, the parent as an unsigned int, `99 01 00` and 256 token ints
    for a 256-token chunk, `80`. Token ids must be non-negative (they are)."""
    check_chunk_size(chunk_size)
    hashes: list[int] = []
    parent = none_hash
    head = _cbor_head(4, chunk_size)
    table = _small_uints()
    for start in range(0, len(token_ids) - chunk_size + 1, chunk_size):
        chunk = token_ids[start : start + chunk_size]
        tokens = b"".join(
            [
                table[t]
                if 0 <= t < _TABLE_SIZE
                else b"\x1a" + t.to_bytes(4, "big")
                if t < 1 << 32
                else _cbor_uint(t)
                for t in chunk
            ]
        )
        parent = _fold(hashlib.sha256(b"\x83" + _cbor_uint(parent) + head + tokens + b"\x80").digest())
        hashes.append(parent)
    return hashes


def check_chunk_size(chunk_size: int) -> None:
    """Refuses a chunk size that is not positive (every chain here and in `tandem.core.kvkeys`)."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")


#: Token ids below this are encoded from a table, larger ones (up to 2**32) inline as `1a` + 4 bytes:
#: 8,192 tokens of a 152k vocabulary in ~2 ms against 10 ms encoding each id with `_cbor_uint`.
_TABLE_SIZE = 1 << 16


@functools.cache
def _small_uints() -> tuple[bytes, ...]:
    """The CBOR encoding of every int below `_TABLE_SIZE` (built once, on first use: ~40 ms)."""
    return tuple(_cbor_head(0, value) for value in range(_TABLE_SIZE))


def _fold(digest: bytes) -> int:
    """LMCache's `_normalize_hash_to_int`: a digest's first 8 bytes as a big-endian unsigned int."""
    return int.from_bytes(digest[:8], "big")


def _cbor_uint(value: int) -> bytes:
    """A non-negative int as CBOR (major type 0, shortest form, as cbor2 writes it)."""
    if value < 0:
        raise ValueError(f"only non-negative ints are encoded here, got {value}")
    return _cbor_head(0, value)


def _cbor_head(major: int, argument: int) -> bytes:
    """A CBOR item head: the major type and its argument (a value, a length) in the shortest form."""
    if argument < 24:
        return bytes((major << 5 | argument,))
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if argument < 1 << (8 * size):
            return bytes((major << 5 | info,)) + argument.to_bytes(size, "big")
    raise ValueError(f"{argument} does not fit CBOR's 64-bit argument")


def _builtin_chain(token_ids: Sequence[int], chunk_size: int, *, none_hash: int, extra: object) -> list[int]:
    """LMCache's chain over full chunks: `hash((parent, tuple(chunk), extra))` from `none_hash`."""
    check_chunk_size(chunk_size)
    hashes: list[int] = []
    parent = none_hash
    for start in range(0, len(token_ids) - chunk_size + 1, chunk_size):
        parent = hash((parent, tuple(token_ids[start : start + chunk_size]), extra))
        hashes.append(parent)
    return hashes
