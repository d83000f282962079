"""LMCache's chunk hashes and NONE_HASH (`tandem.core.kvkeys`), computed in this process as LMCache
0.5.6 computes them inside a vLLM 0.32 engine started with a PYTHONHASHSEED.

Real: a child CPython started with that PYTHONHASHSEED runs LMCache's formula verbatim (vLLM's
`init_none_hash` with Python's `hash`: `NONE_HASH = hash(os.environ["PYTHONHASHSEED"])`, then
`ChunkedTokenDatabase._prefix_hash` over full chunks: `hash((prefix, tuple(chunk), ()))`). Faked:
LMCache and vLLM themselves (tests/kvpool/test_lmcache_keys_vllm.py runs LMCache's own code in
.venv-vllm).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.core.kvkeys import LMCacheHash, chunk_hashes, lmcache_chunk_hashes, lmcache_none_hash

CHUNK = 256
#: LMCache's formula, as its ChunkedTokenDatabase runs it with save_unfull_chunk False.
REFERENCE = """
import json, os, sys
chunk_size = int(sys.argv[1])
none_hash = hash(os.getenv("PYTHONHASHSEED"))
out = []
for tokens in json.loads(sys.argv[2]):
    end = len(tokens) - len(tokens) % chunk_size
    prefix, hashes = none_hash, []
    for i in range(0, end, chunk_size):
        prefix = hash((prefix, tuple(tokens[i : i + chunk_size]), ()))
        hashes.append(prefix)
    out.append(hashes)
print(json.dumps({"none_hash": none_hash, "chunks": out}))
"""
PROMPTS = [
    [],
    list(range(CHUNK - 1)),
    list(range(CHUNK)),
    list(range(1, 3 * CHUNK + 17)),
    [151643, 0, 2**31 - 1, 7] * (CHUNK // 2),
    [(i * 7919) % 152064 for i in range(5 * CHUNK)],
]


def _in_engine(seed: str, chunk_size: int, prompts: list[list[int]]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", REFERENCE, str(chunk_size), json.dumps(prompts)],
        env={"PYTHONHASHSEED": seed},
        capture_output=True,
        text=True,
        check=True,
    )
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


@pytest.mark.parametrize("seed", ["0", "1", "42", "123456789", "4294967295"])
def test_none_hash_and_chunk_hashes_are_the_engines_for_its_seed(seed: str) -> None:
    engine = _in_engine(seed, CHUNK, PROMPTS)
    none_hash = lmcache_none_hash(seed)
    assert none_hash is not None and none_hash == engine["none_hash"]
    assert [lmcache_chunk_hashes(p, CHUNK, none_hash=none_hash) for p in PROMPTS] == engine["chunks"]


def test_a_small_chunk_size_chains_the_same_way() -> None:
    prompts = [list(range(100)), list(range(50, 90))]
    engine = _in_engine("0", 16, prompts)
    assert [LMCacheHash(5313149338359954478).chunk_hashes(p, 16) for p in prompts] == engine["chunks"]


@pytest.mark.parametrize(
    ("seed", "none_hash"),
    [("0", 5313149338359954478), ("", 0), (None, None), ("random", None), ("-3", None)],
)
def test_none_hash_exists_only_for_a_seed_every_process_shares(
    seed: str | None, none_hash: int | None
) -> None:
    assert lmcache_none_hash(seed) == none_hash


def test_only_full_chunks_have_hashes_and_each_names_its_whole_prefix() -> None:
    tokens = list(range(3 * CHUNK + 5))
    hashes = lmcache_chunk_hashes(tokens, CHUNK, none_hash=0)
    assert len(hashes) == 3
    assert lmcache_chunk_hashes(tokens[: 2 * CHUNK], CHUNK, none_hash=0) == hashes[:2]
    changed = [9, *tokens[1:]]
    assert all(a != b for a, b in zip(lmcache_chunk_hashes(changed, CHUNK, none_hash=0), hashes, strict=True))
    assert hashes != chunk_hashes(tokens, CHUNK)  # Tandem's own chain is another scheme


def test_a_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        lmcache_chunk_hashes([1], 0, none_hash=0)
