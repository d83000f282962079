"""Fair-queue counters shared between gateway replicas through Redis.

Real: `redis-server` on 127.0.0.1 (the `redis_server` fixture), redis.asyncio clients, `VTCQueue`s
standing for the replicas' queues. Syncs are called by hand (no timers), so every step is exact;
the last story runs two whole routers against one Redis and one engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from tests.router.harness import MODEL, Launcher, metric, router_config
from tests.servers import RedisServer

from tandem.kvpool.client import connect
from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.config import resolve
from tandem.router.errors import ConfigurationError
from tandem.router.settings import AdmissionSettings, RouterSettings
from tandem.router.workers.counters import SharedCounters

KEY = "tandem:test:vtc"
Replica = Callable[..., tuple[VTCQueue[str], SharedCounters]]


@pytest.fixture
async def replica(redis_server: RedisServer) -> AsyncIterator[Replica]:
    """Makes a replica's queue with its shared counters (a client of `redis_server`); closes them."""
    made: list[SharedCounters] = []

    def make(timeout_s: float = 2.0) -> tuple[VTCQueue[str], SharedCounters]:
        queue: VTCQueue[str] = VTCQueue()
        store = connect(redis_server.url, timeout_s=timeout_s)
        counters = SharedCounters(store, key=KEY, interval_s=0.1, add=queue.add_service)
        queue.on_charge = counters.charged
        made.append(counters)
        return queue, counters

    yield make
    for counters in made:
        await counters.stop()


async def test_each_replica_counts_what_the_others_served(
    replica: Replica, redis_server: RedisServer
) -> None:
    a_queue, a = replica()
    b_queue, b = replica()
    a_queue.pass_through(tenant="gold", prompt_tokens=100)  # A serves gold 100
    a_queue.charge_output("gold", 10)  # and 10 tokens out: 20 at output weight 2
    b_queue.pass_through(tenant="silver", prompt_tokens=50)
    assert await a.sync() and await b.sync() and await a.sync()
    assert a_queue.counters() == b_queue.counters() == {"gold": 120.0, "silver": 50.0}
    # Corrections (negative charges) travel too, and nothing is applied twice.
    b_queue.charge_input("silver", -5)
    assert await b.sync() and await a.sync() and await a.sync()
    assert a_queue.counter("silver") == b_queue.counter("silver") == 45.0
    assert a_queue.counter("gold") == b_queue.counter("gold") == 120.0
    # The docstring's layout: one hash, tenant fields prefixed, each with its generation.
    stored = redis_server.client().hgetall(KEY)
    assert stored[b"t:gold"] == b"120" and stored[b"t:silver"] == b"45" and b"g:gold" in stored


async def test_a_replica_that_joins_later_learns_the_history(replica: Replica) -> None:
    a_queue, a = replica()
    a_queue.pass_through(tenant="gold", prompt_tokens=700)
    assert await a.sync()
    late_queue, late = replica()
    assert await late.sync()
    assert late_queue.counter("gold") == 700.0


async def test_with_redis_down_charges_wait_and_go_with_the_next_sync(
    replica: Replica, redis_server: RedisServer
) -> None:
    a_queue, a = replica(timeout_s=0.2)
    b_queue, b = replica()
    a_queue.pass_through(tenant="gold", prompt_tokens=30)
    assert await a.sync()
    redis_server.client().client_pause(1500)
    a_queue.pass_through(tenant="gold", prompt_tokens=12)
    assert await a.sync() is False
    assert a.outcomes == {"ok": 1, "error": 1}
    await asyncio.sleep(1.6)  # Redis answers again
    assert await a.sync() and await b.sync()
    assert b_queue.counter("gold") == 30.0 + 12.0  # the charge kept while Redis was down arrived


async def test_a_lost_hash_restarts_the_books_without_a_jump(
    replica: Replica, redis_server: RedisServer
) -> None:
    a_queue, a = replica()
    b_queue, b = replica()
    a_queue.pass_through(tenant="gold", prompt_tokens=100)
    assert await a.sync() and await b.sync()
    redis_server.client().delete(KEY)  # e.g. Redis restarted without persistence
    b_queue.pass_through(tenant="gold", prompt_tokens=5)
    assert await b.sync() and await a.sync()
    assert a_queue.counter("gold") == 100.0 + 5.0
    a_queue.pass_through(tenant="gold", prompt_tokens=1)
    assert await a.sync() and await b.sync()
    assert b_queue.counter("gold") == 100.0 + 5.0 + 1.0


