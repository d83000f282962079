"""VTC fair queuing: the paper's properties, checked as stories on a simulated server.

Pure: the "server" is a loop in this file with a KV capacity of M tokens that admits requests while they
fit and generates one token per running request per step (the paper's continuous-batching model).
Service is counted in tokens, never in wall-clock time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tandem.router.admission.fairness.fcfs import FCFSQueue
from tandem.router.admission.fairness.vtc import QueueFull, VTCQueue

W_P, W_Q = 1.0, 2.0


@dataclass
class Job:
    tenant: str
    prompt: int
    output: int
    generated: int = 0


@dataclass
class Server:
    """Continuous batching with a KV budget of `capacity` tokens (prompt + output reserved at admission)."""

    queue: VTCQueue[Job]
    capacity: int
    running: list[Job] = field(default_factory=list)
    service: dict[str, float] = field(default_factory=dict)
    dispatch_order: list[str] = field(default_factory=list)

    def used(self) -> int:
        return sum(j.prompt + j.output for j in self.running)

    def admit(self) -> None:
        while (ticket := self.queue.peek()) is not None:
            job = ticket.item
            if self.used() + job.prompt + job.output > self.capacity:
                return
            popped = self.queue.pop()
            assert popped is ticket
            self.running.append(job)
            self.dispatch_order.append(job.tenant)
            self._serve(job.tenant, W_P * job.prompt)

    def step(self) -> None:
        self.admit()
        for job in self.running:
            job.generated += 1
            self.queue.charge_output(job.tenant, 1)
            self._serve(job.tenant, W_Q)
        self.running = [j for j in self.running if j.generated < j.output]

    def _serve(self, tenant: str, amount: float) -> None:
        self.service[tenant] = self.service.get(tenant, 0.0) + amount / self.queue.weight(tenant)


def keep_backlogged(server: Server, tenant: str, make: Callable[[], Job], depth: int = 16) -> None:
    """Top the tenant's waiting requests up to `depth`, deep enough that one step never drains them."""
    while _waiting(server, tenant) < depth:
        job = make()
        server.queue.push(job, tenant=tenant, prompt_tokens=job.prompt)


def _waiting(server: Server, tenant: str) -> int:
    return server.queue._queued.get(tenant, 0)


def test_the_least_served_tenant_goes_first_and_fifo_holds_within_a_tenant() -> None:
    queue: VTCQueue[str] = VTCQueue()
    queue.push("a1", tenant="a", prompt_tokens=100)
    queue.push("a2", tenant="a", prompt_tokens=100)
    queue.push("b1", tenant="b", prompt_tokens=10)
    order = [t.item for t in iter(queue.pop, None)]
    # a1 first (tie broken by arrival), then b (counter 0 < 100), then a2.
    assert order == ["a1", "b1", "a2"]


def test_a_tenant_returning_from_idle_is_lifted_to_the_backlogged_minimum() -> None:
    queue: VTCQueue[str] = VTCQueue()
    for i in range(3):
        queue.push(f"a{i}", tenant="a", prompt_tokens=100)
    queue.pop()  # a: 100
    queue.push("b", tenant="b", prompt_tokens=1)
    assert queue.counter("b") == queue.counter("a") == 100


def test_with_nobody_backlogged_a_newcomer_is_lifted_to_the_last_departed_counter() -> None:
    queue: VTCQueue[str] = VTCQueue()
    queue.push("a", tenant="a", prompt_tokens=500)
    queue.pop()
    queue.push("b", tenant="b", prompt_tokens=1)
    assert queue.counter("b") == 500


def test_output_tokens_are_charged_at_the_output_weight_over_the_tenant_weight() -> None:
    queue: VTCQueue[str] = VTCQueue(input_weight=1, output_weight=2, tenant_weights={"gold": 4})
    queue.charge_output("gold", 10)
    queue.charge_output("free", 10)
    assert (queue.counter("gold"), queue.counter("free")) == (5.0, 20.0)


def test_a_higher_priority_band_is_served_before_any_counter_comparison() -> None:
    queue: VTCQueue[str] = VTCQueue()
    queue.push("low", tenant="a", prompt_tokens=1, priority=0)
    queue.charge_output("b", 10_000)
    queue.push("high", tenant="b", prompt_tokens=1, priority=1)
    assert [t.item for t in iter(queue.pop, None)] == ["high", "low"]


