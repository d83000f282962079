"""The chained chunk hashes of the KV pool's keys: Tandem's own, and LMCache's.

Both chain over full chunks only, so chunk i identifies the whole prefix up to its end:
`h_i = H(h_{i-1}, tokens[i*C:(i+1)*C])`; a prompt's partial tail chunk has no hash. Both can be
negative (keys then read `...@-7cfefdccc681b183@...`).

- Tandem's (`chunk_hashes`, `TandemHash`): the simulator's block hashes and Tandem's vLLM connector.
  `h_{-1} = 0`, H = the first 8 bytes (big-endian, signed) of SHA-256 over the parent as 8 signed
  big-endian bytes followed by the tokens as little-endian uint32 (ids above 2**32-1 are reduced mod
  2**32). The same in every process, whatever PYTHONHASHSEED is.
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
- LMCache 0.3's (`lmcache03_chunk_hashes`, `LMCache03Hash`): LMCache 0.3.9 (the default engine image's,
  `lmcache/vllm-openai:v0.3.9`) hashes `(parent, tuple(chunk), None)` from the same NONE_HASH. `None`
  hashes to the constant 4238894112 on CPython ≥ 3.12 (the vLLM images' Python; on 3.11 and earlier
  it is the object's address, so such engines' keys differ per process), and a tuple's hash depends
  only on its elements' hashes, so the int 4238894112 stands in for it here (`PY312_NONE_HASH`).
  Checked against LMCache 0.3.9's own `ChunkedTokenDatabase` in a vLLM 0.11 process (the known-answer
  keys in tests/core/test_kvkeys_lmcache03.py).

The pool's key layout built on them (LMCache's `model@world_size@worker_id@chunk_hash@dtype` plus the
`kv_bytes`/`metadata` pair) lives in `tandem.kvpool.keys`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from tandem.core.blockhash import le32
from tandem.core.pyhash import parse_seed, str_hash

__all__ = [
    "NONE_HASH",
    "PY312_NONE_HASH",
    "ChunkHashScheme",
    "LMCache03Hash",
    "LMCacheHash",
    "TandemHash",
    "chunk_hashes",
    "lmcache03_chunk_hashes",
    "lmcache_chunk_hashes",
    "lmcache_none_hash",
]

NONE_HASH = 0
#: `hash(None)` on CPython 3.12 and later (a constant there; the object's address before).
PY312_NONE_HASH = 4238894112


def chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, parent: int = NONE_HASH) -> list[int]:
    """Tandem's chained hashes of every *full* chunk of `token_ids`; a partial tail chunk has none.

    `parent` continues a chain: `chunk_hashes(b, C, parent=chunk_hashes(a, C)[-1])` equals the tail of
    `chunk_hashes(a + b, C)` when `len(a)` is a multiple of `C` (the simulator extends block hashes
    this way as a sequence grows, instead of rehashing it from the start).
    """
    _check(chunk_size)
    data = le32(token_ids[: len(token_ids) // chunk_size * chunk_size])  # every full chunk, packed at once
    stride = 4 * chunk_size
    hashes: list[int] = []
    for start in range(0, len(data), stride):
        digest = hashlib.sha256(parent.to_bytes(8, "big", signed=True))
        digest.update(data[start : start + stride])
        parent = int.from_bytes(digest.digest()[:8], "big", signed=True)
        hashes.append(parent)
    return hashes


def lmcache_none_hash(python_hash_seed: str | None) -> int | None:
    """LMCache's NONE_HASH (the first chunk's parent) in engines whose environment has
    `PYTHONHASHSEED=python_hash_seed`, or None where nobody can reproduce it (unset or `random`: the
    engine's str hashes are random; module docstring).

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
    """LMCache 0.5.6's chained hashes of every full chunk of `token_ids` (module docstring), starting
    from `none_hash` (`lmcache_none_hash`). Example: under PYTHONHASHSEED=0, the chunk `range(256)`
    hashes to `hash((5313149338359954478, tuple(range(256)), ()))`."""
    return _builtin_chain(token_ids, chunk_size, none_hash=none_hash, extra=())


def lmcache03_chunk_hashes(token_ids: Sequence[int], chunk_size: int, *, none_hash: int) -> list[int]:
    """LMCache 0.3's chain (module docstring): `hash((parent, tuple(chunk), None))` as an engine on
    CPython ≥ 3.12 computes it, from `none_hash`."""
    return _builtin_chain(token_ids, chunk_size, none_hash=none_hash, extra=PY312_NONE_HASH)


def _builtin_chain(token_ids: Sequence[int], chunk_size: int, *, none_hash: int, extra: object) -> list[int]:
    """LMCache's chain over full chunks: `hash((parent, tuple(chunk), extra))` from `none_hash`."""
    _check(chunk_size)
    hashes: list[int] = []
    parent = none_hash
    for start in range(0, len(token_ids) - chunk_size + 1, chunk_size):
        parent = hash((parent, tuple(token_ids[start : start + chunk_size]), extra))
        hashes.append(parent)
    return hashes


@dataclass(frozen=True, slots=True)
class TandemHash:
    """Tandem's SHA-256 chain (`chunk_hashes`): the simulator and Tandem's vLLM connector."""

    name: ClassVar[str] = "tandem"

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int) -> list[int]:
        return chunk_hashes(token_ids, chunk_size)


@dataclass(frozen=True, slots=True)
class LMCacheHash:
    """LMCache's builtin-hash chain from the engines' NONE_HASH (`lmcache_chunk_hashes`)."""

    none_hash: int
    name: ClassVar[str] = "lmcache"

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int) -> list[int]:
        return lmcache_chunk_hashes(token_ids, chunk_size, none_hash=self.none_hash)


@dataclass(frozen=True, slots=True)
class LMCache03Hash:
    """LMCache 0.3's builtin-hash chain (`lmcache03_chunk_hashes`); its keys have another layout
    (`tandem.kvpool.keys.PoolKeys`)."""

    none_hash: int
    name: ClassVar[str] = "lmcache-0.3"

    def chunk_hashes(self, token_ids: Sequence[int], chunk_size: int) -> list[int]:
        return lmcache03_chunk_hashes(token_ids, chunk_size, none_hash=self.none_hash)


#: How a writer hashes a prompt's chunks.
ChunkHashScheme = TandemHash | LMCacheHash | LMCache03Hash


def _check(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
