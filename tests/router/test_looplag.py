"""The event-loop lag monitor and how the dispatcher uses it.

Real: `LagTotal`, `LoopLagMonitor` on the test's loop (its slow idle ticks too), `Dispatcher`,
`EndpointRegistry`, `RouterMetrics`. Faked: the engines (an `Upstream` that fails every call with
the test's error, as the real client translates it; tests/router/test_upstream_proxy.py covers the
translation) and, for the dispatcher, the amount of lag (a monitor whose lag is set by the test).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.errors import (
    NoEndpointAvailable,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamTimeout,
)
from tandem.router.observe.looplag import LagTotal, LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.scheduling import RoundRobin
from tandem.router.types import Endpoint, RequestView, Route
from tandem.router.upstream.client import UpstreamCall, UpstreamReply
from tandem.router.upstream.dispatch import Dispatcher


def test_lag_total_adds_how_late_each_tick_ran_and_counts_an_overdue_tick_up_to_now() -> None:
    total = LagTotal()
    total.expect(10.0)
    assert total.tick(10.25) == pytest.approx(0.25)
    total.expect(10.35)
    assert total.tick(10.3) == 0.0  # early (clock granularity): no negative lag
    assert total.mark(11.0) == pytest.approx(0.25)
    total.expect(11.0)
    assert total.mark(13.0) == pytest.approx(2.25)  # the tick is 2 s overdue: a stall in progress
    assert total.tick(13.5) == pytest.approx(2.5)
    assert total.mark(14.0) == pytest.approx(2.75)


async def test_the_monitor_sees_a_blocked_loop_and_records_the_lag_in_its_histogram() -> None:
    prometheus = CollectorRegistry()
    monitor = LoopLagMonitor(prometheus, interval_s=0.01)
    assert monitor.lag_since(monitor.mark()) == 0.0  # not started: no lag known
    await monitor.start()
    try:
        await asyncio.sleep(0.05)  # let the ticker run
        mark = monitor.mark()
        time.sleep(0.3)  # noqa: ASYNC251 -- the point: block the loop; the tick due within it runs >= 0.29 s late
        assert monitor.lag_since(mark) >= 0.25
        deadline = time.monotonic() + 30
        while (prometheus.get_sample_value("tandem_router_event_loop_lag_seconds_sum") or 0.0) < 0.25:
            assert time.monotonic() < deadline, "the stall never reached the histogram"
            await asyncio.sleep(0.01)
        assert (prometheus.get_sample_value("tandem_router_event_loop_lag_seconds_count") or 0) >= 1
    finally:
        await monitor.stop()


def ticks(prometheus: CollectorRegistry) -> float:
    return prometheus.get_sample_value("tandem_router_event_loop_lag_seconds_count") or 0.0


async def test_an_idle_monitor_ticks_slowly_and_a_mark_watches_its_window_at_the_fine_interval() -> None:
    prometheus = CollectorRegistry()
    monitor = LoopLagMonitor(prometheus, interval_s=0.01, idle_interval_s=0.5, busy=lambda: False)
    await monitor.start()
    try:
        deadline = time.monotonic() + 30
        while not monitor.slow:  # the first tick saw no mark and nothing open
            assert time.monotonic() < deadline, "the idle monitor never slowed down"
            await asyncio.sleep(0.01)
        count = ticks(prometheus)
        await asyncio.sleep(0.1)
        assert ticks(prometheus) <= count + 1  # not ten more
        mark = monitor.mark()
        assert not monitor.slow  # the next tick is 0.01 s away, not up to 0.5 s
        time.sleep(0.3)  # noqa: ASYNC251 -- block the loop: the window's stall must be seen
        assert monitor.lag_since(mark) >= 0.25
    finally:
        await monitor.stop()


async def test_a_busy_monitor_keeps_the_fine_interval() -> None:
    prometheus = CollectorRegistry()
    monitor = LoopLagMonitor(prometheus, interval_s=0.01, idle_interval_s=0.5, busy=lambda: True)
    await monitor.start()
    try:
        await asyncio.sleep(0.2)
        assert not monitor.slow
        assert ticks(prometheus) >= 5
    finally:
        await monitor.stop()


def test_the_registry_is_busy_while_an_upstream_request_is_open() -> None:
    registry = EndpointRegistry(failure_threshold=1, cooldown_seconds=10, clock=lambda: 0.0)
    registry.set_pool("decode", ["http://10.0.0.1:8000"])
    (endpoint,) = registry.endpoints("decode")
    assert not registry.busy()
    registry.begin(endpoint)
    registry.begin(endpoint)
    registry.end(endpoint)
    assert registry.busy()
    registry.end(endpoint)
    assert not registry.busy()


class SetLag(LoopLagMonitor):
    """A monitor whose lag during every attempt is what the test says."""

    def __init__(self, lag_s: float) -> None:
        super().__init__(CollectorRegistry())
        self.lag_s = lag_s

    def mark(self) -> float:
        return 0.0

    def lag_since(self, mark: float) -> float:
        return self.lag_s


class Failing:
    """An `Upstream` whose every call fails with `error`."""

    def __init__(self, error: UpstreamError) -> None:
        self.error = error

    async def open(self, endpoint: Endpoint, call: UpstreamCall) -> UpstreamReply:
        raise type(self.error)(f"{endpoint.name}: {self.error.message}")


def dispatcher_over(
    error: UpstreamError, lag_s: float
) -> tuple[Dispatcher, EndpointRegistry, CollectorRegistry]:
    registry = EndpointRegistry(failure_threshold=1, cooldown_seconds=10, clock=lambda: 0.0)
    registry.set_pool("decode", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    prometheus = CollectorRegistry()
    dispatcher = Dispatcher(
        registry=registry,
        scheduler=RoundRobin(),
        upstream=Failing(error),
        metrics=RouterMetrics(prometheus, registry),
        retries=1,
        loop_lag=SetLag(lag_s),
        excusing_lag_s=2.5,
    )
    return dispatcher, registry, prometheus


VIEW = RequestView(request_id="r", route=Route.CHAT, tenant="t")
CALL = UpstreamCall(path="/v1/chat/completions", body=b"{}", headers={}, stream=True)


def errors(prometheus: CollectorRegistry, kind: str) -> float:
    return sum(
        prometheus.get_sample_value(
            "tandem_router_upstream_errors_total",
            {"pool": "decode", "endpoint": f"10.0.0.{i}:8000", "kind": kind},
        )
        or 0.0
        for i in (1, 2)
    )


async def test_a_connect_timeout_while_the_loop_was_stalled_keeps_the_engine_in_rotation() -> None:
    dispatcher, registry, prometheus = dispatcher_over(UpstreamConnectTimeout("connect timeout"), lag_s=3.0)
    with pytest.raises(NoEndpointAvailable) as caught:
        await dispatcher.open("decode", request=VIEW, call=CALL)
    assert isinstance(caught.value.__cause__, UpstreamConnectTimeout)
    assert [s.in_rotation for s in registry.snapshots("decode")] == [True, True]
    assert [s.consecutive_failures for s in registry.snapshots("decode")] == [0, 0]
    assert errors(prometheus, "loop_lag") == 2  # both tries, still counted, under their own kind
    assert errors(prometheus, "timeout") == 0


async def test_a_connect_timeout_without_loop_lag_counts_against_the_engine() -> None:
    dispatcher, registry, prometheus = dispatcher_over(UpstreamConnectTimeout("connect timeout"), lag_s=2.4)
    with pytest.raises(NoEndpointAvailable):
        await dispatcher.open("decode", request=VIEW, call=CALL)
    assert [s.in_rotation for s in registry.snapshots("decode")] == [False, False]
    assert errors(prometheus, "timeout") == 2


@pytest.mark.parametrize("failure", [UpstreamTimeout("silent"), UpstreamConnectError("refused")])
async def test_other_failures_count_against_the_engine_whatever_the_lag(failure: UpstreamError) -> None:
    dispatcher, registry, _ = dispatcher_over(failure, lag_s=60.0)
    with pytest.raises(NoEndpointAvailable):
        await dispatcher.open("decode", request=VIEW, call=CALL)
    assert [s.consecutive_failures for s in registry.snapshots("decode")] == [1, 1]
