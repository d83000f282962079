"""Admission rules as tables: saturation, pool capacity, deadlines, early rejection, Retry-After, the
drain meter, and the tenant/SLO/priority headers.

Pure: plain values in, values out; the drain meter runs on numbers given as the clock. Nothing faked.
"""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from tandem.router.admission.metrics import OTHER_TENANTS, TenantLabels
from tandem.router.admission.policy import (
    DEFAULT_RETRY_AFTER_S,
    DrainMeter,
    EndpointLoad,
    HoldMeter,
    SaturationLimits,
    drain_estimate,
    expected_wait,
    load_from_snapshot,
    pool_capacity,
    pool_drain_rate,
    queue_budget,
    retry_after_seconds,
    saturated,
    wait_out_of_reach,
)
from tandem.router.errors import Forbidden, InvalidRequest
from tandem.router.identity.headers import (
    HeaderTenant,
    PriorityPolicy,
    TenantPriority,
    requested_priority,
    slo_from_headers,
)
from tandem.router.types import SLO, Endpoint, EndpointSnapshot, EngineReading, EngineStats

LIMITS = SaturationLimits(max_waiting=5, max_kv_usage=0.8)


@pytest.mark.parametrize(
    ("load", "full"),
    [
        (EndpointLoad(in_flight=3, limit=4), False),
        (EndpointLoad(in_flight=4, limit=4), True),
        (EndpointLoad(in_flight=0, limit=4, waiting=5), True),
        (EndpointLoad(in_flight=0, limit=4, waiting=4, kv_usage=0.79), False),
        (EndpointLoad(in_flight=0, limit=4, kv_usage=0.8), True),
        (EndpointLoad(in_flight=1, limit=4, waiting=None, kv_usage=None), False),
    ],
)
def test_an_endpoint_is_saturated_by_in_flight_waiting_or_kv(load: EndpointLoad, full: bool) -> None:
    assert saturated(load, LIMITS) is full


def test_engine_checks_can_be_turned_off() -> None:
    limits = SaturationLimits()
    assert not saturated(EndpointLoad(in_flight=0, limit=4, waiting=100, kv_usage=1.0), limits)


@pytest.mark.parametrize(
    ("loads", "capacity"),
    [
        ([], 0),
        ([EndpointLoad(in_flight=0, limit=4)] * 4, 16),
        # an engine reporting 7 waiting with 3 in flight (checks on) keeps its 3
        ([EndpointLoad(in_flight=0, limit=4)] * 3 + [EndpointLoad(in_flight=3, limit=4, waiting=7)], 15),
        ([EndpointLoad(in_flight=9, limit=4, kv_usage=0.9)], 4),  # never more than the limit
        ([EndpointLoad(in_flight=6, limit=4)], 4),  # over the limit by the router's count: still 4
    ],
)
def test_pool_capacity_sums_each_endpoints_room(loads: list[EndpointLoad], capacity: int) -> None:
    assert pool_capacity(loads, LIMITS) == capacity


def test_a_snapshot_gives_engine_numbers_only_when_fresh() -> None:
    stats = EngineStats(running=2, waiting=7, kv_usage=0.5, block_size=16, num_gpu_blocks=100)
    endpoint = Endpoint("decode", "http://e:1")

    def snap(reading: EngineReading | None) -> EndpointSnapshot:
        return EndpointSnapshot(
            endpoint=endpoint, in_flight=3, consecutive_failures=0, in_rotation=True, engine=reading
        )

    assert load_from_snapshot(snap(None), limit=4) == EndpointLoad(in_flight=3, limit=4)
    fresh = EngineReading(stats=stats, scraped_at=0.1, stale=False)
    assert load_from_snapshot(snap(fresh), limit=4) == EndpointLoad(
        in_flight=3, limit=4, waiting=7, kv_usage=0.5
    )
    stale = EngineReading(stats=stats, scraped_at=9.0, stale=True)
    assert load_from_snapshot(snap(stale), limit=4) == EndpointLoad(in_flight=3, limit=4)


@pytest.mark.parametrize(
    ("deadline", "max_wait", "budget"),
    [(1.0, 60.0, 1.0), (120.0, 60.0, 60.0), (None, 60.0, 60.0)],
)
def test_the_queue_budget_is_the_requests_own_deadline_capped_by_the_queue_limit(
    deadline: float | None, max_wait: float, budget: float
) -> None:
    assert queue_budget(deadline_s=deadline, max_queue_wait_s=max_wait) == budget


