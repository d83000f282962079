"""What a client asks of admission through headers: its tenant, its SLOs, its priority band.

| header | value | default |
|---|---|---|
| `x-tenant-id` (`spec.router.fairness.tenantHeader`) | any non-empty string | `default` |
| `x-slo-ttft-ms` | TTFT objective, milliseconds, (0, 3 600 000] | `spec.router.slo.ttftSeconds` |
| `x-slo-tpot-ms` | time per output token, milliseconds, (0, 60 000] | `spec.router.slo.tpotSeconds` |
| `x-priority` | integer band in [-10, 10], at most the tenant's band; higher first | the tenant's band |

A malformed value is the client's error (400 naming the header), not silently the default. A TTFT
objective the client sends is also its deadline: admission refuses the request at once (429) when
the queue ahead of it cannot clear in time, rather than serve it late; without the header the
default objective steers routing only.

**Priority is policy, not a request's wish.** A tenant's band is configured
(`spec.router.tenants[].priority`, 0 for tenants not listed); a request may only *lower* itself with
`x-priority` (when the tenant's `allowLowerPriority` is on, the default), never raise itself: a value
above the band is refused with 403, as is any value other than the band when lowering is not
allowed. The tenant is the API key's when auth is on, so a key decides the band; with auth off the
tenant header names the tenant, and the band is only as trustworthy as that header (docs/security.md).
Example: tenant `batch` with priority −2 sends `x-priority: -5` → band −5; `x-priority: 0` → 403.
The tenant comes from a `TenantResolver`: `HeaderTenant` with auth off, `KeyAuth`
(`tandem.router.identity.auth.gate`: the API key's tenant) with auth on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tandem.router.errors import Forbidden, InvalidRequest
from tandem.router.types import SLO

TTFT_HEADER = "x-slo-ttft-ms"
TPOT_HEADER = "x-slo-tpot-ms"
PRIORITY_HEADER = "x-priority"
MIN_PRIORITY, MAX_PRIORITY = -10, 10
DEFAULT_TENANT = "default"
#: Longest tenant name kept; longer values are cut (they end up in logs and metric labels).
MAX_TENANT_LENGTH = 128


class TenantResolver(Protocol):
    """Who sent a request, from its headers (case-insensitive mapping)."""

    def tenant(self, headers: Mapping[str, str], /) -> str: ...


class HeaderTenant:
    """The tenant named by one header (`spec.router.fairness.tenantHeader`), else `default`."""

    def __init__(self, header: str) -> None:
        self.header = header.lower()

    def tenant(self, headers: Mapping[str, str], /) -> str:
        value = (headers.get(self.header) or "").strip()
        return value[:MAX_TENANT_LENGTH] or DEFAULT_TENANT


def _milliseconds(headers: Mapping[str, str], name: str, *, limit_ms: float) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= limit_ms):  # also rejects NaN
        raise InvalidRequest(
            f"{name} must be a number of milliseconds in (0, {limit_ms:g}], got {raw!r}", param=name
        )
    return value


def slo_from_headers(headers: Mapping[str, str], *, default: SLO) -> SLO:
    """The request's SLO: each header overrides its default. Raises `InvalidRequest` (400)."""
    ttft_ms = _milliseconds(headers, TTFT_HEADER, limit_ms=3_600_000)
    tpot_ms = _milliseconds(headers, TPOT_HEADER, limit_ms=60_000)
    return SLO(
        ttft_s=default.ttft_s if ttft_ms is None else ttft_ms / 1000,
        tpot_s=default.tpot_s if tpot_ms is None else tpot_ms / 1000,
    )


def own_deadline(headers: Mapping[str, str], slo: SLO) -> float | None:
    """The request's own deadline to first token: its `x-slo-ttft-ms` when the client sent one. The
    spec's default objective is nobody's deadline (admission never refuses on it)."""
    return slo.ttft_s if TTFT_HEADER in headers else None


def requested_priority(headers: Mapping[str, str]) -> int | None:
    """The `x-priority` value, None when absent. Raises `InvalidRequest` (400) outside [-10, 10]."""
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = MAX_PRIORITY + 1
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidRequest(
            f"{PRIORITY_HEADER} must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {raw!r}",
            param=PRIORITY_HEADER,
        )
    return value


@dataclass(frozen=True, slots=True)
class TenantPriority:
    """A tenant's configured band and whether it may lower itself per request."""

    band: int = 0
    may_lower: bool = True


class PriorityPolicy:
    """Each tenant's band from the configuration; `priority(tenant, headers)` applies the rules of
    the module docstring. Tenants not in `tenants` get `default`."""

    def __init__(
        self,
        tenants: Mapping[str, TenantPriority] | None = None,
        *,
        default: TenantPriority = TenantPriority(),
    ) -> None:
        self._tenants = dict(tenants or {})
        self._default = default

    def of(self, tenant: str) -> TenantPriority:
        return self._tenants.get(tenant, self._default)

    def priority(self, tenant: str, headers: Mapping[str, str]) -> int:
        """The request's band. Raises `InvalidRequest` (400) for a malformed header and `Forbidden`
        (403) for one above the tenant's band, or different from it when it may not lower itself."""
        allowed = self.of(tenant)
        asked = requested_priority(headers)
        if asked is None or asked == allowed.band:
            return allowed.band
        if asked > allowed.band:
            raise Forbidden(
                f"{PRIORITY_HEADER} {asked} is above tenant {tenant!r}'s priority band ({allowed.band}); "
                "a request may only lower its priority",
                param=PRIORITY_HEADER,
            )
        if not allowed.may_lower:
            raise Forbidden(
                f"tenant {tenant!r} may not set {PRIORITY_HEADER} (its band is {allowed.band})",
                param=PRIORITY_HEADER,
            )
        return asked
