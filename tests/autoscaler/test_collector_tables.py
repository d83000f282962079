"""The collector's pure half as tables: scrape histories → the decider's observations
(`tandem.autoscaler.observe`; the metrics text → readings half is tests/autoscaler/test_metric_pages.py).

Everything is real autoscaler code and pure; the metrics text is written here in vLLM's exposition
format (the names Tandem's simulator and real vLLM serve), and time is plain floats.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.autoscaler.pages import INF, ROUTER_PAGE, hist

from tandem.autoscaler.observe import (
    PoolHistory,
    Scrape,
    arrival_rates,
    decode_observation,
    learn_service,
    learned_prefill_rate,
    prefill_observation,
    remember,
)
from tandem.autoscaler.readings import (
    EngineReading,
    GatewayReading,
    parse_gateway,
)
from tandem.autoscaler.service import ClockSample, ServiceMemory


def reading(**values: float) -> EngineReading:
    """An engine with `requests` first tokens so far: `slow` of them in (0.5, 1] s, the rest ≤ 0.1 s."""
    requests, slow = values.pop("requests", 0.0), values.pop("slow", 0.0)
    fast = requests - slow
    return EngineReading(
        kv_usage=values.get("kv", 0.0),
        waiting=values.get("waiting", 0.0),
        running=0.0,
        prompt_tokens=values.get("tokens", 0.0),
        ttft=hist(fast, fast, requests, requests),
    )


def history(*scrapes: tuple[float, dict[str, EngineReading | None]]) -> PoolHistory:
    h = PoolHistory()
    for t, readings in scrapes:
        h = remember(h, Scrape(t, readings), keep_s=60.0)
    return h


def test_remember_keeps_only_the_last_seconds() -> None:
    h = history(*((float(t), {}) for t in range(0, 100, 10)))
    assert [s.t for s in h.scrapes] == [30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0]


@pytest.mark.parametrize(
    ("readings", "valid", "util", "why"),
    [
        ({"a": reading(kv=0.2), "b": reading(kv=0.6)}, True, 0.4, None),
        ({}, True, 0.0, None),
        ({"a": reading(kv=0.2), "b": None}, False, 0.0, "no metrics from b"),
        ({"a": EngineReading(waiting=1.0)}, False, 0.0, "a does not report kv_usage"),
    ],
    ids=["mean", "no-engines", "failed-scrape", "missing-metric"],
)
def test_decode_observation(
    readings: dict[str, EngineReading | None], valid: bool, util: float, why: str | None
) -> None:
    observed, problem = decode_observation(history((5.0, readings)))
    assert (observed.valid, observed.ready, problem) == (valid, len(readings), why)
    assert observed.mean_kv_utilization == pytest.approx(util) and observed.timestamp == 5.0


def finished(e2e: float, queue: float, count: float) -> EngineReading:
    return EngineReading(kv_usage=0.5, e2e_sum=e2e, queue_sum=queue, finished=count)


@pytest.mark.parametrize(
    ("scrapes", "service"),
    [
        # The module docstring's example: 12 finished in the window, 30 s in the engines, 6 s waiting.
        ([(1.0, {"a": finished(100, 10, 50)}), (5.0, {"a": finished(130, 16, 62)})], 2.0),
        # Two engines: (20 − 4 + 12 − 0) s over (8 + 6) requests.
        (
            [
                (1.0, {"a": finished(0, 0, 0), "b": finished(0, 0, 0)}),
                (3.0, {"a": finished(20, 4, 8), "b": finished(12, 0, 6)}),
            ],
            2.0,
        ),
        # Nothing finished in the window: the lifetime mean, (100 − 10) / 50.
        ([(1.0, {"a": finished(100, 10, 50)}), (5.0, {"a": finished(100, 10, 50)})], 1.8),
        # A restarted engine (its count went down) counts from 0: 6 / 3.
        ([(1.0, {"a": finished(100, 10, 50)}), (5.0, {"a": finished(6, 0, 3)})], 2.0),
        ([(1.0, {"a": finished(0, 0, 0)}), (5.0, {"a": finished(0, 0, 0)})], None),  # nothing finished yet
        ([(5.0, {"a": reading(kv=0.5)})], None),  # the engine does not report the histograms
    ],
    ids=["docstring", "two-engines", "lifetime", "restart", "none-finished", "not-reported"],
)
def test_the_decode_service_time_is_time_in_the_engine_less_its_wait(
    scrapes: list[tuple[float, dict[str, EngineReading | None]]], service: float | None
) -> None:
    observed, problem = decode_observation(history(*scrapes))
    assert problem is None
    assert observed.service_s == (pytest.approx(service) if service is not None else None)


def test_prefill_ttft_p90_comes_from_bucket_deltas_inside_the_window() -> None:
    h = history(
        (0.0, {"a": reading(requests=100, slow=0)}),  # outside the 6 s window at t = 10
        (5.0, {"a": reading(requests=100, slow=0), "b": reading(requests=0)}),
        (10.0, {"a": reading(requests=104, slow=4), "b": reading(requests=6, slow=0)}),
    )
    observed, _, problem = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    # window deltas: a 4 slow, b 6 fast → pooled 6 ≤ 0.1 s, 10 ≤ 1 s; rank 9 → 0.5 + 3/4 × 0.5
    assert problem is None and observed.valid and observed.ready == 2
    assert observed.ttft_p90_s == pytest.approx(0.875)


@pytest.mark.parametrize(
    ("old", "new", "rate"),
    [
        (reading(tokens=1000, waiting=3, requests=10), reading(tokens=7000, waiting=3, requests=30), 1200.0),
        (reading(tokens=1000, waiting=0, requests=10), reading(tokens=7000, waiting=0, requests=30), None),
    ],
    ids=["saturated-measures-capacity", "idle-measures-nothing"],
)
def test_prefill_rate_is_measured_only_while_requests_wait(
    old: EngineReading, new: EngineReading, rate: float | None
) -> None:
    h = history((0.0, {"a": old}), (5.0, {"a": new}))
    observed, after, _ = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert observed.prefill_tokens_per_s == rate
    assert len(after.rates) == (1 if rate else 0)


def test_prefill_backlog_is_waiting_requests_times_mean_prompt_length() -> None:
    h = history((0.0, {"a": reading(tokens=60_000, requests=200, waiting=8), "b": reading(
        tokens=30_000, requests=100, waiting=4)}))  # fmt: skip
    observed, _, _ = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert observed.queued_prefill_tokens == 12 * 300  # the module docstring's example


def test_the_highest_saturated_rate_is_remembered_for_a_while() -> None:
    h = PoolHistory()
    seen: list[float | None] = []
    scrapes = [
        (0.0, reading(tokens=0, waiting=2, requests=1)),
        (1.0, reading(tokens=3000, waiting=2, requests=2)),  # busy for 1 s only: too short to tell
        (2.0, reading(tokens=6000, waiting=2, requests=3)),  # busy 2 s: 3000 tok/s
        (3.0, reading(tokens=6100, waiting=0, requests=4)),  # idle: measures nothing
        (100.0, reading(tokens=6100, waiting=0, requests=4)),  # the 3000 is older than 60 s
    ]
    for t, r in scrapes:
        h = remember(h, Scrape(t, {"a": r}), keep_s=60.0)
        observed, h, _ = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
        seen.append(observed.prefill_tokens_per_s)
    assert seen == [None, None, 3000.0, 3000.0, None]


def test_a_busy_rate_divides_by_the_time_between_the_answers() -> None:
    first = replace(reading(tokens=0, waiting=2, requests=1), at=0.6)
    second = replace(reading(tokens=6000, waiting=2, requests=3), at=2.1)
    observed, _, _ = prefill_observation(
        history((0.0, {"a": first}), (2.0, {"a": second})), ttft_window_s=6.0, rate_memory_s=60.0
    )
    assert observed.prefill_tokens_per_s == pytest.approx(6000 / 1.5)  # not 6000 / 2.0


def test_an_engine_idle_at_one_scrape_of_the_span_measures_nothing() -> None:
    h = history(
        (0.0, {"a": reading(tokens=0, waiting=2, requests=1)}),
        (1.0, {"a": reading(tokens=500, waiting=0, requests=2)}),  # idle in between: only its load
        (2.0, {"a": reading(tokens=1000, waiting=1, requests=3)}),
    )
    observed, _, _ = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert observed.prefill_tokens_per_s is None


@pytest.mark.parametrize(
    ("readings", "why"),
    [
        ({"a": None}, "no metrics from a"),
        ({"a": EngineReading(kv_usage=0.1, waiting=0.0)}, "a does not report prompt_tokens, ttft"),
    ],
)
def test_prefill_with_missing_data_is_invalid(readings: dict[str, EngineReading | None], why: str) -> None:
    observed, _, problem = prefill_observation(
        history((3.0, readings)), ttft_window_s=6.0, rate_memory_s=60.0
    )
    assert not observed.valid and problem == why


def test_prefill_with_changing_buckets_is_invalid() -> None:
    odd = EngineReading(waiting=0.0, prompt_tokens=0.0, ttft=hist(1, 1, bounds=(1.0, INF)))
    h = history((0.0, {"a": reading(requests=1)}), (1.0, {"a": odd}))
    observed, _, problem = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert not observed.valid and problem is not None and "bucket" in problem


def test_requests_held_for_a_prefill_engine_count_in_the_prefill_backlog() -> None:
    """Late binding keeps a burst's prefills in the gateway, where the engines' waiting counts do not
    see them: 12 waiting in the engines, 3 queued and 5 held for a prefill engine → 20 × 300 tokens."""
    page = ROUTER_PAGE.replace("3.0", "0.0") + "tandem_router_pd_prefill_held 5.0\n"
    gateway = parse_gateway(page)
    assert (gateway.queued, gateway.prefill_held) == (4.0, 5.0)
    engines: dict[str, EngineReading | None] = {
        "a": reading(tokens=60_000, requests=200, waiting=8),
        "b": reading(tokens=30_000, requests=100, waiting=4),
    }
    scrape = Scrape(5.0, engines, {"http://gw-0": replace(gateway, queued=3.0)})
    observed, _, problem = prefill_observation(
        remember(PoolHistory(), scrape, keep_s=60.0), ttft_window_s=6.0, rate_memory_s=60.0
    )
    assert problem is None and observed.queued_prefill_tokens == (12 + 3 + 5) * 300


def test_requests_on_their_way_to_decode_are_held_in_prefill_or_waiting_in_a_decode_engine() -> None:
    """The module docstring's example: 3 held for a prefill engine, 5 open to one, 1 waiting in a
    decode engine → 9; the gateway's queue is its own field, and the decode pool's own in-flight
    requests are not on their way."""
    page = ROUTER_PAGE + (
        "tandem_router_pd_prefill_held 3.0\n"
        "# TYPE tandem_router_pool_in_flight_requests gauge\n"
        'tandem_router_pool_in_flight_requests{pool="prefill"} 5.0\n'
        'tandem_router_pool_in_flight_requests{pool="decode"} 11.0\n'
    )
    gateway = parse_gateway(page)
    assert (gateway.prefill_held, gateway.prefill_in_flight) == (3.0, 5.0)
    engines: dict[str, EngineReading | None] = {
        "a": EngineReading(kv_usage=0.4, running=6.0, waiting=1.0),
        "b": EngineReading(kv_usage=0.2, running=5.0, waiting=0.0),
    }
    observed, problem = decode_observation(
        remember(PoolHistory(), Scrape(5.0, engines, {"http://gw-0": gateway}), keep_s=60.0)
    )
    assert problem is None
    assert (observed.on_the_way, observed.gateway_queued, observed.running_requests) == (9.0, 7.0, 11.0)


def queues(depths: dict[str, float | None]) -> dict[str, GatewayReading | None]:
    return {url: None if q is None else GatewayReading(queued=q) for url, q in depths.items()}


def gateway_history(
    readings: dict[str, EngineReading | None], gateways: dict[str, float | None]
) -> PoolHistory:
    return remember(PoolHistory(), Scrape(5.0, readings, queues(gateways)), keep_s=60.0)


@pytest.mark.parametrize(
    ("gateways", "backlog", "queued"),
    [
        ({}, 12 * 300, 0.0),  # no gateway known: the engines' waiting requests only
        ({"http://gw-0": 5.0, "http://gw-1": 3.0}, (12 + 8) * 300, 8.0),  # the module docstring's example
        ({"http://gw-0": 0.0}, 12 * 300, 0.0),
    ],
    ids=["no-gateway", "two-gateway-replicas", "empty-queue"],
)
def test_prefill_backlog_adds_the_gateways_queued_requests(
    gateways: dict[str, float | None], backlog: int, queued: float
) -> None:
    engines: dict[str, EngineReading | None] = {
        "a": reading(tokens=60_000, requests=200, waiting=8),
        "b": reading(tokens=30_000, requests=100, waiting=4),
    }
    observed, _, problem = prefill_observation(
        gateway_history(engines, gateways), ttft_window_s=6.0, rate_memory_s=60.0
    )
    assert problem is None
    assert (observed.queued_prefill_tokens, observed.gateway_queued) == (backlog, queued)


@pytest.mark.parametrize(
    ("engines", "gateways", "running", "queued", "why"),
    [
        ({"a": EngineReading(kv_usage=0.5, running=6.0)}, {"http://gw": 4.0}, 6.0, 4.0, None),
        ({"a": EngineReading(kv_usage=0.5)}, {}, 0.0, 0.0, None),  # nothing queued: running not needed
        ({"a": EngineReading(kv_usage=0.5)}, {"http://gw": 4.0}, 0.0, 0.0, "a does not report running"),
        ({"a": EngineReading(kv_usage=0.5, running=6.0)}, {"http://gw-0": None, "http://gw-1": 2.0}, 6.0, 2.0,
         None),
    ],
    ids=["queued-and-running", "no-queue", "queued-without-running", "one-gateway-scrape-failed"],
)  # fmt: skip
def test_decode_observation_carries_the_gateways_queue(
    engines: dict[str, EngineReading | None],
    gateways: dict[str, float | None],
    running: float,
    queued: float,
    why: str | None,
) -> None:
    observed, problem = decode_observation(gateway_history(engines, gateways))
    assert (observed.valid, problem) == (why is None, why)
    assert (observed.running_requests, observed.gateway_queued) == (running, queued)


def test_a_failed_gateway_scrape_adds_nothing_and_leaves_the_engines_signals_valid() -> None:
    h = gateway_history({"a": reading(tokens=3000, requests=10, waiting=2)}, {"http://gw": None})
    observed, _, problem = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert problem is None and observed.valid
    assert (observed.gateway_queued, observed.queued_prefill_tokens) == (0.0, 2 * 300)


def gateways_history(*scrapes: tuple[float, dict[str, GatewayReading | None]]) -> PoolHistory:
    h = PoolHistory()
    engines: dict[str, EngineReading | None] = {"http://127.0.0.1:8101": reading(tokens=0)}
    for t, gateways in scrapes:
        h = remember(h, Scrape(t, engines, gateways), keep_s=60.0)
    return h


@pytest.mark.parametrize(
    ("scrapes", "rates"),
    [
        # The module docstring's example: 30 000 → 84 000 tokens and 10 → 28 requests over 2 s.
        (
            [(1.0, {"gw": GatewayReading(arrivals=10, arrival_tokens=30_000)}),
             (3.0, {"gw": GatewayReading(arrivals=28, arrival_tokens=84_000)})],
            (9.0, 27_000.0),
        ),
        # Two replicas add up; the older scrape outside the window is not used.
        (
            [(0.0, {"a": GatewayReading(arrivals=0, arrival_tokens=0)}),
             (2.0, {"a": GatewayReading(arrivals=4, arrival_tokens=4000),
                    "b": GatewayReading(arrivals=0, arrival_tokens=0)}),
             (3.0, {"a": GatewayReading(arrivals=6, arrival_tokens=6000),
                    "b": GatewayReading(arrivals=3, arrival_tokens=9000)})],
            (2.0 + 3.0, 2000.0 + 9000.0),
        ),
        # Rounds that drift late: the window still spans 2 s or more (here 2.04 s), not one round
        # (which would count the 2 requests of the second round alone: 1.96 req/s, or 20 of the first).
        (
            [(0.0, {"gw": GatewayReading(arrivals=0, arrival_tokens=0)}),
             (1.02, {"gw": GatewayReading(arrivals=20, arrival_tokens=60_000)}),
             (2.04, {"gw": GatewayReading(arrivals=22, arrival_tokens=66_000)})],
            (22 / 2.04, 66_000 / 2.04),
        ),
        # A restarted replica counts from 0.
        (
            [(1.0, {"gw": GatewayReading(arrivals=100, arrival_tokens=300_000)}),
             (2.0, {"gw": GatewayReading(arrivals=2, arrival_tokens=6000)})],
            (2.0, 6000.0),
        ),
        # Answers stamped with when they arrived: the time between them, not between the rounds (the
        # second answer came 0.4 s late; by the rounds' 1 s, 3 000 tokens would read 3 000 tokens/s).
        (
            [(10.0, {"gw": GatewayReading(arrivals=0, arrival_tokens=0, at=10.05)}),
             (11.0, {"gw": GatewayReading(arrivals=1, arrival_tokens=3000, at=11.45)})],
            (1 / 1.4, 3000 / 1.4),
        ),
        # No counters (an older gateway), or a single scrape: unknown.
        ([(1.0, {"gw": GatewayReading()}), (2.0, {"gw": GatewayReading(queued=3)})], None),
        ([(1.0, {"gw": GatewayReading(arrivals=1, arrival_tokens=10)})], None),
    ],
    ids=["docstring", "two-replicas", "late-rounds", "restart", "answer-times", "no-counters", "one-scrape"],
)  # fmt: skip
def test_arrival_rates_are_counter_deltas_over_the_leading_window(
    scrapes: list[tuple[float, dict[str, GatewayReading | None]]], rates: tuple[float, float] | None
) -> None:
    measured = arrival_rates(gateways_history(*scrapes), window_s=2.0)
    assert measured == (rates if rates is None else pytest.approx(rates))


def test_the_learned_rate_is_averaged_over_replicas_then_the_highest_engines() -> None:
    engines: dict[str, EngineReading | None] = {"http://10.0.0.1:8000": None, "http://10.0.0.2:8000": None}
    gateways: dict[str, GatewayReading | None] = {
        "gw-0": GatewayReading(prefill_rates={"10.0.0.1:8000": 9000.0, "10.0.0.2:8000": 12_000.0}),
        "gw-1": GatewayReading(prefill_rates={"10.0.0.1:8000": 11_000.0, "10.0.0.9:8000": 1.0}),
        "gw-2": None,
    }
    assert learned_prefill_rate(Scrape(0.0, engines, gateways)) == pytest.approx(12_000.0)
    assert learned_prefill_rate(Scrape(0.0, engines, {"gw": GatewayReading()})) is None


def test_without_gateway_counters_velocity_is_served_plus_backlog_growth() -> None:
    # 300 tokens per request; the engine served 6000 tokens in 2 s and its waiting grew 2 → 6 (+1200).
    old = reading(tokens=30_000, requests=100, waiting=2)
    new = reading(tokens=36_000, requests=120, waiting=6)
    h = history((1.0, {"a": old}), (3.0, {"a": new}))
    observed, _, problem = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert problem is None
    # backlog now 6 × 36 000 / 120 = 1800, before 2 × 300 = 600: (6000 + 1200) / 2 s
    assert observed.arrival_tokens_per_s == pytest.approx((6000 + 1800 - 600) / 2.0)


def test_held_requests_are_decode_demand_and_prefill_backlog() -> None:
    engines: dict[str, EngineReading | None] = {"a": reading(tokens=3000, requests=10, waiting=0)}
    h = remember(PoolHistory(), Scrape(5.0, engines, {"gw": GatewayReading(held=4)}), keep_s=60.0)
    observed, _, _ = prefill_observation(h, ttft_window_s=6.0, rate_memory_s=60.0)
    assert observed.queued_prefill_tokens == 4 * 300
    decode, _ = decode_observation(
        remember(PoolHistory(), Scrape(5.0, {}, {"gw": GatewayReading(held=4)}), keep_s=9)
    )
    assert (decode.ready, decode.gateway_held) == (0, 4.0)


def engine(*, running: float, finished: float, reported: float, at: float | None = None) -> EngineReading:
    """A decode engine's reading: `running` now, `finished` requests so far that ran `reported`
    seconds in all (engine clock; no waiting)."""
    return EngineReading(
        kv_usage=0.1, running=running, e2e_sum=reported, queue_sum=0.0, finished=finished, at=at
    )


def test_a_round_learns_each_engines_point_and_the_clock_since_the_last_scrape() -> None:
    """The module docstring's example: 2 running, then 4, 1.0 s apart → 3.0 request-seconds; 3 finished
    reporting 1.5 s, 0.5 s each, which saw the gauge over [0, 0.5] s: 2.5 running."""
    h = history(
        (0.0, {"a": engine(running=2, finished=10, reported=5.0)}),
        (1.0, {"a": engine(running=4, finished=13, reported=6.5)}),
    )
    learned = learn_service(h).service
    assert learned.clock == (ClockSample(1.0, 3.0, 1.5, 3.0, running_start=2.0, running_end=4.0),)
    (point,) = learned.bins
    assert (point.concurrency, point.service_s, point.weight) == pytest.approx((2.5, 0.5, 3.0))


def test_a_finished_request_is_paired_with_the_load_it_ran_at() -> None:
    """A step: 1 running for seconds, then 11. The 2 requests that finished in the last second took 1.0 s
    each: they ran at the gauge's mean over [8.5, 9.5] s (1 until 9, then 1 → 11 linear to 10:
    (0.5 × 1 + 0.5 × 3.5) / 1 = 2.25), not at 11."""
    scrapes: list[tuple[float, dict[str, EngineReading | None]]] = [
        (float(t), {"a": engine(running=1, finished=t, reported=t * 1.0)}) for t in range(10)
    ]
    h = history(*scrapes, (10.0, {"a": engine(running=11, finished=11, reported=11.0)}))
    bins = learn_service(h).service.bins
    assert [b.concurrency for b in bins] == pytest.approx([2.25])


def test_answer_times_and_restarts_are_respected() -> None:
    late = history(
        (0.0, {"a": engine(running=2, finished=10, reported=5.0, at=0.1)}),
        (1.0, {"a": engine(running=2, finished=11, reported=5.5, at=1.6)}),
    )
    (sample,) = learn_service(late).service.clock
    assert (sample.running_s, sample.finished) == (3.0, 1.0)  # 2 running × 1.5 s between the answers
    restarted = history(
        (0.0, {"a": engine(running=2, finished=10, reported=5.0)}),
        (1.0, {"a": engine(running=1, finished=1, reported=0.4)}),
    )
    assert learn_service(restarted).service == ServiceMemory()


def simulated_pool(*, rounds: int, clock: float) -> PoolHistory:
    """Two engines whose clock runs `clock` times slower than the scraper's (a simulator at time scale
    1 / clock): a at 1 running, 0.7 s reported per request; b at 4 running, 1.0 s. Little's law on the
    scraper's clock sets how many finish per second: running / (clock × reported)."""
    h, counts = PoolHistory(), {"a": (1.0, 0.7, 0.0), "b": (4.0, 1.0, 0.0)}
    for t in range(rounds):
        readings: dict[str, EngineReading | None] = {}
        for url, (running, service, _) in counts.items():
            done = t * running / (clock * service)
            readings[url] = engine(running=running, finished=done, reported=done * service)
        h = learn_service(remember(h, Scrape(float(t), readings), keep_s=7.0))
    return h


def test_the_observation_carries_the_learned_curve_on_the_arrivals_clock() -> None:
    """Bins (1, 0.7 s) and (4, 1.0 s) → 0.6 + 0.1·c engine seconds; the engines report half the
    scraper's seconds (Little: 5 running over 2.5 reported seconds per second) → 1.2 + 0.2·c; the
    service time now, (0.5 + 2.0) / (1 / 1.4 + 2) = 0.921 engine seconds → 1.842."""
    observed, problem = decode_observation(simulated_pool(rounds=30, clock=2.0))
    assert problem is None and observed.clock_ratio == pytest.approx(2.0)
    assert observed.service_s == pytest.approx(2 * 2.5 / (1 / 1.4 + 2))
    curve = observed.service_curve
    assert curve is not None
    assert (curve.intercept_s, curve.slope_s, curve.floor_s) == pytest.approx((1.2, 0.2, 1.4))


def test_before_enough_requests_finished_the_engines_seconds_are_taken_as_they_are() -> None:
    observed, _ = decode_observation(simulated_pool(rounds=4, clock=2.0))  # 3 rounds: 8 finished
    assert observed.clock_ratio is None
    assert observed.service_s == pytest.approx(2.5 / (1 / 1.4 + 2))
