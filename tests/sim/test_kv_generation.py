"""`--kv-generation`: a simulated engine tells KV another generation wrote from its own, under the
same pool keys, and an answer computed from it is another text.

Real: redis-server on 127.0.0.1, a producer and consumers served by uvicorn and called with httpx,
the engines' /metrics. The layout's byte patterns are checked as a pure table. Nothing is faked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.servers import RedisServer, run_uvicorn

from tandem.sim.app import create_app
from tandem.sim.engine.kvlayout import ChunkRef, PoolLayout
from tandem.sim.engine.profiles import PROFILES
from tandem.sim.settings import KVRole, SimSettings

PROMPT = [1000 + i for i in range(300)]  # one full 256-token chunk
BODY = {"model": "qwen", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
FOREIGN = "tandem_sim_kv_pool_foreign_chunks_total"


@pytest.mark.parametrize(
    ("writer", "reader", "foreign"),
    [("g1", "g1", False), ("g1", "g2", True), (None, "g2", True), ("g1", None, False), (None, None, False)],
)
def test_a_reader_with_a_generation_knows_chunks_another_generation_wrote(
    writer: str | None, reader: str | None, foreign: bool
) -> None:
    shape = PROFILES["tiny-cpu"].model
    chunk = ChunkRef(0, 0x1234_5678_9ABC, "m@1@0@123456789abc@bfloat16")
    payload = PoolLayout(model_name="m", shape=shape, generation=writer).payload(chunk)
    assert PoolLayout(model_name="m", shape=shape, generation=reader).foreign(chunk, payload) is foreign


@contextlib.contextmanager
def engine(role: KVRole, pool_url: str, generation: str | None) -> Iterator[str]:
    settings = SimSettings(
        profile="tiny-cpu",
        model="Qwen/Qwen2.5-7B-Instruct",
        served_model_name="qwen",
        time_scale=1000,
        kv_role=role,
        kv_pool=pool_url,
        kv_generation=generation,
    )
    with run_uvicorn(create_app(settings)) as url:
        yield url


def answer(url: str) -> str:
    response = httpx.post(f"{url}/v1/completions", json=BODY, timeout=20)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


def counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_kv_of_another_generation_is_loaded_counted_and_garbles_the_answer(redis_server: RedisServer) -> None:
    with engine("producer", redis_server.url, "g1") as producer:
        computed = answer(producer)  # computes the prompt and writes its chunk
    with (
        engine("consumer", redis_server.url, "g1") as same,
        engine("consumer", redis_server.url, "g2") as other,
    ):
        assert answer(same) == computed  # loaded its own generation's chunk: the same text
        assert counter(same, "vllm:external_prefix_cache_hits_total") == 256
        assert counter(same, FOREIGN) == 0
        garbled = answer(other)  # loaded the chunk as a real engine would, from KV it cannot read
        assert counter(other, "vllm:external_prefix_cache_hits_total") == 256
        assert counter(other, FOREIGN) == 1
        assert garbled != computed
