"""The admission gate as stories: who is dispatched when, who waits, who gets a 429 and why.

Real: `AdmissionGate`, its fair queue (`VTCQueue`/`FCFSQueue`), its Prometheus metrics on a private
registry, the event loop. Faked: the decode pool's capacity (a number the test sets), the TTFT
predictor (a table), and the clock (moved by hand; the gate re-checks it every `poll_s` = 10 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry
from tests.router.harness import FakeClock

from tandem.router.admission.fairness.fcfs import FCFSQueue
from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.admission.gate import AdmissionGate, Waiter
from tandem.router.admission.grant import Grant
from tandem.router.admission.metrics import AdmissionMetrics
from tandem.router.admission.policy import NoPrediction
from tandem.router.errors import Overloaded
from tandem.router.scheduling import Routable
from tandem.router.types import SLO, EndpointSnapshot, RequestView, Route, Usage

SLOW = SLO(ttft_s=3600, tpot_s=1)


@dataclass
class Pool:
    """The decode pool as the gate sees it: capacity (None: no endpoint in rotation)."""

    capacity: int | None = 2


@dataclass
class Predictions:
    ttft_s: dict[str, float] = field(default_factory=dict)  # by request id

    def predicted_ttft(self, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> float | None:
        return self.ttft_s.get(request.request_id)


def make_gate(
    pool: Pool,
    clock: Callable[[], float],
    *,
    poll_s: float = 0.01,
    max_queue: int = 10,
    fcfs: bool = False,
    predictor: Predictions | None = None,
    max_wait_s: float = 600,
    ahead: Callable[[int], int] | None = None,
) -> tuple[AdmissionGate, CollectorRegistry]:
    registry = CollectorRegistry()
    queue: VTCQueue[Waiter] = (FCFSQueue if fcfs else VTCQueue)(max_size=max_queue + 1)
    metrics = AdmissionMetrics(registry, max_tenants=10)
    gate = AdmissionGate(
        queue=queue,
        max_queue=max_queue,
        capacity=lambda: pool.capacity,
        candidates=list,
        predictor=predictor or NoPrediction(),
        metrics=metrics,
        clock=clock,
        max_queue_wait_s=max_wait_s,
        poll_s=poll_s,
        ahead=ahead,
    )
    metrics.watch(gate)
    return gate, registry


def request(
    rid: str,
    tenant: str,
    *,
    prompt: int = 10,
    priority: int = 0,
    slo: SLO = SLOW,
    deadline: float | None = None,
) -> RequestView:
    """A request; `deadline` is the client's own x-slo-ttft-ms (seconds), which also sets its objective."""
    return RequestView(
        request_id=rid,
        route=Route.COMPLETIONS,
        tenant=tenant,
        prompt_token_ids=tuple(range(1, prompt + 1)),
        priority=priority,
        slo=slo if deadline is None else SLO(ttft_s=deadline, tpot_s=slo.tpot_s),
        deadline_s=deadline,
    )


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_requests_go_at_once_while_there_is_room_and_charge_their_prompt() -> None:
    gate, registry = make_gate(Pool(capacity=2), FakeClock())
    grant = await gate.admit(request("r1", "a", prompt=100))
    assert gate.admitted == 1
    assert gate.queue.counter("a") == 100
    assert sample(registry, "tandem_router_tenant_served_tokens_total", tenant="a", kind="prompt") == 100
    grant.release()
    grant.release()  # idempotent
    assert gate.admitted == 0


async def test_a_saturated_pool_queues_and_each_release_dispatches_the_least_served_tenant() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock())
    running = await gate.admit(request("h0", "heavy", prompt=500))
    waiting = {
        rid: asyncio.create_task(gate.admit(request(rid, tenant)))
        for rid, tenant in (("h1", "heavy"), ("h2", "heavy"), ("l1", "light"))
    }
    await settle()
    assert len(gate.queue) == 3 and not any(t.done() for t in waiting.values())
    assert sample(registry, "tandem_router_queue_depth", priority="0") == 3
    # light arrived while heavy was backlogged at 500, so it was lifted to 500, not left at 0.
    assert gate.queue.counter("light") == gate.queue.counter("heavy") == 500
    order = []
    for _ in range(3):
        running.release()
        await settle()
        done = [rid for rid, task in waiting.items() if task.done() and rid not in order]
        assert len(done) == 1
        order += done
        running = await waiting[done[0]]
    # h1 wins the 500/500 tie by arrival; then heavy is at 510 and light (500) goes before h2.
    assert order == ["h1", "l1", "h2"]


