"""The relay of a streamed answer, moved from the upstream connection's callbacks: a client that
pushes back pauses the engine's connection and loses nothing, the relay ends only once the last
bytes are sent, and an error in `send` reaches the request's task.

Real: `relay`, `Dispatcher`, `HTTPUpstream` over `Wire`, TCP on 127.0.0.1. Faked: the engine
(tests/router/raw_engine.py), the client's ASGI `send`, the meter and progress (recorders).
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry
from starlette.types import Message
from tests.router.raw_engine import raw_engine, streamed

from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.scheduling import RoundRobin
from tandem.router.settings import ProxySettings
from tandem.router.types import Endpoint
from tandem.router.upstream.client import HTTPUpstream, UpstreamCall, UpstreamReply
from tandem.router.upstream.dispatch import Attempt, Dispatcher
from tandem.router.upstream.relay import relay
from tandem.router.upstream.wire import Wire

PARTS = [b"data: %d\n\n" % i for i in range(6)] + [b"data: [DONE]\n\n"]


class Client:
    """An ASGI `send` that records messages; the `block`-th body message waits for `release`."""

    def __init__(self, *, block: int | None = None, error: Exception | None = None) -> None:
        self.messages: list[Message] = []
        self.block = block
        self.error = error
        self.release = asyncio.Event()
        self.blocked = asyncio.Event()

    async def __call__(self, message: Message) -> None:
        bodies = sum(1 for m in self.messages if m["type"] == "http.response.body")
        if message["type"] == "http.response.body" and bodies == self.block:
            self.blocked.set()
            await self.release.wait()
        if self.error is not None and message["type"] == "http.response.body":
            raise self.error
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


class Meter:
    def __init__(self) -> None:
        self.closed = 0

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        return chunk

    def stream_end(self) -> bytes:
        return b""

    def buffered(self, status: int, body: bytes, /) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


class Progress:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def response_start(self, status: int, /) -> None:
        self.seen.append(f"start {status}")

    def response_first_byte(self) -> None:
        self.seen.append("first byte")

    def response_end(self) -> None:
        self.seen.append("end")

    def response_failed(self, message: str, /) -> None:
        self.seen.append("failed")


async def open_stream(wire: Wire, url: str) -> Attempt:
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=lambda: 0.0)
    registry.set_pool("decode", [url])
    dispatcher = Dispatcher(
        registry=registry,
        scheduler=RoundRobin(),
        upstream=HTTPUpstream(wire, ProxySettings()),
        metrics=RouterMetrics(CollectorRegistry(), registry),
        retries=0,
    )
    call = UpstreamCall(path="/v1/completions", body=b"{}", headers={}, stream=True)
    return await dispatcher.attempt(Endpoint("decode", url), call)


async def test_a_client_that_pushes_back_pauses_the_engine_and_gets_every_byte_in_order(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow: list[str] = []
    monkeypatch.setattr(UpstreamReply, "pause", lambda self: flow.append("pause"))
    monkeypatch.setattr(UpstreamReply, "resume", lambda self: flow.append("resume"))
    client, meter, progress = Client(block=1), Meter(), Progress()
    async with raw_engine(streamed(PARTS, pause_s=0.005)) as engine:
        attempt = await open_stream(wire, engine.url)
        relaying = asyncio.create_task(
            relay(attempt, send=client, headers=(), meter=meter, progress=progress)
        )
        await client.blocked.wait()
        await asyncio.sleep(0.1)  # the engine's later events arrive while the client is stuck
        assert flow == ["pause"]
        assert not relaying.done()
        client.release.set()
        assert await asyncio.wait_for(relaying, 5) is False
    assert flow == ["pause", "resume"]
    assert client.body() == b"".join(PARTS)
    assert client.messages[0]["type"] == "http.response.start"
    assert client.messages[-1]["more_body"] is False
    assert [m["more_body"] for m in client.messages[1:-1]] == [True] * (len(client.messages) - 2)
    assert progress.seen == ["start 200", "first byte", "end"]
    assert meter.closed == 1


async def test_the_relay_returns_only_after_its_last_bytes_are_sent(wire: Wire) -> None:
    client = Client(block=len(PARTS))  # the final (empty, more_body False) message waits
    async with raw_engine(streamed(PARTS, pause_s=0.005)) as engine:
        attempt = await open_stream(wire, engine.url)
        relaying = asyncio.create_task(
            relay(attempt, send=client, headers=(), meter=Meter(), progress=Progress())
        )
        await client.blocked.wait()
        await asyncio.sleep(0.05)
        assert not relaying.done()
        client.release.set()
        await asyncio.wait_for(relaying, 5)
    assert client.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert client.body() == b"".join(PARTS)


async def test_an_error_in_send_reaches_the_requests_task_and_closes_the_engines_connection(
    wire: Wire,
) -> None:
    client = Client(error=RuntimeError("the server refused the message"))
    meter = Meter()
    async with raw_engine(streamed(PARTS, pause_s=0.005)) as engine:
        attempt = await open_stream(wire, engine.url)
        with pytest.raises(RuntimeError, match="refused"):
            await asyncio.wait_for(
                relay(attempt, send=client, headers=(), meter=meter, progress=Progress()), 5
            )
    assert meter.closed == 1
    assert wire.idle_connections() == 0


async def test_the_response_is_complete_when_its_last_bytes_are_sent_not_when_the_task_next_runs(
    wire: Wire,
) -> None:
    """A client that reads the end and closes at once: its disconnect reaches the gateway before the
    request's task runs again, and must find the response complete (else it counts as a client that
    left early, and the request's task is cancelled)."""
    progress = Progress()
    at_close: list[list[str]] = []

    class ClosesAtTheEnd(Client):
        async def __call__(self, message: Message) -> None:
            await super().__call__(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                # what the gateway's disconnect watch would see: it runs before the relay's task
                asyncio.get_running_loop().call_soon(lambda: at_close.append(list(progress.seen)))

    client = ClosesAtTheEnd()
    async with raw_engine(streamed(PARTS, pause_s=0.005)) as engine:
        attempt = await open_stream(wire, engine.url)
        await asyncio.wait_for(relay(attempt, send=client, headers=(), meter=Meter(), progress=progress), 5)
    assert client.body() == b"".join(PARTS)
    assert at_close == [["start 200", "first byte", "end"]]
    assert progress.seen == ["start 200", "first byte", "end"]
