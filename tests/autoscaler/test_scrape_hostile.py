"""The autoscaler against engines whose `/metrics` is hostile: one drips a byte at a time forever, one
sends 100 MB (declared or not), one compresses. Their scrapes fail at the deadline or the cap, memory
stays near the cap, and the other services' rounds go on.

Real: HTTP servers on 127.0.0.1 (raw asyncio streams, so they can misbehave at the byte level), the
`Scraper` over a real httpx client, the `Autoscaler` with real `PoolController`s and deciders.
In memory: the pools' targets (a URL list and a replica count). A stuck step is a scrape that never
returns, standing for any call that hangs.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.autoscaler.control import PoolController
from tandem.autoscaler.decider import DeciderParams
from tandem.autoscaler.metrics import AutoscalerMetrics
from tandem.autoscaler.readings import EngineReading
from tandem.autoscaler.runner import Autoscaler
from tandem.autoscaler.scraper import Scraper

PAGE = (
    b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 1.0\n'
    b'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.2\n'
)
CAP = 1 << 20
HUNDRED_MB = 100 * (1 << 20)
Handler = Callable[[asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Sent:
    """Bytes of body each misbehaving server wrote before its client went away."""

    bytes: dict[str, int] = field(default_factory=dict)


async def _good(writer: asyncio.StreamWriter, sent: Sent) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE)
    await writer.drain()


async def _drip(writer: asyncio.StreamWriter, sent: Sent) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:  # one byte a chunk, forever: every byte restarts a read timeout
        writer.write(b"1\r\n#\r\n")
        await writer.drain()
        sent.bytes["drip"] = sent.bytes.get("drip", 0) + 1
        await asyncio.sleep(0.05)


async def _flood(writer: asyncio.StreamWriter, sent: Sent) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"#" * 65536
    while sent.bytes.get("flood", 0) < HUNDRED_MB:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        sent.bytes["flood"] = sent.bytes.get("flood", 0) + len(chunk)
    writer.write(b"0\r\n\r\n")


async def _declared(writer: asyncio.StreamWriter, sent: Sent) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUNDRED_MB)
    chunk = b"#" * 65536
    while sent.bytes.get("declared", 0) < HUNDRED_MB:
        writer.write(chunk)
        await writer.drain()
        sent.bytes["declared"] = sent.bytes.get("declared", 0) + len(chunk)


async def _gzip(writer: asyncio.StreamWriter, sent: Sent) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nxxxx")
    await writer.drain()


@pytest.fixture
async def engines() -> AsyncIterator[tuple[dict[str, str], Sent]]:
    """name → base URL of a server on 127.0.0.1 behaving as named; and what they sent."""
    sent = Sent()
    servers: list[asyncio.Server] = []
    urls: dict[str, str] = {}
    behaviours = {"good": _good, "drip": _drip, "flood": _flood, "declared": _declared, "gzip": _gzip}
    for name, behave in behaviours.items():

        async def serve(
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            behave: Callable[..., Awaitable[None]] = behave,
        ) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await behave(writer, sent)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass  # the scraper hung up, or the test ended: what these servers are for
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        servers.append(server)
        urls[name] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    yield urls, sent
    for server in servers:
        server.close()


async def test_a_dripping_or_oversized_page_fails_its_scrape_and_the_good_one_is_read(
    engines: tuple[dict[str, str], Sent],
) -> None:
    urls, sent = engines
    async with httpx.AsyncClient(trust_env=False) as client:
        scraper = Scraper(client, deadline_s=0.5, max_bytes=CAP)
        tracemalloc.start()
        try:
            readings = await asyncio.wait_for(scraper.scrape(list(urls.values())), timeout=30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    by_name = {name: readings[url] for name, url in urls.items()}
    good = by_name.pop("good")
    assert good is not None and good.running == 1.0
    assert by_name == {"drip": None, "flood": None, "declared": None, "gzip": None}
    assert sent.bytes["drip"] >= 1  # it was dripping when the deadline cut it off
    assert sent.bytes["flood"] < HUNDRED_MB and sent.bytes.get("declared", 0) < HUNDRED_MB
    assert peak < 8 * CAP  # the cap and a chunk, not 100 MB


@dataclass
class MemoryPool:
    ready: list[str]
    asked: int = 1

    async def endpoints(self) -> list[str]:
        return list(self.ready)

    async def requested(self) -> int:
        return self.asked

    async def scale(self, replicas: int, *, reason: str) -> None:
        self.asked = replicas


PARAMS = DeciderParams(min=1, max=4, target=0.5, stable_window_s=4.0, panic_window_s=2.0)


async def test_one_service_with_a_dripping_engine_does_not_hold_back_the_others_round(
    engines: tuple[dict[str, str], Sent],
) -> None:
    urls, _ = engines
    async with httpx.AsyncClient(trust_env=False) as client:
        scraper = Scraper(client, deadline_s=0.3, max_bytes=CAP)
        autoscaler = Autoscaler(metrics=AutoscalerMetrics(CollectorRegistry()), budget_s=5.0)
        for name in ("good", "drip", "flood"):
            target = MemoryPool(ready=[urls[name]])
            control = PoolController(
                service=name, pool="decode", params=PARAMS, target=target, scrape=scraper.scrape
            )
            autoscaler.set_service(name, [control])
        outcomes = await asyncio.wait_for(autoscaler.round(), timeout=30)
    by_service = {o.service: o for o in outcomes}
    assert set(by_service) == {"good", "drip", "flood"}  # every step ended, at the scrape deadline
    assert by_service["good"].decision.valid
    assert not by_service["drip"].decision.valid and not by_service["flood"].decision.valid  # held


async def test_a_step_that_hangs_is_left_running_and_the_next_rounds_go_on_without_it() -> None:
    stuck = asyncio.Event()
    calls: list[str] = []

    async def hangs(urls: Sequence[str]) -> dict[str, EngineReading | None]:
        calls.append("stuck")
        await stuck.wait()  # never set: a call that hangs
        return {}

    async def answers(urls: Sequence[str]) -> dict[str, EngineReading | None]:
        return {url: EngineReading(kv_usage=0.2, running=1.0) for url in urls}

    autoscaler = Autoscaler(metrics=AutoscalerMetrics(CollectorRegistry()), budget_s=0.2)
    for name, scrape in (("stuck", hangs), ("fine", answers)):
        control = PoolController(
            service=name, pool="decode", params=PARAMS, target=MemoryPool(ready=["http://e"]), scrape=scrape
        )
        autoscaler.set_service(name, [control])
    try:
        rounds = [await asyncio.wait_for(autoscaler.round(), timeout=30) for _ in range(3)]
        assert [[o.service for o in outcomes] for outcomes in rounds] == [["fine"]] * 3
        assert calls == ["stuck"]  # one step of the stuck service, not one more per round
        assert set(autoscaler.in_flight) == {"stuck"}
    finally:
        await autoscaler.close()
    assert autoscaler.in_flight == {}