def test_a_full_queue_refuses_and_cancelling_frees_a_slot_without_charging() -> None:
    queue: VTCQueue[str] = VTCQueue(max_size=2)
    first = queue.push("1", tenant="a", prompt_tokens=50)
    queue.push("2", tenant="a", prompt_tokens=50)
    with pytest.raises(QueueFull):
        queue.push("3", tenant="b", prompt_tokens=1)
    queue.cancel(first)
    queue.cancel(first)
    assert len(queue) == 1
    queue.push("3", tenant="b", prompt_tokens=1)
    assert queue.counter("a") == 0
    assert [t.item for t in iter(queue.pop, None)] == ["2", "3"]


def bound(max_prompt: int, capacity: int) -> float:
    """U = max(w_p · L_input, w_q · M)."""
    return max(W_P * max_prompt, W_Q * capacity)


def test_backlogged_counters_stay_within_u_and_service_within_2u() -> None:
    capacity, heavy_prompt = 2000, 400
    server = Server(queue=VTCQueue(input_weight=W_P, output_weight=W_Q, max_size=200), capacity=capacity)
    u = bound(heavy_prompt, capacity)
    for _ in range(3000):
        keep_backlogged(server, "heavy", lambda: Job("heavy", prompt=heavy_prompt, output=50))
        keep_backlogged(server, "chatty", lambda: Job("chatty", prompt=20, output=200))
        server.step()
        assert server.queue.gap() <= u
        assert abs(server.service["heavy"] - server.service["chatty"]) <= 2 * u
    # Both were served substantially: the bound is not met by starving one of them.
    assert min(server.service.values()) > 5 * u


def test_a_newly_arrived_light_tenant_is_served_before_the_heavy_backlog() -> None:
    server = Server(queue=VTCQueue(max_size=200), capacity=1000)
    for _ in range(200):
        keep_backlogged(server, "heavy", lambda: Job("heavy", prompt=200, output=100), depth=20)
        server.step()
    server.queue.push(Job("light", prompt=50, output=10), tenant="light", prompt_tokens=50)
    before = len(server.dispatch_order)
    for _ in range(200):
        server.step()
        if "light" in server.dispatch_order[before:]:
            break
    # Lifted to the heavy tenant's counter, the light tenant ties with it; arrival order breaks the
    # tie, so at most the one heavy request at the head goes first, not the 20 waiting behind it.
    assert server.dispatch_order[before:].index("light") <= 1


@pytest.mark.parametrize(("gold_weight"), [2.0, 3.0])
def test_weights_give_proportional_service(gold_weight: float) -> None:
    queue: VTCQueue[Job] = VTCQueue(tenant_weights={"gold": gold_weight}, max_size=200)
    server = Server(queue=queue, capacity=1500)
    raw: dict[str, float] = {}
    for _ in range(4000):
        for tenant in ("gold", "free"):
            keep_backlogged(server, tenant, lambda t=tenant: Job(t, prompt=100, output=60))  # type: ignore[misc]
        server.step()
    for tenant, weighted in server.service.items():
        raw[tenant] = weighted * queue.weight(tenant)
    ratio = raw["gold"] / raw["free"]
    assert ratio == pytest.approx(gold_weight, rel=0.1)


def test_fcfs_serves_by_arrival_and_lets_the_heavier_backlog_take_the_larger_share() -> None:
    """The baseline: the same server under FCFS gives each tenant its share of the waiting requests,
    so a tenant that keeps more requests waiting gets more service; VTC evens it out."""

    def run(queue: VTCQueue[Job]) -> float:
        server = Server(queue=queue, capacity=1000)
        for _ in range(2000):
            # three times as many waiting, and both deeper than a step can drain (10 fit at once)
            keep_backlogged(server, "heavy", lambda: Job("heavy", prompt=50, output=50), depth=36)
            keep_backlogged(server, "light", lambda: Job("light", prompt=50, output=50), depth=12)
            server.step()
        return server.service["light"] / (server.service["light"] + server.service["heavy"])

    assert run(FCFSQueue(max_size=100)) == pytest.approx(0.25, abs=0.05)
    assert run(VTCQueue(max_size=100)) == pytest.approx(0.5, abs=0.02)


def test_fcfs_still_honours_priority_bands() -> None:
    queue: FCFSQueue[str] = FCFSQueue()
    queue.push("old", tenant="a", prompt_tokens=1)
    queue.push("urgent", tenant="b", prompt_tokens=1, priority=2)
    assert [t.item for t in iter(queue.pop, None)] == ["urgent", "old"]


