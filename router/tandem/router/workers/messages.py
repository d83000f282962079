"""What a bus event may carry, checked before any of it is applied (pure: payload in, typed data out).

A sibling is authenticated (`tandem.router.workers.peer`), but a bug or a half-written frame must
not poison a worker's state: a `nan` added to a VTC counter makes every comparison with it false, so
that tenant is never the least served (or always is), and an `inf` or `-1e308` does the same for
good. So every payload is read whole into plain values first; one bad entry rejects the whole event
(`BadMessage`), and nothing of it is applied. The bus counts and logs rejected events.

| event | payload | each value |
| --- | --- | --- |
| `service` | `{tenant: service}` | a finite float (an int is read as one), `abs ≤ MAX_SERVICE` |
| `limits` | `{tenant: [requests, tokens]}` | ints (not bools) in `[0, MAX_TAKEN]` |
| `route` | `[url, [key, ...]]` | an `http(s)://` URL; at most `MAX_KEYS` ints in `[0, 2⁶⁴)` |

Tenants are non-empty strings of at most `MAX_TENANT` characters, and one event names at most
`MAX_TENANTS` of them. Example: `{"a": 12.5, "b": nan}` is rejected whole, `a` is not charged either.
Service may be negative: a charge corrected down (`charge_input` with the engine's true prompt).
"""

from __future__ import annotations

import math
from typing import Any

#: The largest service one event may add to one tenant (weighted tokens): far above any interval's.
MAX_SERVICE = 1e12
#: The most requests or tokens one event may take from one tenant's buckets.
MAX_TAKEN = 1 << 40
#: The longest tenant name (characters) and the most tenants per event.
MAX_TENANT = 65_536
MAX_TENANTS = 100_000
#: The most block keys in one `route` event, and the longest URL.
MAX_KEYS = 1 << 20
MAX_URL = 2048
_KEY_END = 1 << 64


class BadMessage(ValueError):
    """An event whose payload is not what its kind carries (module docstring)."""


def _tenant(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_TENANT:
        raise BadMessage(f"a tenant must be a non-empty string of at most {MAX_TENANT} characters")
    return value


def _table(payload: Any) -> dict[Any, Any]:
    if not isinstance(payload, dict):
        raise BadMessage(f"expected a table of tenants, got {type(payload).__name__}")
    if len(payload) > MAX_TENANTS:
        raise BadMessage(f"{len(payload)} tenants in one event (at most {MAX_TENANTS})")
    return payload


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TAKEN:
        raise BadMessage(f"a count must be an integer in [0, {MAX_TAKEN}], got {value!r:.40}")
    return value


def service(payload: Any) -> dict[str, float]:
    """A `service` event's `{tenant: service}`; `BadMessage` unless every value is valid."""
    out: dict[str, float] = {}
    for tenant, value in _table(payload).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadMessage(f"service must be a number, got {type(value).__name__}")
        number = float(value)
        if not (math.isfinite(number) and abs(number) <= MAX_SERVICE):
            raise BadMessage(f"service must be finite and at most {MAX_SERVICE:g} in size, got {number!r}")
        out[_tenant(tenant)] = number
    return out


def limits(payload: Any) -> dict[str, tuple[int, int]]:
    """A `limits` event's `{tenant: (requests, tokens)}`; `BadMessage` unless every value is valid."""
    out: dict[str, tuple[int, int]] = {}
    for tenant, value in _table(payload).items():
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise BadMessage("limits must be [requests, tokens]")
        out[_tenant(tenant)] = (_count(value[0]), _count(value[1]))
    return out


def route(payload: Any) -> tuple[str, list[int]]:
    """A `route` event's `(url, keys)`; `BadMessage` unless both are valid."""
    if not isinstance(payload, list | tuple) or len(payload) != 2:
        raise BadMessage("a route must be [url, keys]")
    url, keys = payload
    if not isinstance(url, str) or len(url) > MAX_URL or not url.startswith(("http://", "https://")):
        raise BadMessage("a route's url must be an http(s) URL")
    if not isinstance(keys, list | tuple) or len(keys) > MAX_KEYS:
        raise BadMessage(f"a route's keys must be a list of at most {MAX_KEYS}")
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < _KEY_END:
            raise BadMessage("a block key must be an integer in [0, 2**64)")
    return url, list(keys)
