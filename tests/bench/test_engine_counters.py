"""Engine counters: Prometheus text parsing, deltas, hit rates, and scraping over HTTP.

Real: `prometheus_client`'s parser, the counter maths, and (last test) httpx against an
`httpx.MockTransport` that serves fixed Prometheus text or fails; no server is started.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tandem.bench.counters import EngineCounters, MetricsError, engine_report, parse_counters
from tandem.bench.engines import metrics_url, scrape_all

VLLM_TEXT = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="qwen"} 1000.0
vllm:prefix_cache_queries_created{engine="0",model_name="qwen"} 1.7e+09
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 600.0
# TYPE vllm:external_prefix_cache_queries counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="qwen"} 400.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="qwen"} 256.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1000.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 320.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen"} 7.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="qwen"} 2.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="qwen"} 6.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="qwen"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="qwen"} 1.25
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
"""


def test_vllm_counters_are_read_and_label_sets_summed() -> None:
    assert parse_counters(VLLM_TEXT) == EngineCounters(
        prefix_queries=1000, prefix_hits=600, external_queries=400, external_hits=256,
        prompt_tokens=1000, generation_tokens=320, requests=10, preemptions=2, ttft_sum=1.25, ttft_count=10,
    )  # fmt: skip


def test_untyped_samples_with_the_total_name_count_too_and_absent_ones_are_zero() -> None:
    text = 'vllm:prefix_cache_queries_total{engine="0"} 5\nvllm:prefix_cache_queries_total{engine="1"} 7\n'
    assert parse_counters(text) == EngineCounters(prefix_queries=12)
    assert parse_counters("") == EngineCounters()


def test_malformed_text_is_a_metrics_error() -> None:
    with pytest.raises(MetricsError, match="invalid Prometheus text"):
        parse_counters("vllm:prefix_cache_queries_total{engine=0 12\n")


def rates(
    prefix: float | None, external: float | None, reused: float | None, ttft: float | None
) -> dict[str, Any]:
    return {"prefix_hit_rate": prefix, "external_hit_rate": external, "reused_fraction": reused,
            "engine_ttft_mean_s": ttft}  # fmt: skip


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (EngineCounters(prefix_queries=1000, prefix_hits=750), rates(0.75, None, 0.75, None)),
        (EngineCounters(prefix_queries=1000, prefix_hits=200, external_queries=800, external_hits=512,
                        ttft_sum=3.0, ttft_count=20), rates(0.2, 0.64, 0.712, 0.15)),
        (EngineCounters(), rates(None, None, None, None)),
    ],
)  # fmt: skip
def test_hit_rates_of_a_delta(delta: EngineCounters, expected: dict[str, float | None]) -> None:
    assert delta.rates() == pytest.approx(expected)


def test_overall_rates_are_token_weighted_over_engines_and_failed_scrapes_left_out() -> None:
    before: dict[str, EngineCounters | str] = {
        "a": EngineCounters(prefix_queries=100, prefix_hits=10),
        "b": EngineCounters(),
        "c": "down",
    }
    after = {
        "a": EngineCounters(prefix_queries=1100, prefix_hits=910),  # 900 of 1000: 90%
        "b": EngineCounters(prefix_queries=100, prefix_hits=0),  # 0 of 100
        "c": EngineCounters(prefix_queries=5),
    }
    report = engine_report(before, after)
    assert report["engines"]["a"]["prefix_hit_rate"] == 0.9
    assert report["engines"]["c"] == {"error": "down"}
    assert report["overall"]["engines_counted"] == 2
    assert report["overall"]["prefix_hit_rate"] == pytest.approx(900 / 1100), "not the mean of 0.9 and 0"


def test_no_engine_means_no_overall_rates() -> None:
    assert engine_report({}, {}) == {"engines": {}, "overall": None}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h:1", "http://h:1/metrics"),
        ("http://h:1/", "http://h:1/metrics"),
        ("http://h:1/v1", "http://h:1/metrics"),
        ("http://h:1/metrics", "http://h:1/metrics"),
    ],
)
def test_metrics_urls(url: str, expected: str) -> None:
    assert metrics_url(url) == expected


async def test_scraping_reports_each_engines_counters_or_its_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "up":
            return httpx.Response(200, text=VLLM_TEXT)
        if request.url.host == "broken":
            return httpx.Response(500, text="oops")
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        result = await scrape_all(client, ["http://up:1", "http://broken:1", "http://down:1"])
    assert result["http://up:1"] == parse_counters(VLLM_TEXT)
    assert "HTTPStatusError" in str(result["http://broken:1"])
    assert str(result["http://down:1"]) == "http://down:1/metrics: ConnectError: refused"