async def test_fcfs_dispatches_in_arrival_order_whoever_sent_it() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock(), fcfs=True)
    running = await gate.admit(request("h0", "heavy", prompt=500))
    first = asyncio.create_task(gate.admit(request("h1", "heavy")))
    second = asyncio.create_task(gate.admit(request("l1", "light")))
    await settle()
    running.release()
    await settle()
    assert first.done() and not second.done()
    (await first).release()
    await settle()
    assert second.done()


async def test_a_full_queue_answers_429_at_once_with_a_retry_after() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock(), max_queue=1)
    await gate.admit(request("r0", "a"))
    queued = asyncio.create_task(gate.admit(request("r1", "a")))
    await settle()
    with pytest.raises(Overloaded) as caught:
        await gate.admit(request("r2", "b"))
    assert caught.value.status == 429 and caught.value.reason == "queue_full"
    assert caught.value.response_headers()["retry-after"] == str(caught.value.retry_after_s)
    assert caught.value.retry_after_s >= 1
    assert sample(registry, "tandem_router_admission_rejections_total", reason="queue_full") == 1
    assert len(gate.queue) == 1 and gate.queue.counter("b") == 0  # refused before it queued: untouched
    queued.cancel()


async def test_a_full_queue_pushes_out_the_newest_request_of_the_tenant_over_its_share() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock(), max_queue=3)
    running = await gate.admit(request("h0", "heavy"))
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in (1, 2, 3)]
    await settle()
    light = asyncio.create_task(gate.admit(request("l1", "light")))
    await settle()
    # heavy held the whole queue: its newest request made room for light's.
    with pytest.raises(Overloaded) as caught:
        await heavy[2]
    assert caught.value.reason == "pushed_out" and caught.value.retry_after_s >= 1
    assert not light.done() and len(gate.queue) == 3
    # Now heavy holds 2 of 3 places and light 1: a swap would only turn 2/1 into 1/2, so light's
    # second request and heavy's next are both refused outright.
    for rid, tenant in (("l2", "light"), ("h4", "heavy")):
        with pytest.raises(Overloaded) as refused:
            await gate.admit(request(rid, tenant))
        assert refused.value.reason == "queue_full"
    assert sample(registry, "tandem_router_admission_rejections_total", reason="pushed_out") == 1
    assert sample(registry, "tandem_router_admission_rejections_total", reason="queue_full") == 2
    for task in (heavy[0], heavy[1], light):
        assert not task.done()
        task.cancel()
    running.release()


async def test_fcfs_knows_no_shares_and_refuses_the_newcomer_to_a_full_queue() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock(), max_queue=2, fcfs=True)
    await gate.admit(request("h0", "heavy"))
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in (1, 2)]
    await settle()
    with pytest.raises(Overloaded) as caught:
        await gate.admit(request("l1", "light"))
    assert caught.value.reason == "queue_full"
    for task in heavy:
        task.cancel()


async def drain_at(
    clock: FakeClock, running: Grant, waiting: Sequence[asyncio.Task[Grant]], *, every_s: float, n: int
) -> Grant:
    """Release the running grant `n` times, `every_s` apart (the queue drains at 1/every_s); each
    release dispatches exactly one of `waiting`, which becomes the running grant."""
    seen = {id(t) for t in waiting if t.done()}
    for _ in range(n):
        clock.advance(every_s)
        running.release()
        await settle()
        [fresh] = [t for t in waiting if t.done() and id(t) not in seen]
        seen.add(id(fresh))
        running = fresh.result()
    return running


