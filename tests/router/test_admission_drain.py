"""The admission gate's drain rate as stories: the rate a queued request's wait is priced at, the
measured one raised to the pool's own (capacity over how long a grant holds its slot), and what it
is read from. The harness is `test_admission_gate`'s: real gate, queue and metrics; faked pool
capacity and clock."""

from __future__ import annotations

import asyncio

from tests.router.harness import FakeClock
from tests.router.test_admission_gate import Pool, make_gate, request, sample, settle

from tandem.router.admission.grant import Grant

DRAIN = "tandem_router_queue_drain_per_second"


async def test_a_wait_measured_on_a_pool_that_had_shrunk_is_priced_at_the_pools_own_rate() -> None:
    """A pool of 10 whose requests hold their slot 2 s drains 5/s (Little's law). After it shrank
    and came back, the rate measured while requests waited is 1/s: one dispatch in a second of
    backlog. A request with a 6-s deadline and 19 ahead would wait 19 s at that rate, and 3.8 s at
    the pool's: it is queued, not refused, and starts within its deadline."""
    clock = FakeClock()
    pool = Pool(capacity=10)
    gate, registry = make_gate(pool, clock, max_queue=50)
    first = [await gate.admit(request(f"w{i}", "heavy")) for i in range(10)]
    clock.advance(2.0)
    for grant in first:
        grant.release()  # ten slots, each held 2 s
    running = [await gate.admit(request(f"r{i}", "heavy")) for i in range(10)]
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in range(20)]
    await settle()
    clock.advance(1.0)
    running.pop().release()  # one dispatch in a second of backlog: measured 1/s
    await settle()
    assert sum(t.done() for t in heavy) == 1 and len(gate.queue) == 19
    patient = asyncio.create_task(gate.admit(request("deadline", "heavy", deadline=6.0)))
    await settle()
    assert not patient.done()  # queued: 19 ahead at the pool's ~5/s fits 6 s
    clock.advance(1.0)
    for grant in running:
        grant.release()
    await settle()
    clock.advance(2.0)
    for task in heavy:
        if task.done():
            task.result().release()
            await settle()
    assert patient.done() and isinstance(patient.result(), Grant)  # started 3 s after it arrived
    assert sample(registry, "tandem_router_admission_rejections_total", reason="deadline") == 0
    measured, own, priced = (sample(registry, DRAIN, reading=r) for r in ("measured", "pool", "priced"))
    assert own > measured > 0 and priced == own, (measured, own, priced)
    for task in heavy:
        task.cancel()
    await settle()


async def test_the_pools_rate_never_prices_a_wait_on_its_own() -> None:
    """Requests that held their slot 1 s, but no backlog measured yet: a request with a deadline
    far shorter than what is ahead still queues (nothing is refused on a guess)."""
    clock = FakeClock()
    gate, registry = make_gate(Pool(capacity=1), clock, max_queue=50)
    for i in range(4):
        grant = await gate.admit(request(f"w{i}", "heavy"))
        clock.advance(1.0)
        grant.release()
    await gate.admit(request("r0", "heavy"))
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in range(10)]
    await settle()
    patient = asyncio.create_task(gate.admit(request("deadline", "heavy", deadline=0.5)))
    await settle()
    assert not patient.done() and len(gate.queue) == 11
    assert sample(registry, "tandem_router_admission_rejections_total", reason="deadline") == 0
    assert registry.get_sample_value(DRAIN, {"reading": "pool"}) == 1.0
    assert registry.get_sample_value(DRAIN, {"reading": "priced"}) is None  # no sample: none measured
    for task in (*heavy, patient):
        task.cancel()
    await settle()


async def test_a_grant_that_took_no_capacity_says_nothing_of_how_long_slots_are_held() -> None:
    """With no decode endpoint in rotation a request goes on to the dispatcher's 503 at once; its
    grant held no slot, so its instant release is not one of the holds the pool's rate is read from."""
    clock = FakeClock()
    pool = Pool(capacity=None)
    gate, registry = make_gate(pool, clock)
    (await gate.admit(request("none", "a"))).release()
    pool.capacity = 1
    for i in range(4):
        grant = await gate.admit(request(f"w{i}", "a"))
        clock.advance(1.0)
        grant.release()
    assert registry.get_sample_value(DRAIN, {"reading": "pool"}) == 1.0  # 1 slot, each held 1 s
