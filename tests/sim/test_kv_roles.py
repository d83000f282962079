"""KV roles against a real Redis: producers write LMCache's layout, consumers load the stored prefix.

Real: redis-server on 127.0.0.1 (the `redis_server` fixture), producer and consumer apps served by
uvicorn and called with the official `openai` client, redis-py to inspect the pool. For the
pool-outage story the adapter is driven directly with a hand-moved monotonic clock (so "retry after a
second" needs no sleeping); its Redis is real or absent. Nothing else is faked.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from tests.servers import RedisServer, free_port, run_redis_server, run_uvicorn

from tandem.kvpool.keys import chunk_hashes, chunk_key, decode_metadata
from tandem.sim.app import create_app
from tandem.sim.kvpool import KVPool, connect
from tandem.sim.metrics import SimMetrics
from tandem.sim.settings import KVRole, SimSettings

MODEL_ID = "Qwen/Qwen2.5-7B-Instruct"
SERVED = "qwen"
PROMPT = [1000 + i for i in range(600)]  # 600 tokens: two full 256-token chunks and 88 more
NO_EOS = {"ignore_eos": True}
PAYLOAD = 256 * 1024 // 64  # tiny profile: 1 KiB of KV per token, stored at 1/64


def settings(role: KVRole, pool_url: str) -> SimSettings:
    return SimSettings(
        profile="tiny-cpu",
        model=MODEL_ID,
        served_model_name=SERVED,
        time_scale=1000,
        kv_role=role,
        kv_pool=pool_url,
    )


@contextlib.contextmanager
def engine(role: KVRole, pool_url: str) -> Iterator[tuple[str, OpenAI]]:
    with (
        run_uvicorn(create_app(settings(role, pool_url))) as url,
        OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client,
    ):
        yield url, client


class Scrape:
    """One read of an engine's /metrics."""

    def __init__(self, base_url: str) -> None:
        text = httpx.get(f"{base_url}/metrics").text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def __call__(self, name: str, **labels: str) -> float:
        for sample in self.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
        raise KeyError(name)


def expected_keys() -> list[str]:
    return [chunk_key(model=MODEL_ID, chunk_hash=h) for h in chunk_hashes(PROMPT, 256)]


def test_a_producer_writes_full_chunks_and_a_consumer_loads_them(redis_server: RedisServer) -> None:
    with engine("producer", redis_server.url) as (_, producer):
        producer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1)
        with redis_server.client() as pool:  # the write is complete when the response is
            stored = sorted(k.decode() for k in pool.keys("*"))
            keys = expected_keys()
            assert stored == sorted([f"{k}kv_bytes" for k in keys] + [f"{k}metadata" for k in keys])
            assert all(k.startswith(f"{MODEL_ID}@1@0@") and k.endswith("@bfloat16") for k in keys)
            meta = decode_metadata(pool.get(f"{keys[0]}metadata") or b"")
            assert (meta.length, meta.memory_format, meta.dtype_int, meta.shape) == (
                PAYLOAD,
                1,
                3,
                (2, 2, 256, 128),
            )
            assert pool.strlen(f"{keys[1]}kv_bytes") == PAYLOAD
    with engine("consumer", redis_server.url) as (url, consumer):
        reply = consumer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=4, extra_body=NO_EOS)
        assert reply.usage is not None and reply.usage.prompt_tokens == 600
        metric = Scrape(url)
        assert metric("vllm:external_prefix_cache_hits_total") == 512
        assert metric("vllm:external_prefix_cache_queries_total") == 600
        assert metric("tandem_sim_kv_pool_chunks_read_total") == 2
        assert metric("tandem_sim_kv_pool_bytes_read_total") == 2 * (PAYLOAD + 28)


def test_greedy_text_continues_the_same_across_producer_and_consumer(redis_server: RedisServer) -> None:
    with engine("producer", redis_server.url) as (_, producer):
        first = producer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1, temperature=0)
    with engine("consumer", redis_server.url) as (_, consumer):
        full = consumer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=5, temperature=0)
    assert full.choices[0].text.startswith(first.choices[0].text)


