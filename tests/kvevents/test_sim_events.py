"""The simulator publishes vLLM's KV events; the router's subscriber and index follow them.

Real: the simulator app (`create_app`) served by uvicorn on 127.0.0.1 (`tests.servers.run_uvicorn`,
its own thread and event loop) with its ZMQ publisher bound on loopback, the router's
`KVEventSubscriber` and `PrecisePrefixIndex` in the test's event loop, HTTP requests with httpx, and,
in the last test, a real `tandem sim` child process. Nothing is faked. The engine runs the tiny
profile at time scale 1000; no test looks at how fast anything was.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from tests.kvevents.harness import RecordingMetrics, eventually
from tests.servers import free_port, run_uvicorn, wait_healthy

from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
from tandem.router.discovery.kvevents.subscriber import EventSource, KVEventSubscriber, SubscriberOptions
from tandem.sim.app import create_app
from tandem.sim.kvevents_publisher import KVEventPublisher
from tandem.sim.kvevents_wire import Encoding
from tandem.sim.settings import SimSettings

MODEL = "tiny"
PROMPT = list(range(1000, 1200))  # 200 token ids: 12 full blocks of 16 and 8 tokens
OPTIONS = SubscriberOptions(replay_timeout_s=10.0)


@dataclass
class Sim:
    url: str
    app: FastAPI

    @property
    def publisher(self) -> KVEventPublisher:
        runtime = self.app.state.sim.runtime
        assert runtime is not None and runtime.kv_publisher is not None
        publisher: KVEventPublisher = runtime.kv_publisher
        return publisher

    def source(self) -> EventSource:
        return EventSource(self.url, self.publisher.endpoint, self.publisher.replay_endpoint)

    def engine_prefix_tokens(self, prompt: list[int]) -> int:
        """What the engine itself has cached of `prompt` (read while it is idle)."""
        tokens: int = self.app.state.sim.runtime.loop.core.local_prefix_tokens(prompt)
        return tokens


@contextmanager
def serve_sim(*, encoding: Encoding = "map", **fields: object) -> Iterator[Sim]:
    settings = SimSettings.model_validate(
        {
            "profile": "tiny-cpu",
            "served_model_name": MODEL,
            "time_scale": 1000,
            "seed": 1,
            "kv_events_endpoint": "tcp://127.0.0.1:*",
            "kv_events_replay_endpoint": "tcp://127.0.0.1:*",
            "kv_events_encoding": encoding,
            **fields,
        }
    )
    app = create_app(settings)
    with run_uvicorn(app) as url:
        yield Sim(url, app)


@asynccontextmanager
async def follow(
    source: EventSource, index: PrecisePrefixIndex, metrics: RecordingMetrics | None = None
) -> AsyncIterator[KVEventSubscriber]:
    subscriber = KVEventSubscriber(source, sink=index, metrics=metrics, options=OPTIONS)
    await subscriber.start()
    try:
        await subscriber.wait_synced()
        yield subscriber
    finally:
        await subscriber.aclose()


async def complete(
    url: str, prompt: list[int], *, max_tokens: int = 40, cache_salt: str | None = None
) -> None:
    """A greedy completion that runs past several block boundaries (so several batches are sent)."""
    body: dict[str, object] = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("encoding", ["map", "array"])
async def test_the_index_matches_the_full_blocks_of_a_prompt_the_sim_served(encoding: Encoding) -> None:
    index = PrecisePrefixIndex()
    with serve_sim(encoding=encoding) as sim:
        async with follow(sim.source(), index):
            await complete(sim.url, PROMPT)
            await eventually(lambda: index.longest_prefix([sim.url], PROMPT)[sim.url] == 192)
            shared_start = PROMPT[:100] + list(range(5000, 5100))
            assert index.longest_prefix([sim.url], shared_start) == {sim.url: 96}
            assert index.longest_prefix([sim.url], list(range(7000, 7200))) == {sim.url: 0}
            assert index.stats(sim.url).block_size == 16


@pytest.mark.parametrize("encoding", ["map", "array"])
async def test_a_salted_prompt_is_indexed_only_under_the_salt_that_sent_it(encoding: Encoding) -> None:
    """Tenant A's request is cached under A's salt: the index (and the engine) hold it for A only, not
    for B's equal prompt or an unsalted one; once B sends it too, both hold it, each in its own scope."""
    index = PrecisePrefixIndex()
    with serve_sim(encoding=encoding) as sim:
        async with follow(sim.source(), index):
            await complete(sim.url, PROMPT, cache_salt="tenant-a")
            await eventually(
                lambda: index.longest_prefix([sim.url], PROMPT, cache_salt="tenant-a")[sim.url] == 192
            )
            assert index.longest_prefix([sim.url], PROMPT, cache_salt="tenant-b") == {sim.url: 0}
            assert index.longest_prefix([sim.url], PROMPT) == {sim.url: 0}
            core = sim.app.state.sim.runtime.loop.core
            assert core.local_prefix_tokens(PROMPT, cache_salt="tenant-b") == 0
            await complete(sim.url, PROMPT, cache_salt="tenant-b")
            await eventually(
                lambda: index.longest_prefix([sim.url], PROMPT, cache_salt="tenant-b")[sim.url] == 192
            )
            assert index.longest_prefix([sim.url], PROMPT, cache_salt="tenant-a") == {sim.url: 192}
            assert index.longest_prefix([sim.url], PROMPT) == {sim.url: 0}


