"""Who is calling: the API key from the request's headers, checked against the key table.

Keys are read from `Authorization: Bearer <key>` (the scheme is case-insensitive), else from
`x-api-key: <key>`. With auth on, the tenant is the key's tenant and a tenant header sent by the
client is ignored; a missing or unknown key is a 401 (`invalid_api_key`) that never quotes the key.
With auth off (`KeyAuth` absent), the tenant comes from the fairness header as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from tandem.router.errors import Unauthenticated
from tandem.router.identity.auth.keys import KeyTable

AuthFailure = Literal["missing", "invalid"]

MISSING = "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
INVALID = "Incorrect API key provided."


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a client sent, or None."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


class KeyAuth:
    """A `TenantResolver` that authenticates: `table()` is the current key table (it may change
    between calls: reloads); `on_failure(reason)` counts refusals."""

    def __init__(
        self,
        table: Callable[[], KeyTable],
        *,
        on_failure: Callable[[AuthFailure], None] | None = None,
    ) -> None:
        self._table = table
        self._on_failure = on_failure or (lambda reason: None)

    def tenant(self, headers: Mapping[str, str], /) -> str:
        """The caller's tenant; raises `Unauthenticated` (401)."""
        key = presented_key(headers)
        if key is None:
            self._on_failure("missing")
            raise Unauthenticated(MISSING)
        tenant = self._table().tenant_for(key)
        if tenant is None:
            self._on_failure("invalid")
            raise Unauthenticated(INVALID)
        return tenant
