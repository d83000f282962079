"""CPython's str hash under a given PYTHONHASHSEED (`tandem.core.pyhash`), as another process has it.

Real: a child CPython (this interpreter, ≥ 3.11) started with each PYTHONHASHSEED prints `hash()` of
every string; `str_hash` must give the same numbers from this process, whatever its own seed is.
Nothing is faked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.core.pyhash import MAX_SEED, hash_secret, parse_seed, str_hash

SEEDS = [0, 1, 2, 7, 42, 12345, 2**31, MAX_SEED]
#: 1-, 2- and 4-byte characters, the empty string, lengths around SipHash's 8-byte words.
TEXTS = [
    "",
    "0",
    "1",
    "abcdefg",
    "abcdefgh",
    "abcdefghi",
    "vllm-none-hash",
    "é à",
    "日本語",
    "x🙂y",
    "a" * 100,
]


def _hashes_in_child(seed: int, texts: list[str]) -> list[int]:
    code = "import json, sys; print(json.dumps([hash(t) for t in json.loads(sys.argv[1])]))"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(texts)],
        env={"PYTHONHASHSEED": str(seed)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    hashes: list[int] = json.loads(out)
    return hashes


@pytest.mark.skipif(sys.version_info < (3, 11), reason="SipHash-1-3 is CPython's str hash from 3.11")
@pytest.mark.parametrize("seed", SEEDS)
def test_str_hash_is_what_a_process_started_with_that_seed_computes(seed: int) -> None:
    texts = [*TEXTS, str(seed)]
    assert [str_hash(text, seed=seed) for text in texts] == _hashes_in_child(seed, texts)


def test_the_worked_example_and_the_zero_seeds_all_zero_secret() -> None:
    assert hash_secret(0) == (0, 0)
    assert str_hash("0", seed=0) == 5313149338359954478
    assert str_hash("", seed=42) == 0


@pytest.mark.parametrize(
    ("value", "seed"),
    [
        ("0", 0),
        ("42", 42),
        ("007", 7),
        (str(MAX_SEED), MAX_SEED),
        (str(MAX_SEED + 1), None),
        ("random", None),
        ("", None),
        (None, None),
        ("-1", None),
        (" 1", None),
    ],
)
def test_parse_seed_accepts_only_a_plain_decimal_in_cpythons_range(
    value: str | None, seed: int | None
) -> None:
    assert parse_seed(value) == seed


def test_hash_secret_refuses_a_seed_cpython_refuses() -> None:
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        hash_secret(MAX_SEED + 1)