async def test_early_rejection_prices_what_is_ahead_of_each_tenant_not_the_queues_length() -> None:
    """Heavy has 12 requests waiting; the queue drains at 10/s. A heavy request with a 0.5 s deadline
    has ~1.2 s of its own backlog ahead: refused at once. A light request with the same deadline
    has one request ahead under VTC: queued, and served first."""
    clock = FakeClock()
    gate, registry = make_gate(Pool(capacity=1), clock, max_queue=50)
    running = await gate.admit(request("h0", "heavy"))
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in range(1, 20)]
    await settle()
    running = await drain_at(clock, running, heavy, every_s=0.1, n=7)
    assert len(gate.queue) == 12
    with pytest.raises(Overloaded) as caught:
        await gate.admit(request("late", "heavy", deadline=0.5))
    assert caught.value.reason == "deadline" and "1.2s of queue ahead" in caught.value.message
    assert caught.value.retry_after_s == 2  # ceil((12 + 1) / 10)
    light = asyncio.create_task(gate.admit(request("l1", "light", deadline=0.5)))
    await settle()
    assert not light.done() and len(gate.queue) == 13
    running = await drain_at(clock, running, [*heavy, light], every_s=0.1, n=1)
    assert not light.done()  # the one ahead of it: heavy's oldest wins the counters' tie by arrival
    running = await drain_at(clock, running, [*heavy, light], every_s=0.1, n=1)
    assert light.done() and light.result() is running
    # Without a deadline of its own, heavy's next request waits (its budget is the queue limit).
    patient = asyncio.create_task(gate.admit(request("patient", "heavy")))
    await settle()
    assert not patient.done()
    assert sample(registry, "tandem_router_admission_rejections_total", reason="deadline") == 1
    for task in (*heavy, patient):
        task.cancel()
    await settle()
    assert len(gate.queue) == 0


async def test_under_fcfs_the_light_request_has_the_whole_queue_ahead_of_it() -> None:
    clock = FakeClock()
    gate, _ = make_gate(Pool(capacity=1), clock, fcfs=True, max_queue=50)
    running = await gate.admit(request("h0", "heavy"))
    heavy = [asyncio.create_task(gate.admit(request(f"h{i}", "heavy"))) for i in range(1, 20)]
    await settle()
    await drain_at(clock, running, heavy, every_s=0.1, n=7)
    with pytest.raises(Overloaded) as caught:
        await gate.admit(request("l1", "light", deadline=0.5))
    assert caught.value.reason == "deadline"
    for task in heavy:
        task.cancel()


async def test_max_queue_zero_still_dispatches_when_there_is_room() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock(), max_queue=0)
    await gate.admit(request("r0", "a"))
    with pytest.raises(Overloaded):
        await gate.admit(request("r1", "a"))


async def test_a_request_still_queued_at_its_own_deadline_gets_429() -> None:
    clock = FakeClock()
    gate, registry = make_gate(Pool(capacity=1), clock)
    await gate.admit(request("r0", "a"))
    waiting = asyncio.create_task(gate.admit(request("r1", "b", deadline=2.0)))
    await asyncio.sleep(0.03)
    assert not waiting.done()
    clock.advance(2.0)
    with pytest.raises(Overloaded) as caught:
        await asyncio.wait_for(waiting, timeout=5)
    assert caught.value.reason == "deadline"
    assert "2s" in caught.value.message
    # b was lifted to a's counter when it queued, and never charged its prompt.
    assert len(gate.queue) == 0 and gate.queue.counter("b") == gate.queue.counter("a") == 10
    assert sample(registry, "tandem_router_queue_wait_seconds_count", outcome="rejected") == 1


async def test_on_the_loops_own_clock_a_deadline_is_met_by_its_own_timer_not_the_poll() -> None:
    """A gate whose poll is an hour apart still refuses a waiter at its own 50 ms deadline."""
    gate, _ = make_gate(Pool(capacity=1), asyncio.get_running_loop().time, poll_s=3600.0)
    await gate.admit(request("r0", "a"))
    with pytest.raises(Overloaded) as caught:
        await asyncio.wait_for(gate.admit(request("r1", "b", deadline=0.05)), timeout=5)
    assert caught.value.reason == "deadline" and len(gate.queue) == 0