def test_the_expected_wait_is_what_is_ahead_at_the_drain_rate() -> None:
    assert expected_wait(ahead=40, drain_per_s=20.0) == 2.0  # the docstring's example
    assert expected_wait(ahead=40, drain_per_s=None) is None
    assert expected_wait(ahead=40, drain_per_s=0.0) is None


@pytest.mark.parametrize(
    ("wait", "predicted", "budget", "reject"),
    [
        (None, None, 0.1, False),  # nothing known: never refused on a guess
        (2.0, None, 1.0, True),  # the docstring's example: 2 s of queue, a 1 s deadline
        (2.0, None, 60.0, False),  # the same queue, no deadline of its own
        (None, 1.5, 1.0, True),  # only the engine's prediction
        (0.5, 0.5, 1.0, False),
        (0.6, 0.5, 1.0, True),  # together they miss it
    ],
)
def test_early_rejection_needs_what_is_known_of_the_wait_to_exceed_the_budget(
    wait: float | None, predicted: float | None, budget: float, reject: bool
) -> None:
    assert wait_out_of_reach(wait, predicted, budget_s=budget) is reject


@pytest.mark.parametrize(
    ("ahead", "rate", "seconds"),
    [
        (200, 40.0, 6),  # the docstring's example: ceil(201 / 40)
        (0, 40.0, 1),  # never below one second
        (10_000, 1.0, 60),  # never above a minute
        (5, None, DEFAULT_RETRY_AFTER_S),  # nothing measured yet
        (5, 0.0, DEFAULT_RETRY_AFTER_S),
    ],
)
def test_retry_after_is_the_time_to_drain_what_is_ahead(ahead: int, rate: float | None, seconds: int) -> None:
    assert retry_after_seconds(ahead=ahead, drain_per_s=rate) == seconds


def test_the_drain_meter_measures_dispatches_per_second_of_backlog() -> None:
    meter = DrainMeter(tau_s=10.0)
    assert meter.rate(0.0) is None
    t = 0.0
    meter.tick(t, waiting=True)
    for _ in range(2400):  # a standing queue drained at 40 per second for a minute
        t += 0.025
        meter.tick(t, waiting=True, dispatched=1)
    rate = meter.rate(t)
    assert rate is not None and rate == pytest.approx(40.0, rel=0.01)
    meter.tick(t, waiting=False)
    # A quiet spell is not a slow drain: the rate is per second of backlog...
    quiet = meter.rate(t + 5.0)
    assert quiet is not None and quiet == pytest.approx(40.0, rel=0.01)
    # ...and a measurement that has faded is no measurement (nothing is refused on it).
    assert meter.rate(t + 60.0) is None


def test_the_drain_meter_docstring_example_and_no_rate_before_enough_backlog() -> None:
    meter = DrainMeter(tau_s=10.0, min_busy_s=0.5)
    meter.tick(0.0, waiting=True)
    meter.tick(0.2, waiting=True, dispatched=4)
    assert meter.rate(0.2) is None  # 0.2 s of backlog is not enough to tell a rate
    meter = DrainMeter(tau_s=10.0)
    meter.tick(0.0, waiting=True)
    for i in range(1, 101):  # 100 dispatches over 5 s of backlog
        meter.tick(i * 0.05, waiting=True, dispatched=1)
    rate = meter.rate(5.0)
    assert rate is not None and rate == pytest.approx(20.0, rel=0.03)


def test_the_pools_drain_rate_is_its_capacity_over_how_long_a_request_holds_a_slot() -> None:
    assert pool_drain_rate(capacity=20, mean_hold_s=5.0) == 4.0  # the docstring's example
    assert pool_drain_rate(capacity=None, mean_hold_s=5.0) is None
    assert pool_drain_rate(capacity=0, mean_hold_s=5.0) is None
    assert pool_drain_rate(capacity=20, mean_hold_s=None) is None
    # The module docstring's example: 40 ahead, measured 0.6/s, the pool's 4/s → 10 s.
    assert expected_wait(ahead=40, drain_per_s=drain_estimate(0.6, 4.0)) == 10.0


@pytest.mark.parametrize(
    ("measured", "pool", "rate"),
    [
        (0.6, 4.0, 4.0),  # the docstring's example: measured on the smaller pool, raised to the pool's
        (10.0, 4.0, 10.0),  # a standing queue drains faster than the mean hold says: measured
        (0.0, 4.0, 4.0),
        (0.6, None, 0.6),
        (None, 4.0, None),  # nothing measured: the pool's reading never stands alone
    ],
)
def test_the_wait_is_priced_at_the_measured_rate_raised_to_the_pools(
    measured: float | None, pool: float | None, rate: float | None
) -> None:
    assert drain_estimate(measured, pool) == rate


