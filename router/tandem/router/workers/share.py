"""What sibling workers share over the bus, as small adapters the composition root plugs in:

- `"route"` events: `[url, keys]`, a prompt's block keys as one worker routed it; every sibling
  records them in its approximate prefix index, so a prefix sent to engine A by one worker is found
  on A by the others (without this, N workers would each spread every new prefix on their own and
  cache it N times).
- `"service"` events: `{tenant: service}`, the VTC service this worker charged, summed over
  `interval_s` and sent at most that often; every sibling adds it to its counters, so each worker
  orders its waiting requests by what each tenant received from the whole gateway. (Capacity is
  split, not shared: each worker admits into its own share of the engines; docs/router.md.)
- `"limits"` events: `{tenant: [requests, tokens]}`, what this worker took from the tenant's rate-limit
  buckets, summed and sent like the service; every sibling debits its own buckets, so N workers hold
  a tenant to its limit once, not N times.

Every `apply_*` reads its payload whole through `tandem.router.workers.messages` first: an event with
one bad value (`nan`, a string, a negative count) raises `BadMessage` and changes nothing; the bus
counts it (`WorkerBus.rejected`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from tandem.router.workers import messages
from tandem.router.workers.bus import Bus

ROUTE = "route"
SERVICE = "service"
LIMITS = "limits"
#: Seconds over which a worker's charges are summed before they are sent.
SERVICE_INTERVAL_S = 0.005


class _Batched:
    """A per-tenant tally sent as one `event` at most every `interval_s` (the first addition after a
    send schedules the next send); subclasses add to `_pending` and call `_added`."""

    def __init__(self, bus: Bus, event: str, *, interval_s: float) -> None:
        self._bus = bus
        self._event = event
        self._interval = interval_s
        self._pending: dict[str, Any] = {}
        self._scheduled = False

    def _added(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(self._interval, self._send)

    def _send(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        if pending:
            self._bus.publish(self._event, pending)


class SharedService(_Batched):
    """Batches this worker's VTC charges for its siblings (module docstring)."""

    def __init__(self, bus: Bus, *, interval_s: float = SERVICE_INTERVAL_S) -> None:
        super().__init__(bus, SERVICE, interval_s=interval_s)

    def charged(self, tenant: str, service: float) -> None:
        """The `on_charge` hook of this worker's fair queue."""
        self._pending[tenant] = self._pending.get(tenant, 0.0) + service
        self._added()


class SharedLimits(_Batched):
    """Batches what this worker took from rate-limit buckets for its siblings (module docstring)."""

    def __init__(self, bus: Bus, *, interval_s: float = SERVICE_INTERVAL_S) -> None:
        super().__init__(bus, LIMITS, interval_s=interval_s)

    def took(self, tenant: str, requests: int, tokens: int) -> None:
        """The `on_take` hook of this worker's rate limiter."""
        pending = self._pending.setdefault(tenant, [0, 0])
        pending[0] += requests
        pending[1] += tokens
        self._added()


def apply_limits(absorb: Callable[[str, int, int], None]) -> Callable[[Any], None]:
    """A sibling's `"limits"` event into this worker's buckets (`RateLimiter.absorb`)."""

    def apply(payload: Any) -> None:
        for tenant, (requests, tokens) in messages.limits(payload).items():
            absorb(tenant, requests, tokens)

    return apply


def share_routes(bus: Bus) -> Callable[[str, Sequence[int]], None]:
    """The `on_record` hook of this worker's scheduling state."""

    def routed(url: str, keys: Sequence[int]) -> None:
        bus.publish(ROUTE, [url, list(keys)])

    return routed


def apply_routes(record: Callable[[str, Sequence[int]], None]) -> Callable[[Any], None]:
    """A sibling's `"route"` event into this worker's index (`record_keys`)."""

    def apply(payload: Any) -> None:
        record(*messages.route(payload))

    return apply


def apply_service(add: Callable[[str, float], None]) -> Callable[[Any], None]:
    """A sibling's `"service"` event into this worker's counters (`add_service`)."""

    def apply(payload: Any) -> None:
        for tenant, service in messages.service(payload).items():
            add(tenant, service)

    return apply
