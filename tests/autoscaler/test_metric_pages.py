"""Metrics text → readings as tables: a vLLM engine's page and the gateway's, histogram deltas,
sums and quantiles (`tandem.autoscaler.readings`).

Everything is real autoscaler code and pure; the metrics text is written here in vLLM's exposition
format (the names Tandem's simulator and real vLLM serve) and the gateway's.
"""

from __future__ import annotations

import pytest
from tests.autoscaler.pages import INF, ROUTER_PAGE, hist

from tandem.autoscaler.readings import (
    EngineReading,
    GatewayReading,
    Histogram,
    histogram_delta,
    histogram_quantile,
    histogram_sum,
    parse_engine_metrics,
    parse_gateway,
)

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1200.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.1
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 10.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 5.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.5
"""


def test_a_vllm_page_becomes_a_reading() -> None:
    reading = parse_engine_metrics(PAGE)
    assert reading == EngineReading(
        kv_usage=0.5,
        running=3.0,
        waiting=2.0,
        prompt_tokens=1200.0,
        ttft=hist(2, 8, 10, 10),
        e2e_sum=15.0,  # summed over the engine cores, as the counters
        queue_sum=1.5,
        finished=6.0,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", EngineReading()),
        ("vllm:num_requests_waiting 4\n", EngineReading(waiting=4.0)),
        ('x_bucket{le="1"} 1\n', EngineReading()),
    ],
    ids=["empty", "only-waiting", "foreign-metrics"],
)
def test_missing_metrics_stay_none(text: str, expected: EngineReading) -> None:
    assert parse_engine_metrics(text) == expected


def test_text_that_is_not_metrics_is_an_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_engine_metrics("<html>404 not found</html>\n")


@pytest.mark.parametrize(
    ("q", "histogram", "expected"),
    [
        (0.9, hist(2, 8, 10, 10), 0.75),  # the module docstring's example
        (0.5, hist(2, 8, 10, 10), 0.1 + (5 - 2) / 6 * 0.4),
        (0.1, hist(2, 8, 10, 10), 0.05),  # the first bucket starts at 0
        (0.9, hist(0, 0, 1, 10), 1.0),  # rank in +Inf → the largest finite bound
        (0.9, hist(0, 0, 0, 0), None),  # nothing observed
    ],
)
def test_histogram_quantile(q: float, histogram: Histogram, expected: float | None) -> None:
    got = histogram_quantile(q, histogram)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("new", "old", "expected"),
    [
        (hist(3, 9, 12, 12), hist(2, 8, 10, 10), hist(1, 1, 2, 2)),
        (hist(2, 8, 10, 10), hist(2, 8, 10, 10), hist(0, 0, 0, 0)),
        (hist(1, 1, 1, 1), hist(2, 8, 10, 10), hist(1, 1, 1, 1)),  # engine restarted: all new
    ],
    ids=["growth", "quiet", "reset"],
)
def test_histogram_delta(new: Histogram, old: Histogram, expected: Histogram) -> None:
    assert histogram_delta(new, old) == expected


def test_histograms_with_other_buckets_do_not_mix() -> None:
    other = hist(1, 2, bounds=(1.0, INF))
    with pytest.raises(ValueError, match="bucket"):
        histogram_delta(other, hist(2, 8, 10, 10))
    with pytest.raises(ValueError, match="buckets"):
        histogram_sum([other, hist(2, 8, 10, 10)])
    assert histogram_sum([hist(1, 2, 3, 3), hist(1, 1, 1, 1)]) == hist(2, 3, 4, 4)
    assert histogram_sum([]) is None


@pytest.mark.parametrize(
    ("text", "queued"),
    [(ROUTER_PAGE, 7.0), ("tandem_router_admitted_requests 2\n", 0.0), ("", 0.0)],
    ids=["summed-over-priorities", "no-queue-metric", "empty"],
)
def test_the_gateway_page_becomes_its_queue_depth(text: str, queued: float) -> None:
    assert parse_gateway(text).queued == queued


def test_a_gateway_page_that_is_not_metrics_is_an_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_gateway('tandem_router_queue_depth{priority="0" 3\n')


LEADING_PAGE = """\
# TYPE tandem_router_held_requests gauge
tandem_router_held_requests 2.0
# TYPE tandem_router_arrivals_total counter
tandem_router_arrivals_total 28.0
# TYPE tandem_router_arrival_prompt_tokens_total counter
tandem_router_arrival_prompt_tokens_total 84000.0
# TYPE tandem_router_endpoint_prefill_rate_tokens_per_second gauge
tandem_router_endpoint_prefill_rate_tokens_per_second{endpoint="127.0.0.1:8101"} 72000.0
tandem_router_endpoint_prefill_rate_tokens_per_second{endpoint="127.0.0.1:8102"} 8192.0
# TYPE tandem_router_endpoint_prefill_throughput_tokens_per_second gauge
tandem_router_endpoint_prefill_throughput_tokens_per_second{endpoint="127.0.0.1:8101"} 11000.0
"""


def test_the_gateway_page_carries_held_requests_arrivals_and_observed_throughputs() -> None:
    assert parse_gateway(LEADING_PAGE) == GatewayReading(
        queued=0.0,
        held=2.0,
        arrivals=28.0,
        arrival_tokens=84_000.0,
        prefill_rates={"127.0.0.1:8101": 11_000.0},  # 8102 has no first token yet: no throughput
    )
