"""The admission gate's prefill ahead (`AdmissionGate`, "Prefill ahead"; `tandem.router.pd.ahead`):
with no slot free, the next requests in fair order leave the queue, up to a limit, so their prefill
runs while they wait; they are granted first when a slot frees.

Real: `AdmissionGate`, `VTCQueue`, its metrics. Faked: the pool's capacity, the clock (by hand).
"""

from __future__ import annotations

import asyncio

import pytest
from tests.router.harness import FakeClock
from tests.router.test_admission_gate import Pool, make_gate, request, sample, settle

from tandem.router.admission.gate import AdmissionGate
from tandem.router.admission.grant import Grant
from tandem.router.errors import Overloaded


def admit(
    gate: AdmissionGate, taken: list[str], rid: str, tenant: str, *, prompt: int = 10
) -> asyncio.Task[Grant]:
    """`rid` admitted with work to do ahead: `taken` records when the gate takes it ahead."""
    return asyncio.create_task(
        gate.admit(request(rid, tenant, prompt=prompt), on_ahead=lambda: taken.append(rid))
    )


async def test_with_no_slot_free_the_next_in_fair_order_are_taken_ahead_charged_and_granted_first() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock(), ahead=lambda capacity: 2 * capacity)
    taken: list[str] = []
    running = await gate.admit(request("h0", "heavy", prompt=500))
    heavy = [admit(gate, taken, f"h{n}", "heavy") for n in (1, 2, 3)]
    await settle()
    assert taken == ["h1", "h2"] and gate.ready == 2 and len(gate.queue) == 1
    assert gate.queue.counter("heavy") == 500 + 10 + 10  # charged as they are taken, h3 not yet
    assert sample(registry, "tandem_router_admission_ahead_requests") == 2
    light = admit(gate, taken, "l1", "light")
    await settle()
    assert taken == ["h1", "h2"] and not light.done()  # the limit holds
    running.release()
    await settle()
    assert heavy[0].done() and not heavy[1].done() and not light.done()  # h1 was taken first
    # The freed place ahead goes in fair order: light's counter starts at heavy's (VTC's lift), and
    # the tie goes to the older head, h3; then heavy is over light, and light is next.
    assert taken == ["h1", "h2", "h3"]
    (await heavy[0]).release()
    await settle()
    assert heavy[1].done() and taken == ["h1", "h2", "h3", "l1"]
    (await heavy[1]).release()
    await settle()
    assert heavy[2].done() and not light.done()
    (await heavy[2]).release()
    (await asyncio.wait_for(light, 5)).release()
    assert gate.admitted == 0 and gate.ready == 0


async def test_a_request_with_nothing_to_do_ahead_stops_the_taking_so_order_is_kept() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock(), ahead=lambda capacity: 4)
    taken: list[str] = []
    running = await gate.admit(request("a0", "a"))
    plain = asyncio.create_task(gate.admit(request("b1", "b")))  # no `on_ahead`
    await settle()
    later = admit(gate, taken, "c1", "c")
    await settle()
    assert taken == [] and gate.ready == 0 and len(gate.queue) == 2
    running.release()
    await settle()
    assert plain.done() and taken == ["c1"]
    (await plain).release()
    (await asyncio.wait_for(later, 5)).release()


async def test_no_limit_no_taking() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock(), ahead=lambda capacity: 0)
    taken: list[str] = []
    running = await gate.admit(request("a0", "a"))
    waiting = admit(gate, taken, "a1", "a")
    await settle()
    assert taken == [] and len(gate.queue) == 1
    running.release()
    (await asyncio.wait_for(waiting, 5)).release()


async def test_a_client_leaving_after_it_was_taken_keeps_its_charge_and_frees_its_place() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock(), ahead=lambda capacity: 1)
    taken: list[str] = []
    running = await gate.admit(request("a0", "a"))
    first = admit(gate, taken, "b1", "b", prompt=40)
    second = admit(gate, taken, "b2", "b", prompt=40)
    await settle()
    assert taken == ["b1"]
    charged = gate.queue.counter("b")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert gate.ready == 0 and gate.queue.counter("b") == charged  # its prefill ran: the charge stays
    assert sample(registry, "tandem_router_queue_wait_seconds_count", outcome="cancelled") == 1
    await asyncio.sleep(0.05)  # the gate's poll takes the next one ahead
    assert taken == ["b1", "b2"]
    running.release()
    (await asyncio.wait_for(second, 5)).release()
    assert gate.admitted == 0


async def test_one_taken_ahead_past_its_deadline_is_refused_and_leaves() -> None:
    clock = FakeClock()
    gate, _ = make_gate(Pool(capacity=1), clock, max_wait_s=5, ahead=lambda capacity: 1)
    taken: list[str] = []
    running = await gate.admit(request("a0", "a"))
    waiting = admit(gate, taken, "b1", "b")
    await settle()
    assert taken == ["b1"]
    clock.advance(5.0)
    with pytest.raises(Overloaded) as refused:
        await asyncio.wait_for(waiting, timeout=5)
    assert refused.value.reason == "deadline" and gate.ready == 0
    running.release()
    assert gate.admitted == 0


async def test_a_tenant_with_nothing_running_pre_empts_from_ahead_at_once() -> None:
    gate, registry = make_gate(Pool(capacity=2), FakeClock(), ahead=lambda capacity: 1)
    gate.preemption = True
    stopped: list[str] = []
    heavy = [await gate.admit(request(f"h{n}", "heavy")) for n in range(2)]
    for n, grant in enumerate(heavy):
        grant.preempt = lambda n=n: stopped.append(f"h{n}")
    taken: list[str] = []
    light = await asyncio.wait_for(admit(gate, taken, "l1", "light"), 5)
    assert taken == ["l1"] and light.preempting and len(stopped) == 1  # its prefill started, then the slot
    assert gate.ready == 0 and gate.admitted == 2
    assert sample(registry, "tandem_router_preemptions_total", tenant="heavy") == 1
    for grant in (*heavy, light):
        grant.release()
    assert gate.admitted == 0


async def test_a_request_taken_ahead_counts_as_its_tenants_waiting_one_so_a_second_does_not_pre_empt() -> (
    None
):
    gate, _ = make_gate(Pool(capacity=2), FakeClock(), ahead=lambda capacity: 1)
    gate.preemption = True
    heavy = [await gate.admit(request(f"h{n}", "heavy")) for n in range(2)]
    for grant in heavy:
        grant.preempt = lambda: None
    taken: list[str] = []
    gate.preemption = False  # the first light request waits, taken ahead
    first = admit(gate, taken, "l1", "light")
    await settle()
    assert taken == ["l1"] and gate.ready == 1
    gate.preemption = True
    second = admit(gate, taken, "l2", "light")
    await settle()
    assert not second.done() and not first.done(), "light has one waiting already: no pre-emption"
    for grant in heavy:
        grant.release()
    for task in (first, second):
        (await asyncio.wait_for(task, 5)).release()
    assert gate.admitted == 0
