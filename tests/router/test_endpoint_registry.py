"""The endpoint registry: membership, in-flight accounting, and rotation as stories on a fake clock.

Pure: no servers; the clock is a `FakeClock` moved by hand (seconds).
"""

from __future__ import annotations

from tests.router.harness import FakeClock

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.types import Endpoint

URL_A, URL_B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
A, B = Endpoint("decode", URL_A), Endpoint("decode", URL_B)


def registry(clock: FakeClock, *, threshold: int = 3, cooldown: float = 10.0) -> EndpointRegistry:
    reg = EndpointRegistry(failure_threshold=threshold, cooldown_seconds=cooldown, clock=clock)
    reg.set_pool("decode", [URL_A, URL_B])
    return reg


def candidates(reg: EndpointRegistry) -> list[Endpoint]:
    return [s.endpoint for s in reg.candidates("decode")]


def test_membership_keeps_discovery_order_and_drops_duplicates_and_trailing_slashes() -> None:
    reg = registry(FakeClock())
    reg.set_pool("decode", [URL_B + "/", URL_A, URL_B])
    assert reg.endpoints("decode") == (B, A)
    assert reg.endpoints("prefill") == ()


def test_an_endpoint_leaves_rotation_after_three_consecutive_failures_and_returns_after_cooldown() -> None:
    clock = FakeClock()
    reg = registry(clock)
    assert reg.record_failure(A) is False
    assert reg.record_failure(A) is False
    assert candidates(reg) == [A, B]
    assert reg.record_failure(A) is True
    assert candidates(reg) == [B]
    clock.advance(9.99)
    assert candidates(reg) == [B]
    clock.advance(0.01)
    assert candidates(reg) == [A, B]


def test_a_success_resets_the_failure_count() -> None:
    reg = registry(FakeClock())
    reg.record_failure(A)
    reg.record_failure(A)
    reg.record_success(A)
    reg.record_failure(A)
    reg.record_failure(A)
    assert candidates(reg) == [A, B]
    assert reg.snapshot(A).consecutive_failures == 2


def test_a_returning_endpoint_is_on_probation_one_failure_takes_it_out_again() -> None:
    clock = FakeClock()
    reg = registry(clock)
    for _ in range(3):
        reg.record_failure(A)
    clock.advance(10)
    assert A in candidates(reg)
    assert reg.record_failure(A) is True  # t=10: out again until t=20
    clock.advance(9)
    assert A not in candidates(reg)
    clock.advance(1)
    reg.record_success(A)  # t=20: back, and this time it answers
    reg.record_failure(A)
    assert A in candidates(reg)


def test_candidates_exclude_endpoints_already_tried() -> None:
    reg = registry(FakeClock())
    assert candidates(reg) == [A, B]
    assert [s.endpoint for s in reg.candidates("decode", exclude=[A])] == [B]


def test_in_flight_counts_begin_and_end_and_never_go_negative() -> None:
    reg = registry(FakeClock())
    reg.begin(A)
    reg.begin(A)
    reg.begin(B)
    assert [(s.endpoint, s.in_flight) for s in reg.snapshots("decode")] == [(A, 2), (B, 1)]
    reg.end(A)
    reg.end(A)
    reg.end(A)
    assert reg.snapshot(A).in_flight == 0


def test_a_removed_endpoint_is_tracked_until_its_last_request_ends() -> None:
    reg = registry(FakeClock())
    reg.begin(A)
    reg.set_pool("decode", [URL_B])
    assert candidates(reg) == [B]
    assert {s.endpoint for s in reg.tracked()} == {A, B}
    reg.end(A)
    assert {s.endpoint for s in reg.tracked()} == {B}


def test_an_endpoint_that_stays_in_discovery_keeps_its_state() -> None:
    reg = registry(FakeClock(), threshold=1)
    reg.record_failure(A)
    reg.set_pool("decode", [URL_A, URL_B, "http://10.0.0.3:8000"])
    assert reg.snapshot(A).in_rotation is False
