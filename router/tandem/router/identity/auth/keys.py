"""The API key table: which key belongs to which tenant (pure: parsing and look-up only).

The table is a YAML mapping `key: tenant`, one entry per line, which is what a Kubernetes Secret key
mounted as a file holds (docs/security.md, "API keys and rate limits"):

    # key                                                                   tenant
    sk-team-a-4f9c2e7d1b8a6035: team-a
    sha256:3b2c6e1f...64 hex digits...: team-b     # only the SHA-256 of the key is stored

A key written `sha256:<64 hex digits>` is stored as its hash: the file then never holds the key itself
(`printf %s "$KEY" | sha256sum` gives the digest). Keys are printable ASCII without spaces (what an
`Authorization: Bearer` header can carry); tenants are non-empty strings of at most 128 characters.

Look-up hashes the presented key with SHA-256 and compares that digest with *every* entry's digest
with `hmac.compare_digest`, without stopping at the first match: the time taken depends on the number
of entries, not on how much of a key was right. The table keeps digests only, never the keys.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

HASH_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"^[0-9a-fA-F]{64}$")
_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space
MAX_TENANT_LENGTH = 128


class KeyTableError(ValueError):
    """The key file is not a valid table; the message names the entry (never the key itself)."""


def digest(key: str) -> bytes:
    """SHA-256 of a key as presented by a client (UTF-8)."""
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class KeyTable:
    """Key digests and their tenants, in file order."""

    entries: tuple[tuple[bytes, str], ...]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(tenant for _, tenant in self.entries)

    def tenant_for(self, key: str) -> str | None:
        """The tenant of `key`, or None; compares against every entry in constant time each."""
        presented = digest(key)
        found: str | None = None
        for stored, tenant in self.entries:
            # No early exit: every entry is compared whatever the outcome.
            if hmac.compare_digest(presented, stored) and found is None:
                found = tenant
        return found


def parse_key_table(text: str) -> KeyTable:
    """Parse the key file's text. Raises `KeyTableError` for anything but a mapping of valid keys to
    tenants; an empty file is an empty table (every request is refused)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise KeyTableError(f"not valid YAML{where}") from None
    if document is None:
        return KeyTable(())
    if not isinstance(document, Mapping):
        raise KeyTableError(f"expected a mapping of key: tenant, got {type(document).__name__}")
    entries: list[tuple[bytes, str]] = []
    seen: set[bytes] = set()
    for index, (key, tenant) in enumerate(document.items(), start=1):
        stored = _stored_digest(key, index=index)
        if not isinstance(tenant, str) or not tenant.strip() or len(tenant) > MAX_TENANT_LENGTH:
            raise KeyTableError(
                f"entry {index}: the tenant must be a non-empty string of at most "
                f"{MAX_TENANT_LENGTH} characters"
            )
        if stored in seen:
            raise KeyTableError(f"entry {index}: the same key is listed twice")
        seen.add(stored)
        entries.append((stored, tenant.strip()))
    return KeyTable(tuple(entries))


def _stored_digest(key: object, *, index: int) -> bytes:
    if not isinstance(key, str) or not _KEY_CHARS.match(key):
        # The message never quotes the key: the file is a secret.
        raise KeyTableError(f"entry {index}: a key must be a string of printable ASCII without spaces")
    if key.startswith(HASH_PREFIX):
        hex_digest = key.removeprefix(HASH_PREFIX)
        if not _HEX_DIGEST.match(hex_digest):
            raise KeyTableError(f"entry {index}: a {HASH_PREFIX} key needs 64 hexadecimal digits")
        return bytes.fromhex(hex_digest)
    return digest(key)
