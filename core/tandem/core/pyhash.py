"""CPython's `hash()` of a `str`, as another process computes it under a given `PYTHONHASHSEED`.

A process's string hashes depend on its hash secret, which CPython fills at start-up from
`PYTHONHASHSEED` (Python/bootstrap_hash.c, `_Py_HashRandomization_Init`):

- `0`: the secret is all zeros (randomisation off);
- `N` in 1..4294967295: the secret's bytes come from a linear congruential generator seeded with `N`
  (`lcg_urandom`: `x = x * 214013 + 2531011 (mod 2**32)`, byte = `(x >> 16) & 0xff`);
- unset, empty or `random`: random bytes from the OS; nobody else can reproduce the hashes.

The hash itself (Python/pyhash.c) is SipHash-1-3 keyed with the secret's first 16 bytes (two
little-endian uint64, k0 then k1) over the string's canonical buffer: 1 byte per character when every
character is below U+0100, else 2 (below U+10000) or 4, little-endian; read as a signed 64-bit int,
-1 becomes -2, and the empty string hashes to 0. SipHash-1-3 is CPython's default since 3.11 (3.4-3.10
used SipHash-2-4, so those versions hash differently); a CPython built with another
`--with-hash-algorithm` does too. Checked against `PYTHONHASHSEED=N python3.11 -c 'print(hash(s))'`
(tests/core/test_pyhash.py). Worked example: under `PYTHONHASHSEED=0`, `hash("0")` is
5313149338359954478.

Pure: no I/O, no dependence on this process's own `PYTHONHASHSEED`.
"""

from __future__ import annotations

import re

__all__ = ["MAX_SEED", "hash_secret", "parse_seed", "siphash13", "str_hash"]

MAX_SEED = 2**32 - 1
_MASK = 2**64 - 1
_SEED = re.compile(r"[0-9]+")


def parse_seed(value: str | None) -> int | None:
    """The seed a `PYTHONHASHSEED` value fixes, or None when it leaves hashes random or is not a plain
    decimal in 0..4294967295 (unset, `""`, `random`; CPython refuses to start on other values, bar
    `strtoul`'s leniencies such as `+1` or leading blanks, which are not worth reproducing).

    >>> parse_seed("0"), parse_seed("42"), parse_seed("random"), parse_seed(None)
    (0, 42, None, None)
    """
    if value is None or not _SEED.fullmatch(value):
        return None
    seed = int(value)
    return seed if seed <= MAX_SEED else None


def hash_secret(seed: int) -> tuple[int, int]:
    """SipHash's (k0, k1) in a process started with `PYTHONHASHSEED=seed` (module docstring)."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"PYTHONHASHSEED must be in 0..{MAX_SEED}, got {seed}")
    if seed == 0:
        return 0, 0
    secret = bytearray()
    x = seed
    for _ in range(16):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        secret.append((x >> 16) & 0xFF)
    return int.from_bytes(secret[:8], "little"), int.from_bytes(secret[8:], "little")


def _rotl(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & _MASK


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    """One SipRound."""
    v0 = (v0 + v1) & _MASK
    v2 = (v2 + v3) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v3 = _rotl(v3, 16) ^ v2
    v0 = _rotl(v0, 32)
    v2 = (v2 + v1) & _MASK
    v0 = (v0 + v3) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v3 = _rotl(v3, 21) ^ v0
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(k0: int, k1: int, data: bytes) -> int:
    """SipHash-1-3 of `data` (unsigned 64-bit), as CPython's pyhash.c computes it."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    whole = len(data) - len(data) % 8
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        v3 ^= word
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
        v0 ^= word
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v3 ^= last
    v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def str_hash(text: str, *, seed: int) -> int:
    """`hash(text)` in a 64-bit CPython ≥ 3.11 started with `PYTHONHASHSEED=seed` (module docstring)."""
    if not text:
        return 0
    widest = max(map(ord, text))
    width = 1 if widest < 0x100 else 2 if widest < 0x10000 else 4
    data = b"".join(ord(char).to_bytes(width, "little") for char in text)
    value = siphash13(*hash_secret(seed), data)
    signed = value - 2**64 if value >= 2**63 else value
    return -2 if signed == -1 else signed