def test_the_hold_meter_is_a_mean_that_forgets_with_time() -> None:
    meter = HoldMeter(tau_s=10.0, min_weight=3.0)
    for i in range(2):
        meter.observe(float(i), 4.0)
    assert meter.mean(1.0) is None  # two observations are not enough
    for i in range(2, 10):
        meter.observe(float(i), 4.0)
    assert meter.mean(9.0) == pytest.approx(4.0)
    for i in range(10, 20):  # ten seconds of requests that hold 8 s
        meter.observe(float(i), 8.0)
    mean = meter.mean(19.0)
    assert mean is not None and 6.5 < mean < 8.0
    assert meter.mean(19.0 + 60.0) is None  # faded: no reading


def test_the_tenant_comes_from_its_header_trimmed_and_bounded() -> None:
    tenants = HeaderTenant("X-Tenant-Id")
    assert tenants.tenant(Headers({"x-tenant-id": " team-a "})) == "team-a"
    assert tenants.tenant(Headers({})) == "default"
    assert tenants.tenant(Headers({"x-tenant-id": ""})) == "default"
    assert len(tenants.tenant(Headers({"x-tenant-id": "t" * 1000}))) == 128


def test_slo_headers_override_the_service_defaults_in_milliseconds() -> None:
    default = SLO(ttft_s=1.0, tpot_s=0.05)
    assert slo_from_headers(Headers({}), default=default) == default
    headers = Headers({"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20.5"})
    assert slo_from_headers(headers, default=default) == SLO(ttft_s=0.25, tpot_s=0.0205)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-slo-ttft-ms", "fast"),
        ("x-slo-ttft-ms", "0"),
        ("x-slo-ttft-ms", "nan"),
        ("x-slo-tpot-ms", "-3"),
        ("x-slo-tpot-ms", "100000"),
    ],
)
def test_a_malformed_slo_header_is_a_400_naming_it(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        slo_from_headers(Headers({name: value}), default=SLO(ttft_s=1, tpot_s=1))
    assert caught.value.param == name and name in caught.value.message


@pytest.mark.parametrize(("value", "band"), [(None, 0), ("3", 3), (" -10 ", -10), ("10", 10)])
def test_the_priority_header_is_read_as_an_integer_band(value: str | None, band: int | None) -> None:
    headers = Headers({} if value is None else {"x-priority": value})
    assert requested_priority(headers) == (None if value is None else band)


@pytest.mark.parametrize("value", ["11", "-11", "high", "1.5"])
def test_a_priority_outside_the_bands_is_a_400(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        PriorityPolicy().priority("anyone", Headers({"x-priority": value}))
    assert caught.value.param == "x-priority"


POLICY = PriorityPolicy(
    {
        "gold": TenantPriority(band=5),
        "batch": TenantPriority(band=-2),
        "fixed": TenantPriority(1, may_lower=False),
    }
)


@pytest.mark.parametrize(
    ("tenant", "value", "band"),
    [
        ("gold", None, 5),  # the band comes from the configuration
        ("batch", None, -2),
        ("stranger", None, 0),  # tenants not listed: band 0
        ("gold", "2", 2),  # lowering itself is allowed by default
        ("batch", "-5", -5),
        ("stranger", "-1", -1),
        ("gold", "5", 5),  # asking for its own band is fine
        ("fixed", "1", 1),
    ],
)
def test_a_request_gets_its_tenants_band_or_lowers_itself(tenant: str, value: str | None, band: int) -> None:
    headers = Headers({} if value is None else {"x-priority": value})
    assert POLICY.priority(tenant, headers) == band


@pytest.mark.parametrize(
    ("tenant", "value"),
    [("stranger", "1"), ("stranger", "10"), ("batch", "0"), ("gold", "6"), ("fixed", "0")],
)
def test_a_request_can_never_raise_itself_above_its_band_nor_lower_itself_when_not_allowed(
    tenant: str, value: str
) -> None:
    with pytest.raises(Forbidden) as caught:
        POLICY.priority(tenant, Headers({"x-priority": value}))
    assert caught.value.status == 403 and caught.value.param == "x-priority"
    assert repr(tenant) in caught.value.message


def test_tenant_labels_name_the_first_tenants_and_fold_the_rest_into_other() -> None:
    labels = TenantLabels(2)
    assert [labels.label(t) for t in ("a", "b", "c", "a", "d")] == [
        "a",
        "b",
        OTHER_TENANTS,
        "a",
        OTHER_TENANTS,
    ]
    assert labels.named("b") and not labels.named("c")
