"""Fair-queue counters shared between gateway replicas, through a hash in the KV pool's Redis.

Each replica runs its own VTC queue over its own share of the engines' capacity (capacity is split,
`EngineCapacity.share`); what must agree between them is *who has been served how much*, or a tenant
could take its fair share from every replica. So every replica publishes the service it charges and
adds what the others charged to its own counters:

    every `interval_s`, one script (EVALSHA, atomic) per replica:
        per tenant charged here since the last sync:
            HINCRBYFLOAT key t:<tenant> <service>
            HSETNX key g:<tenant> <token>:<now>   (the field's generation: tells a re-made field)
            ZADD key:seen <now> <tenant>          (when it was last charged, by anyone)
        trim: tenants last charged over `idle_s` ago, then the least recently charged beyond
              `max_tenants`: HDEL key t:<tenant> g:<tenant>, ZREM key:seen <tenant>
        EXPIRE both keys 1 day
        HGETALL key                          → G_t, every replica's service to tenant t so far
    others_t = G_t − mine_t        (mine_t: what this replica has published to this generation)
    add others_t − applied_t to the local counter, then applied_t = others_t

The update rate is bounded (one round trip per replica per interval, whatever the traffic), and so
is the staleness: a replica's counters miss at most one interval of the others' service, so between
two backlogged tenants the service gap grows from VTC's 2U by at most the service the replicas give
in one interval plus a round trip (measured in docs/benchmarks.md). Worked example: replica A charged
`gold` 300 since its last sync and has published 1,000 before; HGETALL says `t:gold` = 5,300; so the
others' share is 5,300 − 1,300 = 4,000; A had applied 3,500 of it, and now adds 500.

Nothing is lost when Redis is unreachable: the charges stay pending and go with the next successful
sync (the counters are cumulative), `tandem_router_shared_counter_syncs_total{outcome="error"}` counts
the failures and one warning is logged per outage; meanwhile each replica keeps ordering by what it
knows. A tenant's field that vanished (trimmed, Redis restarted, the key expired) comes back with a new
generation: the replica keeps its counter (it holds the history), forgets what it had published and
applied for that tenant, and counts from the new field on, which holds only what was charged since: no
counter jumps back.

**Bounded** (tenant names may come from a client header): the hash holds at most `max_tenants`
tenants (two fields each) plus those charged in one sync, so every replica's HGETALL, ten a second,
reads a bounded table whatever the number of names; a replica keeps books only for tenants in the
table it last read, and at most `max_tenants` tenants' charges pending (a new tenant's charge beyond
that is dropped and counted in `dropped`: only while Redis is unreachable or under a flood of names).
A trimmed tenant was idle everywhere for `idle_s` (or is the least recently charged of a flood): the
VTC queues lift it on its return anyway (`tandem.router.admission.fairness.vtc`). The hash is
`tandem:<service>:vtc` and the recency set `tandem:<service>:vtc:seen` (docs/router.md); tenant fields
are `t:<tenant>` and `g:<tenant>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.core.tasks import stop_task
from tandem.kvpool.client import POOL_ERRORS

log = logging.getLogger("tandem.router")

TENANT_PREFIX = "t:"
GENERATION_PREFIX = "g:"
#: The hash outlives a gateway that stopped by a day, then Redis drops it.
TTL_S = 86_400
#: Tenants the hash holds at most, and seconds after which a tenant nobody charged leaves it.
MAX_SHARED_TENANTS = 4096
IDLE_S = 600.0

#: The sync (module docstring). KEYS: the hash, the recency set. ARGV: token, now, idle cutoff, most
#: tenants, TTL, then tenant and service pairs.
SYNC = """
local hash, seen = KEYS[1], KEYS[2]
local now = ARGV[2]
for i = 6, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', hash, 't:' .. ARGV[i], ARGV[i + 1])
  redis.call('HSETNX', hash, 'g:' .. ARGV[i], ARGV[1] .. ':' .. now)
  redis.call('ZADD', seen, now, ARGV[i])
