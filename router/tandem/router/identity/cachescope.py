"""Whose cached prompts a request may reuse: the tenant's `cache_salt`, from a keyed hash.

vLLM keeps one prefix cache per `cache_salt` (the salt enters the first block's hash, so two requests
with equal prompts and different salts share no block), and so do Tandem's simulator, the KV pool's
keys and the gateway's prefix indexes (`tandem.core.blockhash.scope_key`). The gateway sets the salt
on every request it sends to an engine; a client's own `cache_salt` is dropped at parsing
(`tandem.router.request.parse`). Without it, any tenant could tell by the time to first token, one
guess at a time, whether another tenant recently sent a given prefix (prompt leakage through shared
KV caches, NDSS 2025).

    salt(tenant) = "t1-" + hex(BLAKE2b-128(key = gateway's cache key, person = "tandem-salt",
                                           data = "group:" + group  if the tenant is in a sharing group
                                                  "tenant:" + tenant otherwise))

- **Isolation** (`mode="tenant"`, the default): each tenant has a cache of its own. Tenants that
  should share (a public system prompt served to many) are put in one *sharing group*
  (`spec.router.tenants[].cacheGroup`): the group's members have one salt, and nobody else does.
- `mode="off"`: no salt; every tenant shares one cache (the behaviour of routers without tenants).
- The key is the gateway's secret (`TANDEM_CACHE_KEY`, a Secret in a cluster): engines see salts but
  cannot tell which tenant one stands for, and nobody who lacks the key can produce a tenant's salt
  even if a request reaches an engine around the gateway. Gateways in front of the same engines must
  share the key, or their tenants' caches split (still isolated, less often hit).
- Isolation is as strong as the tenant's identity: with API keys on, the key's tenant; with them
  off, the tenant header, which any client can set to any name (docs/security.md).

The salt is computed per request (about a microsecond), so a flood of made-up tenant names keeps no
state here. Example: with key b"k" and no groups, tenants "a" and "b" get two different 35-character
salts, and "a" always the same one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Literal

CacheIsolation = Literal["tenant", "off"]
#: The salt's version prefix: a change of the derivation changes every salt (and cache) at once.
SALT_PREFIX = "t1-"
_PERSON = b"tandem-salt"


class CacheScopes:
    """`salt(tenant)` by the rules of the module docstring."""

    def __init__(
        self, *, key: bytes, mode: CacheIsolation = "tenant", groups: Mapping[str, str] | None = None
    ) -> None:
        if mode == "tenant" and len(key) < 16:
            raise ValueError("the cache key must be at least 16 bytes")
        self.mode: CacheIsolation = mode
        self._key = key[:64]  # BLAKE2b takes keys up to 64 bytes; a longer secret adds nothing
        self._groups = dict(groups or {})

    def salt(self, tenant: str) -> str | None:
        """The `cache_salt` of `tenant`'s requests; None when isolation is off."""
        if self.mode == "off":
            return None
        group = self._groups.get(tenant)
        scope = f"group:{group}" if group is not None else f"tenant:{tenant}"
        digest = hashlib.blake2b(scope.encode(), digest_size=16, key=self._key, person=_PERSON)
        return SALT_PREFIX + digest.hexdigest()

    def group(self, tenant: str) -> str | None:
        """The sharing group `tenant` belongs to, if any."""
        return self._groups.get(tenant)
