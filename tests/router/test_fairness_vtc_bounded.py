"""The fair queue and its metrics under a flood of tenant names: state stays at its bound, VTC fair.

Real: `VTCQueue` driven through its public API (push, pop, charge, add_service), no clock. The flood is
10⁵ distinct names against `max_idle` = 1,000 (the same 100 names per remembered slot as 10⁶ against
the default 10⁴). The count of tracked tenants is checked at several points of the flood and is the
same at each: it does not grow with the names, so 10⁶ (or 10⁹) leave it where 10⁵ do. Run once by
hand with 10⁶ names at the default bound: 10,002 tenants tracked (the bound and two backlogged).
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tandem.router.admission.fairness.vtc import IDLE_TENANTS_REMEMBERED, VTCQueue
from tandem.router.admission.metrics import OTHER_TENANTS, AdmissionMetrics

FLOOD = 100_000
BOUND = 1_000


def test_a_flood_of_tenant_names_leaves_the_tracked_tenants_at_the_bound() -> None:
    queue: VTCQueue[str] = VTCQueue(max_size=100, max_idle=BOUND)
    for _ in range(3):  # six requests wait through the flood (one in, one out)
        queue.push("a", tenant="alice", prompt_tokens=10)
        queue.push("b", tenant="bob", prompt_tokens=10)
    sizes = []
    for i in range(FLOOD):
        queue.push("r", tenant=f"flood-{i}", prompt_tokens=10)
        ticket = queue.pop()
        assert ticket is not None
        queue.charge_output(ticket.tenant, 3)
        queue.add_service(f"sibling-{i}", 1.0)  # a sibling worker's or replica's charges, too
        if i + 1 in (FLOOD // 5, FLOOD // 2, FLOOD):
            sizes.append((queue.tracked(), len(queue.backlogged())))
    # Flat: the same at each point, the remembered idle tenants plus the (at most 6) backlogged ones.
    (tracked, backlogged), *_ = sizes
    assert sizes == [(tracked, backlogged)] * 3
    assert tracked == BOUND + backlogged and 0 < backlogged <= 6


def test_the_default_bound_is_ten_thousand_idle_tenants() -> None:
    assert VTCQueue().max_idle == IDLE_TENANTS_REMEMBERED == 10_000
    with pytest.raises(ValueError, match="max_idle"):
        VTCQueue(max_idle=0)


def test_a_forgotten_tenant_returns_at_the_floor_like_a_new_one() -> None:
    """B was served far above A, went idle and was forgotten by a flood of other names: it comes
    back lifted to the backlogged minimum (A's counter), neither below it nor with its old lead."""
    queue: VTCQueue[str] = VTCQueue(max_idle=3)
    queue.push("a", tenant="a", prompt_tokens=100)
    queue.add_service("b", 5_000.0)  # served elsewhere (a sibling), idle here
    for name in ("x", "y", "z"):
        queue.add_service(name, 1.0)
    assert "b" not in queue.counters()
    queue.push("b", tenant="b", prompt_tokens=100)
    assert queue.counter("b") == queue.counter("a") == 0.0


def test_a_remembered_idle_tenant_keeps_its_lead() -> None:
    queue: VTCQueue[str] = VTCQueue(max_idle=3)
    queue.push("a", tenant="a", prompt_tokens=100)
    queue.add_service("b", 5_000.0)
    for name in ("x", "y"):
        queue.add_service(name, 1.0)
    queue.push("b", tenant="b", prompt_tokens=100)
    assert queue.counter("b") == 5_000.0
    assert [t.tenant for t in (queue.pop(), queue.pop()) if t is not None] == ["a", "b"]


def test_the_last_tenant_to_leave_is_kept_as_the_floor() -> None:
    """With nothing waiting, a newcomer is lifted to the last leaver's counter: that one is never
    forgotten, however many names pass after it."""
    queue: VTCQueue[str] = VTCQueue(max_idle=2)
    queue.push("g", tenant="gold", prompt_tokens=900)
    assert queue.pop() is not None
    for name in ("x", "y", "z"):
        queue.add_service(name, 1.0)
    assert queue.counter("gold") == 900.0
    queue.push("n", tenant="newcomer", prompt_tokens=1)
    assert queue.counter("newcomer") == 900.0


def test_a_streaming_tenant_charged_recently_is_not_the_one_forgotten() -> None:
    queue: VTCQueue[str] = VTCQueue(max_idle=3)
    queue.pass_through(tenant="streaming", prompt_tokens=10)
    queue.pass_through(tenant="quiet", prompt_tokens=10)
    queue.pass_through(tenant="last", prompt_tokens=10)
    queue.charge_output("streaming", 1)  # its tokens keep arriving
    queue.add_service("other", 1.0)
    assert set(queue.counters()) == {"last", "streaming", "other"}


def test_a_flood_of_tenant_names_adds_no_metric_series_beyond_the_label_cap() -> None:
    """The tenant label holds (`tandem.router.admission.metrics`): names past `max_tenants` are
    counted under `other`, so the page has at most `max_tenants` + 1 tenants."""
    registry = CollectorRegistry()
    metrics = AdmissionMetrics(registry, max_tenants=50)
    for i in range(FLOOD // 10):
        metrics.served(f"flood-{i}", prompt=3, completion=1)
        metrics.preempted(f"flood-{i}")
    tenants = {
        sample.labels["tenant"]
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if "tenant" in sample.labels
    }
    assert len(tenants) == 51 and OTHER_TENANTS in tenants
