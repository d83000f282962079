"""Fair-queue counters shared between gateway replicas, through a hash in the KV pool's Redis.

Each replica runs its own VTC queue over its own share of the engines' capacity (capacity is split,
`EngineCapacity.share`); what must agree between them is *who has been served how much*, or a tenant
could take its fair share from every replica. So every replica publishes the service it charges and
adds what the others charged to its own counters:

    every `interval_s`, one MULTI/EXEC round trip per replica:
        HSETNX key epoch <token>             (who created the hash: tells a lost hash from ours)
        HINCRBYFLOAT key t:<tenant> <service charged here since the last sync>   (per tenant)
        EXPIRE key 1 day
        HGETALL key                          → G_t, every replica's service to tenant t so far
    others_t = G_t − mine_t        (mine_t: what this replica has published)
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
knows. A hash that vanished (Redis restarted, the key expired) has a new epoch: the replica keeps its
counters (they hold the history), forgets what it had published and applied, and counts from the new
hash on, which holds only what was charged since: no counter jumps back. The hash is
`tandem:<service>:vtc` (docs/router.md); tenant fields are `t:<tenant>`, so no tenant name can clash
with `epoch`.
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

EPOCH_FIELD = "epoch"
TENANT_PREFIX = "t:"
#: The hash outlives a gateway that stopped by a day, then Redis drops it.
TTL_S = 86_400


class CounterStore(Protocol):
    """The part of `redis.asyncio.Redis` the sync uses."""

    def pipeline(self, transaction: bool = True) -> Any: ...

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
    ) -> None:
        self._store = store
        self._key = key
        self._interval = interval_s
        self._add = add
        self._clock = clock
        self._token = uuid.uuid4().hex
        self._pending: dict[str, float] = {}
        self._mine: dict[str, float] = {}
        self._applied: dict[str, float] = {}
        self._epoch: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.synced_at: float | None = None
        self.outcomes = {"ok": 0, "error": 0}

    def charged(self, tenant: str, service: float) -> None:
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
        try:
            async with self._store.pipeline(transaction=True) as pipe:
                pipe.hsetnx(self._key, EPOCH_FIELD, self._token)
                for tenant, service in pending.items():
                    pipe.hincrbyfloat(self._key, TENANT_PREFIX + tenant, service)
                pipe.expire(self._key, TTL_S)
                pipe.hgetall(self._key)
                results = await pipe.execute()
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
        self._apply(_decode(results[-1]), pending)
        return True

    def _apply(self, table: Mapping[str, str], published: Mapping[str, float]) -> None:
        epoch = table.get(EPOCH_FIELD)
        fresh = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        if fresh:  # the hash was lost: it holds only what was charged since, this sync's part included
            self._mine = dict(published)
            self._applied = {}
        else:
            for tenant, service in published.items():
                self._mine[tenant] = self._mine.get(tenant, 0.0) + service
        for field, raw in table.items():
            if not field.startswith(TENANT_PREFIX):
                continue
            tenant = field[len(TENANT_PREFIX) :]
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

    def age_s(self) -> float | None:
        """Seconds since the last successful sync (None before the first)."""
        return None if self.synced_at is None else self._clock() - self.synced_at


def _decode(raw: Mapping[Any, Any]) -> dict[str, str]:
    def text(value: Any) -> str:
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)

    return {text(k): text(v) for k, v in raw.items()}


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