async def test_held_requests_do_not_wake_up_one_by_one_while_they_wait() -> None:
    """100 requests held behind a full pool: the gate pumps once per poll (10 ms), not once per
    waiter per poll (100 × as many), and still serves them all when capacity frees."""
    pool = Pool(capacity=1)
    gate, _ = make_gate(pool, FakeClock(), max_queue=200)
    first = await gate.admit(request("r0", "a"))
    pumps = 0
    pump = gate.pump

    def counting_pump() -> None:
        nonlocal pumps
        pumps += 1
        pump()

    gate.pump = counting_pump  # type: ignore[method-assign]
    held = [asyncio.create_task(gate.admit(request(f"r{i}", f"t{i % 4}"))) for i in range(1, 101)]
    await settle()
    pumps = 0
    await asyncio.sleep(0.05)  # about 5 polls
    assert 0 < pumps < 100, f"{pumps} pumps for 100 held requests over about 5 polls"
    pool.capacity = 200
    first.release()
    grants = await asyncio.wait_for(asyncio.gather(*held), timeout=5)
    assert len(grants) == 100 and len(gate.queue) == 0


async def test_the_router_queue_limit_caps_a_long_objective() -> None:
    clock = FakeClock()
    gate, _ = make_gate(Pool(capacity=1), clock, max_wait_s=5)
    await gate.admit(request("r0", "a"))
    waiting = asyncio.create_task(gate.admit(request("r1", "b")))  # TTFT objective: an hour
    await asyncio.sleep(0.03)
    clock.advance(5.0)
    with pytest.raises(Overloaded):
        await asyncio.wait_for(waiting, timeout=5)


async def test_a_client_leaving_while_queued_withdraws_its_request_uncharged() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock())
    running = await gate.admit(request("r0", "a"))
    waiting = asyncio.create_task(gate.admit(request("r1", "b", prompt=40)))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(gate.queue) == 0 and gate.queue.counter("b") == gate.queue.counter("a") == 10
    assert sample(registry, "tandem_router_queue_wait_seconds_count", outcome="cancelled") == 1
    running.release()
    assert gate.admitted == 0


async def test_a_request_that_must_wait_with_a_predicted_ttft_beyond_its_objective_is_rejected_early() -> (
    None
):
    predictions = Predictions({"late": 5.0, "fine": 0.5, "patient": 5.0})
    gate, registry = make_gate(Pool(capacity=1), FakeClock(), predictor=predictions)
    running = await gate.admit(request("r0", "a"))
    with pytest.raises(Overloaded) as caught:
        await gate.admit(request("late", "a", deadline=1.0))
    assert caught.value.reason == "slo" and "predicted 5s" in caught.value.message
    # Without a deadline of its own, the same prediction refuses nothing: the default objective
    # steers routing, it is nobody's deadline.
    patient = asyncio.create_task(gate.admit(request("patient", "a", slo=SLO(ttft_s=1.0, tpot_s=1))))
    fine = asyncio.create_task(gate.admit(request("fine", "a", deadline=1.0)))
    await settle()
    running.release()
    (await patient).release()
    (await fine).release()
    assert sample(registry, "tandem_router_admission_rejections_total", reason="slo") == 1


async def test_with_room_free_a_request_goes_at_once_whatever_the_prediction() -> None:
    predictions = Predictions({"late": 5.0})
    gate, registry = make_gate(Pool(capacity=4), FakeClock(), predictor=predictions)
    grant = await gate.admit(request("late", "a", deadline=1.0, prompt=7))
    assert gate.queue.counter("a") == 7  # charged as if it had been queued and popped
    grant.release()
    assert sample(registry, "tandem_router_admission_rejections_total", reason="slo") == 0