def test_each_chunk_is_written_bytes_first_then_metadata(redis_server: RedisServer) -> None:
    with redis_server.client() as pool, pool.pubsub() as events:
        pool.config_set("notify-keyspace-events", "E$")
        events.subscribe("__keyevent@0__:set")
        with engine("producer", redis_server.url) as (_, producer):
            producer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1)
        order: list[str] = []
        while len(order) < 4 and (message := events.get_message(timeout=5.0)) is not None:
            if message["type"] == "message":
                order.append(message["data"].decode())
    keys = expected_keys()
    assert order == [f"{keys[0]}kv_bytes", f"{keys[0]}metadata", f"{keys[1]}kv_bytes", f"{keys[1]}metadata"]


def test_a_streamed_producer_response_ends_only_after_the_write(redis_server: RedisServer) -> None:
    with engine("producer", redis_server.url) as (url, _), redis_server.client() as pool:
        body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 1, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
            lines = [line for line in response.iter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            assert pool.exists(*(f"{k}metadata" for k in expected_keys())) == 2


def test_chunks_already_in_the_pool_are_not_written_again(redis_server: RedisServer) -> None:
    with engine("both", redis_server.url) as (url, client):
        for _ in range(2):
            client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1)
        metric = Scrape(url)
        assert metric("tandem_sim_kv_pool_chunks_written_total") == 2
        assert metric("tandem_sim_kv_pool_chunks_skipped_total") == 2


@pytest.mark.parametrize(
    ("damage", "hits"),
    [
        pytest.param("shorten-second", 256, id="short-bytes-end-the-prefix"),
        pytest.param("delete-first-bytes", 0, id="missing-bytes-are-a-miss"),
        pytest.param("delete-first-metadata", 0, id="no-metadata-no-chunk"),
    ],
)
def test_a_consumer_loads_only_complete_consecutive_chunks(
    redis_server: RedisServer, damage: str, hits: int
) -> None:
    with engine("producer", redis_server.url) as (_, producer):
        producer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1)
    first, second = expected_keys()
    with redis_server.client() as pool:
        if damage == "shorten-second":
            pool.set(f"{second}kv_bytes", b"short")
        elif damage == "delete-first-bytes":
            pool.delete(f"{first}kv_bytes")
        else:
            pool.delete(f"{first}metadata")
    with engine("consumer", redis_server.url) as (url, consumer):
        consumer.completions.create(model=SERVED, prompt=PROMPT, max_tokens=1)
        metric = Scrape(url)
        assert metric("vllm:external_prefix_cache_hits_total") == hits
        assert metric("vllm:external_prefix_cache_queries_total") == 600


@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_with_the_pool_down_requests_still_succeed_and_the_fallback_is_counted(role: KVRole) -> None:
    operation = "store" if role == "producer" else "lookup"
    with engine(role, f"redis://127.0.0.1:{free_port()}") as (url, client):
        reply = client.completions.create(model=SERVED, prompt=PROMPT, max_tokens=2, extra_body=NO_EOS)
        assert reply.choices[0].finish_reason == "length"
        metric = Scrape(url)
        assert metric("tandem_sim_kv_pool_fallbacks_total", operation=operation) == 1
        assert metric("tandem_sim_kv_pool_errors_total", operation=operation) == 1
        assert metric("vllm:external_prefix_cache_hits_total") == 0


async def test_a_dead_pool_is_logged_once_skipped_for_a_while_then_used_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    port = free_port()
    metrics = SimMetrics(CollectorRegistry(), model_name=SERVED, block_size=16, num_gpu_blocks=256)
    pool = KVPool(
        connect(f"redis://127.0.0.1:{port}"),
        layout=settings("both", "redis://unused:1").pool_layout(),
        metrics=metrics,
        retry_after_s=1.0,
        monotonic=lambda: now[0],
    )
    try:
        with caplog.at_level(logging.INFO, logger="tandem.sim.kvpool"):
            assert await pool.lookup(PROMPT) is None  # refused: logged, counted
            now[0] = 0.5
            assert await pool.lookup(PROMPT) is None  # within the retry window: not even tried
            with run_redis_server(port=port):
                now[0] = 1.5
                await pool.store(PROMPT)
                assert await pool.lookup(PROMPT) == 512
        messages = [r.getMessage() for r in caplog.records]
        assert messages.count("kv pool unavailable; computing prompts locally until it is back") == 1
        assert messages.count("kv pool reachable again") == 1
        registry = metrics.registry
        labels = {"model_name": SERVED, "engine": "0", "operation": "lookup"}
        assert registry.get_sample_value("tandem_sim_kv_pool_errors_total", labels) == 1
        assert registry.get_sample_value("tandem_sim_kv_pool_fallbacks_total", labels) == 2
    finally:
        await pool.aclose()
