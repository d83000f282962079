"""`/metrics`: vLLM's metric names, labels and buckets, fed by real traffic.

Real: the app served by uvicorn on 127.0.0.1, called with the official `openai` client; the exposition
is parsed with prometheus_client's own parser. Each test gets a fresh server so counts are exact.
The engine runs the tiny profile at a high time scale; latencies are simulated seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from tests.servers import run_uvicorn

from tandem.core.tokenizer import encode
from tandem.sim.app import create_app
from tandem.sim.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from tandem.sim.settings import SimSettings

MODEL = "qwen"
LABELS = {"model_name": MODEL, "engine": "0"}
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = [
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "tandem_sim_kv_pool_chunks_written",
    "tandem_sim_kv_pool_chunks_skipped",
    "tandem_sim_kv_pool_chunks_read",
    "tandem_sim_kv_pool_bytes_written",
    "tandem_sim_kv_pool_bytes_read",
]
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": REQUEST_LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": REQUEST_LATENCY_BUCKETS,
}
NO_EOS = {"ignore_eos": True}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base_url: str) -> Samples:
    text = httpx.get(f"{base_url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset({**LABELS, **labels}.items()))]


@pytest.fixture
def server() -> Iterator[str]:
    settings = SimSettings(profile="tiny-cpu", served_model_name=MODEL, time_scale=1000)
    with run_uvicorn(create_app(settings)) as url:
        yield url


def test_every_vllm_metric_is_exposed_with_model_and_engine_labels(server: str) -> None:
    samples = scrape(server)
    for name in GAUGES:
        assert value(samples, name) == 0.0
    for reason in ("capacity", "deferred"):
        assert value(samples, "vllm:num_requests_waiting_by_reason", reason=reason) == 0.0
    for name in COUNTERS:
        assert value(samples, f"{name}_total") == 0.0
    assert value(samples, "vllm:request_success_total", finished_reason="stop") == 0.0
    for operation in ("lookup", "store"):
        assert value(samples, "tandem_sim_kv_pool_errors_total", operation=operation) == 0.0
        assert value(samples, "tandem_sim_kv_pool_fallbacks_total", operation=operation) == 0.0
    for name, buckets in HISTOGRAMS.items():
        assert value(samples, f"{name}_count") == 0.0
        les = sorted(float(dict(labels)["le"]) for (n, labels) in samples if n == f"{name}_bucket")
        assert les == [*buckets, float("inf")]
    info = {k: v for (n, labels) in samples if n == "vllm:cache_config_info" for k, v in labels}
    assert {info["block_size"], info["num_gpu_blocks"], info["engine"]} == {"16", "256", "0"}
    assert samples[("vllm:cache_config_info", frozenset(info.items()))] == 1.0


def test_the_ttft_buckets_are_vllms_with_no_2_second_bucket() -> None:
    assert TTFT_BUCKETS[:4] == (0.001, 0.005, 0.01, 0.02)
    assert 2.0 not in TTFT_BUCKETS and TTFT_BUCKETS[-1] == 2560.0


def test_traffic_moves_token_counters_latencies_and_the_prefix_cache(server: str) -> None:
    prompt = "The same long prompt, sent twice, shares its full blocks. " * 6
    with OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        replies = [
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=5, extra_body={"ignore_eos": True}
            )
            for _ in range(2)
        ]
    samples = scrape(server)
    prompt_len = len(encode(prompt))
    assert all(r.usage is not None and r.usage.prompt_tokens == prompt_len for r in replies)
    assert value(samples, "vllm:prompt_tokens_total") == 2 * prompt_len
    assert value(samples, "vllm:generation_tokens_total") == 10
    assert value(samples, "vllm:prefix_cache_queries_total") == 2 * prompt_len
    assert value(samples, "vllm:prefix_cache_hits_total") == (prompt_len - 1) // 16 * 16
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 2
    assert value(samples, "vllm:time_to_first_token_seconds_count") == 2
    assert value(samples, "vllm:inter_token_latency_seconds_count") == 8
    assert value(samples, "vllm:e2e_request_latency_seconds_count") == 2
    assert value(samples, "vllm:e2e_request_latency_seconds_sum") > 0
    assert value(samples, "vllm:num_requests_running") == 0.0
    assert value(samples, "vllm:kv_cache_usage_perc") == 0.0


async def test_requests_beyond_the_kv_cache_are_preempted_and_counted() -> None:
    # 16 blocks = 256 tokens; each request grows to 100 + 120 tokens: four cannot run side by side.
    settings = SimSettings(
        profile="tiny-cpu", served_model_name=MODEL, time_scale=5, num_gpu_blocks=16, max_model_len=256
    )
    with run_uvicorn(create_app(settings)) as url:
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            prompts = [[1000 + 97 * i + j for j in range(100)] for i in range(4)]
            replies = await asyncio.gather(
                *(
                    client.completions.create(model=MODEL, prompt=p, max_tokens=120, extra_body=NO_EOS)
                    for p in prompts
                )
            )
        samples = scrape(url)
    assert all(r.choices[0].finish_reason == "length" for r in replies)
    assert value(samples, "vllm:num_preemptions_total") >= 1
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 4
