"""The cold-start hold as stories: requests held while the decode pool has no engine, released when
discovery lists one, refused when the hold is full or held too long, withdrawn when the client leaves.

Real: `ColdStartHold`, the `EndpointRegistry` whose `set_pool` wakes it (wired as the composition root
wires it), its Prometheus metrics on a private registry, the JSON log formatter, the event loop.
Faked: the clock (moved by hand; it only measures how long a request was held). The deadline is the
loop's own timer, so the expiry stories use a hold of a few hundredths of a second; nothing asserts
on how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from tests.router.harness import FakeClock

from tandem.core.logs import REQUEST_ID, JsonFormatter
from tandem.core.spec import ColdStartSpec
from tandem.router.admission.coldstart import ColdStartHold, HoldVerdict, hold_verdict
from tandem.router.admission.metrics import HoldMetrics
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import ColdStart

ENGINE = "http://127.0.0.1:8101"
FOREVER = 3600.0


class Stand:
    """A hold over a registry with an empty decode pool, and its metrics."""

    def __init__(self, spec: ColdStartSpec) -> None:
        self.clock = FakeClock()
        self.registry = EndpointRegistry(failure_threshold=1, cooldown_seconds=60, clock=self.clock)
        self.prometheus = CollectorRegistry()
        metrics = HoldMetrics(self.prometheus)
        self.hold = ColdStartHold(
            spec=spec,
            members=lambda: len(self.registry.endpoints("decode")),
            metrics=metrics,
            clock=self.clock,
        )
        metrics.watch(lambda: self.hold.held)
        self.registry.on_members(self.hold.members_changed)

    def sample(self, name: str, **labels: str) -> float:
        value = self.prometheus.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def held(self, n: int) -> None:
        """Let the waiting tasks run until `n` requests are held."""
        for _ in range(100):
            if self.hold.held == n:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{self.hold.held} requests held, not {n}")


def stand(*, max_held: int = 256, hold_s: float = FOREVER, retry_after_s: int = 10) -> Stand:
    return Stand(
        ColdStartSpec(max_held_requests=max_held, hold_seconds=hold_s, retry_after_seconds=retry_after_s)
    )


@pytest.mark.parametrize(
    ("members", "held", "max_held", "verdict"),
    [
        (1, 0, 256, "go"),  # the pool has an engine: nothing to wait for
        (1, 256, 256, "go"),
        (0, 0, 0, "go"),  # holding off: the dispatcher's 503 as before
        (0, 0, 256, "hold"),
        (0, 255, 256, "hold"),
        (0, 256, 256, "full"),
    ],
)
def test_the_verdict_holds_only_while_the_pool_is_empty_and_the_hold_has_room(
    members: int, held: int, max_held: int, verdict: HoldVerdict
) -> None:
    assert hold_verdict(members=members, held=held, max_held=max_held) == verdict


async def test_a_request_goes_on_at_once_when_the_decode_pool_has_an_engine() -> None:
    s = stand()
    s.registry.set_pool("decode", [ENGINE])
    assert await s.hold.wait() is None
    assert s.sample("tandem_router_held_total", outcome="released") == 0


async def test_members_out_of_rotation_are_not_a_cold_start_the_request_goes_on() -> None:
    s = stand()
    s.registry.set_pool("decode", [ENGINE])
    (endpoint,) = s.registry.endpoints("decode")
    assert s.registry.record_failure(endpoint)  # out of rotation: the dispatcher's 503, not a hold
    assert not s.registry.candidates("decode")
    assert await s.hold.wait() is None


async def test_held_requests_are_released_together_when_discovery_lists_a_decode_engine() -> None:
    s = stand()
    waiting = [asyncio.create_task(s.hold.wait()) for _ in range(3)]
    await s.held(3)
    assert s.sample("tandem_router_held_requests") == 3
    s.registry.set_pool("prefill", [ENGINE])  # a prefill engine is no decode engine
    await asyncio.sleep(0)
    assert s.hold.held == 3 and not any(t.done() for t in waiting)
    s.clock.advance(42)
    s.registry.set_pool("decode", [ENGINE])
    assert await asyncio.gather(*waiting) == [42, 42, 42]  # seconds held, on the injected clock
    assert s.sample("tandem_router_held_requests") == 0
    assert s.sample("tandem_router_held_total", outcome="released") == 3
    assert s.sample("tandem_router_hold_seconds_count") == 3
    assert s.sample("tandem_router_hold_seconds_sum") == 3 * 42


async def test_a_pool_that_empties_again_holds_new_requests_again() -> None:
    s = stand()
    s.registry.set_pool("decode", [ENGINE])
    s.registry.set_pool("decode", [])
    held = asyncio.create_task(s.hold.wait())
    await s.held(1)
    s.registry.set_pool("decode", [ENGINE])
    assert await held == 0
    assert s.sample("tandem_router_held_total", outcome="released") == 1


async def test_a_full_hold_refuses_the_next_request_with_429_and_retry_after() -> None:
    s = stand(max_held=2, retry_after_s=7)
    waiting = [asyncio.create_task(s.hold.wait()) for _ in range(2)]
    await s.held(2)
    with pytest.raises(ColdStart) as refused:
        await s.hold.wait()
    error = refused.value
    assert (error.status, error.outcome, error.response_headers()) == (429, "rejected", {"retry-after": "7"})
    assert error.openai_code == "model_cold_start"
    assert "no decode engine is ready yet" in error.message and "2 requests already held" in error.message
    assert s.sample("tandem_router_held_total", outcome="rejected") == 1
    assert s.hold.held == 2  # the refused one was never held
    s.registry.set_pool("decode", [ENGINE])
    await asyncio.gather(*waiting)


async def test_no_holding_lets_the_request_go_on_to_the_dispatchers_503() -> None:
    s = stand(max_held=0)
    assert await s.hold.wait() is None
    assert s.sample("tandem_router_held_total", outcome="rejected") == 0


async def test_a_request_held_past_its_deadline_gets_429_with_retry_after() -> None:
    s = stand(hold_s=0.02, retry_after_s=12)
    with pytest.raises(ColdStart) as expired:
        await s.hold.wait()
    error = expired.value
    assert (error.outcome, error.response_headers()) == ("expired", {"retry-after": "12"})
    assert error.message.startswith("held ") and "no engine yet" in error.message
    assert s.hold.held == 0
    assert s.sample("tandem_router_held_requests") == 0
    assert s.sample("tandem_router_held_total", outcome="expired") == 1
    assert s.sample("tandem_router_hold_seconds_count") == 0  # only released requests are timed


async def test_a_cancelled_held_request_is_withdrawn_and_the_gauge_returns_to_zero() -> None:
    s = stand()
    held = asyncio.create_task(s.hold.wait())
    await s.held(1)
    assert s.sample("tandem_router_held_requests") == 1
    held.cancel()  # the client disconnected
    with pytest.raises(asyncio.CancelledError):
        await held
    assert s.hold.held == 0
    assert s.sample("tandem_router_held_requests") == 0
    assert s.sample("tandem_router_held_total", outcome="cancelled") == 1
    assert s.sample("tandem_router_held_total", outcome="released") == 0


async def test_every_outcome_has_a_series_before_its_first_event() -> None:
    s = stand()
    for outcome in ("released", "expired", "rejected", "cancelled"):
        assert s.prometheus.get_sample_value("tandem_router_held_total", {"outcome": outcome}) == 0


class Lines(logging.Handler):
    """The router logger's lines as the JSON formatter writes them (formatted when emitted, in the
    request's context, as a process's handler does)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler, logger = Lines(), logging.getLogger("tandem.router")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_held_released_and_expired_requests_are_logged_with_their_request_id(lines: Lines) -> None:
    s = stand(hold_s=0.02)

    async def request(request_id: str) -> float | None:
        REQUEST_ID.set(request_id)  # as the Identify stage does (each task has its own context)
        return await s.hold.wait()

    with pytest.raises(ColdStart):
        await asyncio.create_task(request("req-late"))
    s = stand()
    held = asyncio.create_task(request("req-1"))
    await s.held(1)
    s.clock.advance(3)
    s.registry.set_pool("decode", [ENGINE])
    assert await held == 3
    logged = [(line["request_id"], line["msg"], line.get("held_s")) for line in lines.lines]
    assert logged == [
        ("req-late", "request held: the decode pool has no engine yet", None),
        ("req-late", "held request expired: still no decode engine", 0.0),
        ("req-1", "request held: the decode pool has no engine yet", None),
        ("req-1", "held request released: a decode engine is ready", 3.0),
    ]
    assert [line["level"] for line in lines.lines] == ["info", "warning", "info", "info"]