end
local gone = redis.call('ZRANGEBYSCORE', seen, '-inf', '(' .. ARGV[3])
local excess = redis.call('ZCARD', seen) - #gone - tonumber(ARGV[4])
if excess > 0 then
  for _, tenant in ipairs(redis.call('ZRANGE', seen, #gone, #gone + excess - 1)) do
    table.insert(gone, tenant)
  end
end
for _, tenant in ipairs(gone) do
  redis.call('HDEL', hash, 't:' .. tenant, 'g:' .. tenant)
  redis.call('ZREM', seen, tenant)
end
redis.call('EXPIRE', hash, ARGV[5])
redis.call('EXPIRE', seen, ARGV[5])
return redis.call('HGETALL', hash)
"""


class CounterStore(Protocol):
    """The part of `redis.asyncio.Redis` the sync uses."""

    def register_script(self, script: str) -> Any: ...

    async def aclose(self) -> None: ...


class SharedCounters:
    """Publishes this replica's VTC charges and applies the other replicas' (module docstring).

    `charged(tenant, service)` is the fair queue's `on_charge` hook; `add(tenant, service)` adds the
    others' service to the local counters (`VTCQueue.add_service`)."""

    def __init__(
        self,
        store: CounterStore,
        *,
        key: str,
        interval_s: float,
        add: Callable[[str, float], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        max_tenants: int = MAX_SHARED_TENANTS,
        idle_s: float = IDLE_S,
    ) -> None:
        self._store = store
        self._script = store.register_script(SYNC)
        self._key = key
        self._interval = interval_s
        self._add = add
        self._clock = clock
        self._wall = wall  # replicas compare their stamps: wall-clock seconds
        self._max_tenants = max_tenants
        self._idle_s = idle_s
        self._token = uuid.uuid4().hex
        self._pending: dict[str, float] = {}
        self._mine: dict[str, float] = {}
        self._applied: dict[str, float] = {}
        self._generation: dict[str, str] = {}
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.synced_at: float | None = None
        self.outcomes = {"ok": 0, "error": 0}

    def charged(self, tenant: str, service: float) -> None:
        if not math.isfinite(service):  # never sent: Redis would refuse the whole sync for it
            return
        if tenant not in self._pending and len(self._pending) >= self._max_tenants:
            self.dropped += 1  # module docstring: bounded even while Redis is unreachable
            return
        self._pending[tenant] = self._pending.get(tenant, 0.0) + service

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="shared-counters")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        with contextlib.suppress(*POOL_ERRORS):
            await self.sync()  # what this replica charged last still counts for the others
        await self._store.aclose()

    async def _run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self._interval)

    async def sync(self) -> bool:
        """One round trip: publish pending charges, apply the others'. False when Redis failed
        (the charges stay pending)."""
        pending, self._pending = self._pending, {}
        now = self._wall()
        args: list[Any] = [self._token, repr(now), repr(now - self._idle_s), self._max_tenants, TTL_S]
        for tenant, service in pending.items():
            args += [tenant, repr(service)]
        try:
            table = await self._script(keys=[self._key, self._key + ":seen"], args=args)
        except POOL_ERRORS as exc:
            for tenant, service in pending.items():
                self._pending[tenant] = self._pending.get(tenant, 0.0) + service
            self.outcomes["error"] += 1
            if not self._failing:
                self._failing = True
                log.warning("shared counters: sync failed, charges kept for the next one: %s", exc)
            return False
        if self._failing:
            self._failing = False
            log.info("shared counters: sync works again")
        self.outcomes["ok"] += 1
        self.synced_at = self._clock()
        self._apply(_decode(table), pending)
        return True

    def _apply(self, table: Mapping[str, str], published: Mapping[str, float]) -> None:
        present: set[str] = set()
        for field, raw in table.items():
            if not field.startswith(TENANT_PREFIX):
                continue
            tenant = field[len(TENANT_PREFIX) :]
            present.add(tenant)
            generation = table.get(GENERATION_PREFIX + tenant, "")
            if generation != self._generation.get(tenant):
                # A field new to us (or re-made since we read it): it holds only what was charged
                # since it was made, this sync's part included.
                self._generation[tenant] = generation
                self._mine[tenant] = published.get(tenant, 0.0)
                self._applied[tenant] = 0.0
            else:
                self._mine[tenant] = self._mine.get(tenant, 0.0) + published.get(tenant, 0.0)
            try:
                total = float(raw)
            except ValueError:
                continue
            if not math.isfinite(total):
                continue
            others = total - self._mine.get(tenant, 0.0)
            delta = others - self._applied.get(tenant, 0.0)
            if delta:
                self._add(tenant, delta)
                self._applied[tenant] = others
        for books in (self._mine, self._applied, self._generation):
            for tenant in books.keys() - present:  # trimmed from the hash: forgotten here too
                del books[tenant]

    def tracked(self) -> int:
        """Tenants this replica keeps books for (at most the hash's, plus pending charges)."""
        return len(self._mine.keys() | self._applied.keys() | self._pending.keys())

    def age_s(self) -> float | None:
        """Seconds since the last successful sync (None before the first)."""
        return None if self.synced_at is None else self._clock() - self.synced_at


def _decode(raw: Any) -> dict[str, str]:
    """HGETALL's answer, as a script returns it (a flat list of fields and values), as text."""

    def text(value: Any) -> str:
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

    items = list(raw.items()) if isinstance(raw, Mapping) else list(zip(raw[::2], raw[1::2], strict=True))
    return {text(k): text(v) for k, v in items}


class SharedCountersCollector(Collector):
    """`tandem_router_shared_counter_syncs_total{outcome}` and
    `tandem_router_shared_counter_age_seconds` (since the last successful sync; absent before it)."""

    def __init__(self, counters: SharedCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        syncs = CounterMetricFamily(
            "tandem_router_shared_counter_syncs",
            "Syncs of the fair-queue counters shared between replicas, by outcome (ok, error).",
            labels=["outcome"],
        )
        for outcome, n in self._counters.outcomes.items():
            syncs.add_metric([outcome], n)
        yield syncs
        age = self._counters.age_s()
        if age is not None:
            yield GaugeMetricFamily(
                "tandem_router_shared_counter_age_seconds",
                "Seconds since the shared fair-queue counters were last synced.",
                value=age,
            )

    def describe(self) -> Iterator[Metric]:
        return iter(())


def register(counters: SharedCounters, prometheus: CollectorRegistry) -> None:
    prometheus.register(SharedCountersCollector(counters))