def test_a_prompt_estimate_is_corrected_both_ways() -> None:
    queue: VTCQueue[str] = VTCQueue(tenant_weights={"gold": 2})
    queue.push("r", tenant="gold", prompt_tokens=100)
    queue.pop()
    queue.charge_input("gold", 20)  # the engine counted 120 prompt tokens
    queue.charge_input("gold", -40)  # ... or 80
    assert queue.counter("gold") == (100 + 20 - 40) / 2


def test_depths_count_waiting_requests_per_band() -> None:
    queue: VTCQueue[str] = VTCQueue()
    for i, priority in enumerate((0, 0, 3)):
        queue.push(str(i), tenant=f"t{i}", prompt_tokens=1, priority=priority)
    assert queue.depths() == {0: 2, 3: 1}
    queue.pop()
    assert queue.depths() == {0: 2}


def test_passing_through_charges_exactly_what_a_push_and_a_pop_would() -> None:
    queued: VTCQueue[str] = VTCQueue()
    passed: VTCQueue[str] = VTCQueue()
    for q in (queued, passed):
        q.push("a1", tenant="a", prompt_tokens=300)
        q.pop()
        q.charge_output("a", 50)
    queued.push("b1", tenant="b", prompt_tokens=40)
    queued.pop()
    passed.pass_through(tenant="b", prompt_tokens=40)  # lifted to a's 400 like a push would, then charged
    assert queued.counters() == passed.counters() == {"a": 400.0, "b": 440.0}
    passed.push("w", tenant="a", prompt_tokens=1)
    with pytest.raises(ValueError, match="waiting"):
        passed.pass_through(tenant="b", prompt_tokens=1)


def test_what_is_ahead_of_a_new_request_follows_the_fair_order_not_the_queue_length() -> None:
    """The module docstring's example, then weights: a tenant of weight 2 is served twice as often."""
    q: VTCQueue[str] = VTCQueue(tenant_weights={"gold": 2.0})
    for i in range(30):
        q.push(f"h{i}", tenant="heavy", prompt_tokens=10)
    assert q.ahead(tenant="light") == 1  # none of its own, one heavy request per turn
    assert q.ahead(tenant="heavy") == 30
    q.push("l0", tenant="light", prompt_tokens=10)
    q.push("l1", tenant="light", prompt_tokens=10)
    assert q.ahead(tenant="heavy") == 30 + 2  # light's two come before heavy's 31st
    assert q.ahead(tenant="light") == 2 + 3
    assert q.ahead(tenant="gold") == 1 + 1  # half a turn of each other tenant per gold request, rounded up
    q.push("urgent", tenant="vip", prompt_tokens=10, priority=1)
    assert q.ahead(tenant="light") == 1 + 2 + 3  # the higher band first, whatever its counters
    assert q.ahead(tenant="vip", priority=1) == 1
    fcfs: FCFSQueue[str] = FCFSQueue()
    for i in range(30):
        fcfs.push(f"h{i}", tenant="heavy", prompt_tokens=10)
    assert fcfs.ahead(tenant="light") == 30


def test_a_full_queue_pushes_out_from_the_lowest_band_then_from_the_tenant_holding_most_per_weight() -> None:
    q: VTCQueue[str] = VTCQueue(tenant_weights={"gold": 3.0})
    for i in range(3):
        q.push(f"g{i}", tenant="gold", prompt_tokens=1)
    q.push("s0", tenant="silver", prompt_tokens=1)
    q.push("s1", tenant="silver", prompt_tokens=1)
    # gold holds 3 places at weight 3 (1 per unit) and silver 2 at weight 1: silver is over its share.
    victim = q.displaceable(tenant="bronze")
    assert victim is not None and victim.item == "s1"  # silver's newest
    assert q.displaceable(tenant="silver") is None  # nobody holds more than silver would
    assert q.displaceable(tenant="gold") is not None  # gold's fourth place (4/3) is below silver's 2
    q.push("b0", tenant="bronze", prompt_tokens=1, priority=-1)
    q.push("b1", tenant="bronze", prompt_tokens=1, priority=-1)
    lowest = q.displaceable(tenant="silver")
    assert lowest is not None and lowest.item == "b1"  # a lower band yields first, whoever holds what
    assert q.displaceable(tenant="bronze", priority=-1) is None  # bronze alone in its band
    fcfs: FCFSQueue[str] = FCFSQueue()
    fcfs.push("s0", tenant="silver", prompt_tokens=1)
    fcfs.push("s1", tenant="silver", prompt_tokens=1)
    assert fcfs.displaceable(tenant="bronze") is None