async def test_evictions_in_the_engine_reach_the_index() -> None:
    """20 blocks: a second long prompt evicts the tail of the first; the index agrees with the engine.
    24 output tokens fill a 13th block, so each request sends a second batch (a first one lost to a
    slow subscription would be noticed as a gap and replayed)."""
    index = PrecisePrefixIndex()
    other = list(range(3000, 3200))
    with serve_sim(num_gpu_blocks=20, max_model_len=256) as sim:
        async with follow(sim.source(), index):
            await complete(sim.url, PROMPT, max_tokens=24)
            await eventually(lambda: index.longest_prefix([sim.url], PROMPT)[sim.url] == 192)
            await complete(sim.url, other, max_tokens=24)
            await eventually(lambda: index.longest_prefix([sim.url], other)[sim.url] == 192)
            expected = sim.engine_prefix_tokens(PROMPT)
            assert 0 < expected < 192
            await eventually(lambda: index.longest_prefix([sim.url], PROMPT)[sim.url] == expected)


async def test_a_subscriber_started_late_catches_up_by_replay() -> None:
    index = PrecisePrefixIndex()
    metrics = RecordingMetrics()
    with serve_sim() as sim:
        await complete(sim.url, PROMPT)
        # One batch for the prompt's 12 blocks, then one each as blocks 13 and 14 fill (tokens
        # 208 and 224 of the 239 computed: the last generated token is never computed).
        await eventually(lambda: sim.publisher.published_batches == 3)
        async with follow(sim.source(), index, metrics):
            # Synced means the catch-up replay is applied: no waiting for live batches.
            assert index.longest_prefix([sim.url], PROMPT) == {sim.url: 192}
            assert metrics.named("replay")[0] == ("ok", sim.publisher.published_batches)
            assert not metrics.named("lost")


def test_the_tandem_sim_command_publishes_on_the_flags_endpoints() -> None:
    port, events, replay = free_port(), free_port(), free_port()
    # The `sim` command itself (not `tandem`'s group, which also imports the router).
    argv = [sys.executable, "-c", "from tandem.cli.sim import sim; sim()", "--profile", "tiny-cpu"]
    argv += ["--served-model-name", MODEL, "--log-format", "json"]
    argv += ["--port", str(port), "--time-scale", "1000", "--kv-events-topic", "kv@sim@tiny"]
    argv += ["--kv-events-endpoint", f"tcp://127.0.0.1:{events}", "--kv-events-encoding", "array"]
    argv += ["--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        response = httpx.post(
            f"{url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 4}, timeout=30
        )
        assert response.status_code == 200
        source = EventSource(url, f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}", "kv@sim")
        assert _late_match(source, PROMPT) == 192
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert '"msg":"kv events published"' in output


def _late_match(source: EventSource, prompt: list[int]) -> int:
    async def run() -> int:
        index = PrecisePrefixIndex()
        async with follow(source, index):
            return index.longest_prefix([source.endpoint], prompt)[source.endpoint]

    return asyncio.run(run())