async def test_a_flood_of_tenant_names_leaves_the_hash_and_the_books_at_the_bound(
    redis_server: RedisServer,
) -> None:
    """20,000 names charged through one replica, 2,000 a sync (a header-chosen tenant each), with a
    bound of 500: the hash, the recency set and both replicas' books stay at the bound."""
    bound = 500
    queues: list[VTCQueue[str]] = []
    replicas: list[SharedCounters] = []
    for _ in range(2):
        queue: VTCQueue[str] = VTCQueue(max_idle=bound)
        counters = SharedCounters(
            connect(redis_server.url), key=KEY, interval_s=0.1, add=queue.add_service, max_tenants=bound
        )
        queue.on_charge = counters.charged
        queues.append(queue)
        replicas.append(counters)
    client = redis_server.client()
    try:
        for batch in range(10):
            for i in range(2_000):
                queues[0].pass_through(tenant=f"flood-{batch}-{i}", prompt_tokens=1)
            assert await replicas[0].sync() and await replicas[1].sync()
            assert client.zcard(KEY + ":seen") == bound
            assert client.hlen(KEY) == 2 * bound
            assert replicas[0].tracked() == replicas[1].tracked() == bound
            assert queues[1].tracked() == bound
        # Each sync carried the first 500 names of its batch (the pending bound); the rest were
        # dropped and counted. B's counter of a kept one is A's charge (A's own also holds its lift).
        assert replicas[0].dropped == 10 * (2_000 - bound)
        assert queues[1].counter("flood-9-0") == 1.0
    finally:
        for counters in replicas:
            await counters.stop()


async def test_a_tenant_idle_past_the_limit_leaves_the_hash_and_returns_without_a_jump(
    redis_server: RedisServer,
) -> None:
    now = [1_000.0]
    queues: list[VTCQueue[str]] = []
    replicas: list[SharedCounters] = []
    for _ in range(2):
        queue: VTCQueue[str] = VTCQueue()
        counters = SharedCounters(
            connect(redis_server.url),
            key=KEY,
            interval_s=0.1,
            add=queue.add_service,
            wall=lambda: now[0],
            idle_s=60,
        )
        queue.on_charge = counters.charged
        queues.append(queue)
        replicas.append(counters)
    a, b = replicas
    try:
        queues[0].pass_through(tenant="gold", prompt_tokens=100)
        assert await a.sync() and await b.sync()
        now[0] += 61  # nobody charged gold for over a minute: the next sync trims it
        queues[0].pass_through(tenant="silver", prompt_tokens=1)
        assert await a.sync() and await b.sync()
        assert set(redis_server.client().hkeys(KEY)) == {b"t:silver", b"g:silver"}
        queues[1].pass_through(tenant="gold", prompt_tokens=7)  # gold returns, through B
        assert await b.sync() and await a.sync()
        assert queues[0].counter("gold") == 107.0  # A adds B's 7, not B's 107 again nor a drop
        assert queues[1].counter("gold") == 107.0
    finally:
        for counters in replicas:
            await counters.stop()


def test_redis_counters_need_a_pool_and_auto_needs_replicas() -> None:
    config = router_config(decode=["http://127.0.0.1:1"])
    with pytest.raises(ConfigurationError, match="--shared-counters redis needs"):
        resolve(config, RouterSettings(admission=AdmissionSettings(shared_counters="redis")))
    pooled = config.model_copy(update={"kv_pool_url": "redis://127.0.0.1:6379"})
    assert resolve(pooled, RouterSettings()).shared_counters is None  # one replica: nothing to share
    two = resolve(pooled, RouterSettings(admission=AdmissionSettings(replicas=2)))
    assert two.shared_counters is not None and two.shared_counters.key == "tandem:test:vtc"
    off = RouterSettings(admission=AdmissionSettings(replicas=2, shared_counters="off"))
    assert resolve(pooled, off).shared_counters is None


async def test_two_router_replicas_share_counters_through_redis(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    engine = await launcher.engine("d0", tokens=4)
    config = router_config(decode=[engine.url], kv_pool_url=redis_server.url)
    settings = RouterSettings(admission=AdmissionSettings(replicas=2, counter_sync_seconds=0.02))
    first = await launcher.router_for(config, settings=settings)
    second = await launcher.router_for(config, settings=settings)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    for router in (first, second):  # one request of gold through each replica
        response = await router.http.post("/v1/completions", json=body, headers={"x-tenant-id": "gold"})
        assert response.status_code == 200

    async def counters() -> tuple[float, float]:
        return (
            await metric(first, "tandem_router_tenant_vtc_counter", tenant="gold"),
            await metric(second, "tandem_router_tenant_vtc_counter", tenant="gold"),
        )

    # Each replica charged its own request 3 prompt tokens + 2 × 4 output tokens = 11; once synced,
    # each counter holds both.
    both = (2 * (3 + 2 * 4),) * 2
    for _ in range(200):
        if await counters() == both:
            break
        await asyncio.sleep(0.02)
    assert await counters() == both
    assert await metric(second, "tandem_router_shared_counter_syncs_total", outcome="ok") > 0