async def test_higher_priority_goes_first_even_for_a_heavier_tenant() -> None:
    gate, _ = make_gate(Pool(capacity=1), FakeClock())
    running = await gate.admit(request("r0", "heavy", prompt=1000))
    low = asyncio.create_task(gate.admit(request("low", "light")))
    high = asyncio.create_task(gate.admit(request("high", "heavy", priority=5)))
    await settle()
    running.release()
    await settle()
    assert high.done() and not low.done()
    low.cancel()


async def test_with_no_decode_endpoint_in_rotation_requests_are_not_held() -> None:
    gate, _ = make_gate(Pool(capacity=None), FakeClock())
    grant = await gate.admit(request("r0", "a"))
    assert len(gate.queue) == 0 and gate.queue.counter("a") == 0
    grant.release()


async def test_output_is_charged_as_it_streams_and_settled_with_the_engines_usage() -> None:
    gate, registry = make_gate(Pool(capacity=1), FakeClock())
    grant: Grant = await gate.admit(request("r0", "a", prompt=10))
    grant.charge_output(3)
    assert gate.queue.counter("a") == 10 + 2 * 3
    grant.settle(Usage(prompt_tokens=12, completion_tokens=5))  # the estimate was 2 short
    assert gate.queue.counter("a") == 12 + 2 * 5
    assert sample(registry, "tandem_router_tenant_served_tokens_total", tenant="a", kind="prompt") == 12
    assert sample(registry, "tandem_router_tenant_served_tokens_total", tenant="a", kind="completion") == 5
    assert sample(registry, "tandem_router_tenant_vtc_counter", tenant="a") == 22


async def test_a_request_that_had_its_turn_waits_at_the_front_and_is_charged_its_prompt_once() -> None:
    """A pre-empted stream's continuation charges no prompt (its first grant did; the engine's
    usage of the continuation counts the prompt again, with the text so far); a recalled request's
    first charge is corrected by its usage, not added to. Neither is refused for waiting long."""
    clock = FakeClock()
    gate, _ = make_gate(Pool(capacity=1), clock, max_wait_s=60)
    first = await gate.admit(request("r1", "a", prompt=100))
    assert gate.queue.counter("a") == 100
    continued = asyncio.create_task(gate.resume(tenant="a", priority=0))
    recalled = asyncio.create_task(gate.resume(tenant="a", priority=0, prompt_tokens=100))
    await settle()
    clock.advance(3600)  # an hour in the queue: past max_queue_wait, still waiting
    await asyncio.sleep(0.05)
    assert not continued.done() and not recalled.done()
    first.release()  # the one queued last went to the front of its tenant's requests: recalled
    again = await recalled
    again.settle(Usage(prompt_tokens=103, completion_tokens=1))
    assert gate.queue.counter("a") == 103 + 2  # the estimate of 100 corrected to 103, not added to
    again.release()
    grant = await continued
    grant.settle(Usage(prompt_tokens=130, completion_tokens=4))
    assert gate.queue.counter("a") == 105 + 2 * 4  # output weight 2; no second prompt charge
    grant.release()


async def test_a_pre_empting_grant_knows_the_engine_of_the_stream_it_stopped() -> None:
    """`Grant.stopped_on`: where the stopped stream's blocks were freed (`pipeline.stages.Pick` sends a
    disaggregated service's pre-empting request there)."""
    gate, registry = make_gate(Pool(capacity=2), FakeClock())
    gate.preemption = gate.swap = True
    stopped: list[str] = []
    heavy = [await gate.admit(request(f"h{n}", "heavy")) for n in range(2)]
    for n, grant in enumerate(heavy):
        grant.preempt, grant.at = (lambda n=n: stopped.append(f"h{n}")), f"http://decode-{n}"
    light = await gate.admit(request("l1", "light"))
    assert light.preempting and len(stopped) == 1
    assert light.stopped_on == f"http://decode-{stopped[0][1]}"
    assert sample(registry, "tandem_router_preemptions_total", tenant="heavy") == 1
    for grant in (*heavy, light):
        grant.release()
    assert gate.admitted == 0
