"""The gateway's upstream wire against real sockets: a streamed answer piped to a sink, reads joined,
silence and pause, closing early, keep-alive and its limit, bodies framed by the connection's end,
and what is not HTTP.

Real: `Wire`, TCP on 127.0.0.1. Faked: the engines (tests/router/raw_engine.py answers byte for byte).
"""

from __future__ import annotations

import asyncio

import pytest
from tests.router.raw_engine import chunk, chunked_head, raw_engine, response, streamed

from tandem.router.errors import UpstreamBroken, UpstreamError, UpstreamTimeout
from tandem.router.upstream import wire as wire_module
from tandem.router.upstream.wire import Answer, Wire

PARTS = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]


class Recorder:
    """A `Sink` that keeps what it is told, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.over = asyncio.Event()

    def data(self, chunk: bytes, /) -> None:
        self.calls.append(("data", chunk))

    def end(self) -> None:
        self.calls.append(("end", None))
        self.over.set()

    def fail(self, error: UpstreamError, /) -> None:
        self.calls.append(("fail", error))
        self.over.set()

    def body(self) -> bytes:
        return b"".join(c for kind, c in self.calls if kind == "data" and isinstance(c, bytes))


async def post(wire: Wire, url: str, *, read_s: float = 5.0) -> Answer:
    return await wire.exchange(
        url, name="engine", method="POST", path="/v1/completions", headers={}, body=b"{}", read_s=read_s
    )


async def test_a_piped_stream_reaches_the_sink_in_order_and_its_connection_is_reused(wire: Wire) -> None:
    async with raw_engine(streamed(PARTS)) as engine:
        for _ in range(2):
            answer = await post(wire, engine.url)
            await answer.wait(whole=False)
            assert (answer.status, answer.headers["content-type"]) == (200, "text/event-stream")
            first = answer.take()
            sink = Recorder()
            answer.pipe(sink)
            await sink.over.wait()
            assert first + sink.body() == b"".join(PARTS)
            assert sink.calls[-1] == ("end", None)
            assert wire.idle_connections() == 1
    assert engine.connections == 1


async def test_the_pieces_one_read_carries_reach_the_sink_as_one_call(wire: Wire) -> None:
    async def burst(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head() + chunk(b"data: 0\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"".join(chunk(p) for p in PARTS) + b"0\r\n\r\n")  # three events in one write

    async with raw_engine(burst) as engine:
        answer = await post(wire, engine.url)
        await answer.wait(whole=False)
        assert answer.take() == b"data: 0\n\n"
        sink = Recorder()
        answer.pipe(sink)
        await sink.over.wait()
    assert sink.calls == [("data", b"".join(PARTS)), ("end", None)]


async def test_silence_longer_than_the_read_limit_fails_the_stream(wire: Wire) -> None:
    async def stalls(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head() + chunk(PARTS[0]))
        await asyncio.sleep(5)

    async with raw_engine(stalls) as engine:
        answer = await post(wire, engine.url, read_s=0.2)
        await answer.wait(whole=False)
        assert answer.take() == PARTS[0]
        sink = Recorder()
        answer.pipe(sink)
        await asyncio.wait_for(sink.over.wait(), 5)
    [(kind, error)] = sink.calls
    assert kind == "fail" and isinstance(error, UpstreamTimeout) and error.kind == "timeout"
    assert wire.idle_connections() == 0


async def test_a_paused_answer_is_not_timed_out_and_gets_everything_once_resumed(wire: Wire) -> None:
    sent = asyncio.Event()

    async def stream(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head() + chunk(PARTS[0]))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"".join(chunk(p) for p in PARTS[1:]) + b"0\r\n\r\n")
        await writer.drain()
        sent.set()

    async with raw_engine(stream) as engine:
        answer = await post(wire, engine.url, read_s=0.2)
        await answer.wait(whole=False)
        answer.take()
        sink = Recorder()
        answer.pipe(sink)
        answer.pause()
        await sent.wait()
        await asyncio.sleep(0.5)  # longer than read_s: nothing may fire while paused
        assert sink.calls == []
        answer.resume()
        await asyncio.wait_for(sink.over.wait(), 5)
    assert sink.calls == [("data", b"".join(PARTS[1:])), ("end", None)]


async def test_closing_before_the_end_closes_the_connection_and_tells_the_sink_nothing(wire: Wire) -> None:
    gone = asyncio.Event()

    async def endless(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head())
        try:
            while True:
                writer.write(chunk(PARTS[0]))
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            gone.set()

    async with raw_engine(endless) as engine:
        answer = await post(wire, engine.url)
        await answer.wait(whole=False)
        sink = Recorder()
        answer.pipe(sink)
        answer.close()
        seen = len(sink.calls)
        await asyncio.wait_for(gone.wait(), 5)  # the engine saw its client leave
        assert len(sink.calls) == seen
        assert all(kind == "data" for kind, _ in sink.calls)
    assert wire.idle_connections() == 0


async def test_an_idle_connection_past_the_keepalive_limit_is_not_reused(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def ok(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(200, b"{}"))

    async with raw_engine(ok) as engine:
        answer = await post(wire, engine.url)
        await answer.wait(whole=True)
        monkeypatch.setattr(wire_module, "KEEPALIVE_S", 0.0)
        answer = await post(wire, engine.url)
        await answer.wait(whole=True)
        monkeypatch.setattr(wire_module, "KEEPALIVE_S", 60.0)
        answer = await post(wire, engine.url)
        await answer.wait(whole=True)
    assert (engine.connections, len(engine.requests)) == (2, 3)


async def test_idle_connections_past_the_limit_are_closed_when_another_returns_to_the_pool(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def ok(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(200, b"{}"))  # and keeps the connection open, whatever its age

    async with raw_engine(ok) as engine:
        first, second = await post(wire, engine.url), await post(wire, engine.url)  # two connections
        await first.wait(whole=True)
        await second.wait(whole=True)
        assert wire.idle_connections() == 2
        again = await post(wire, engine.url)  # takes the most recent; the older one stays idle
        monkeypatch.setattr(wire_module, "KEEPALIVE_S", 0.0)
        await again.wait(whole=True)  # its return to the pool closes the older one
        assert wire.idle_connections() == 1
    assert (engine.connections, len(engine.requests)) == (2, 3)


async def test_a_connection_the_engine_closes_while_idle_leaves_the_pool(wire: Wire) -> None:
    async def once(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(response(200, b"{}"))
        await writer.drain()
        writer.close()

    async with raw_engine(once) as engine:
        answer = await post(wire, engine.url)
        await answer.wait(whole=True)
        for _ in range(100):
            if wire.idle_connections() == 0:
                break
            await asyncio.sleep(0.01)
        assert wire.idle_connections() == 0
        answer = await post(wire, engine.url)  # a new connection, not the closed one
        await answer.wait(whole=True)
        assert answer.take() == b"{}"
    assert engine.connections == 2


async def test_a_body_without_length_ends_with_the_connection(wire: Wire) -> None:
    async def until_close(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"a":')
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b" 1}")
        await writer.drain()
        writer.close()

    async with raw_engine(until_close) as engine:
        answer = await post(wire, engine.url)
        await answer.wait(whole=True)
        assert (answer.status, answer.done, answer.take()) == (200, True, b'{"a": 1}')
    assert wire.idle_connections() == 0


async def test_bytes_that_are_not_http_break_the_exchange(wire: Wire) -> None:
    async def garbage(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")

    async with raw_engine(garbage) as engine:
        answer = await post(wire, engine.url)
        with pytest.raises(UpstreamBroken, match="not HTTP"):
            await answer.wait(whole=True)
    assert wire.idle_connections() == 0


async def test_an_ipv6_engine_is_reached_and_named_in_brackets_in_the_host_header(wire: Wire) -> None:
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(response(200, b"{}"))
        await writer.drain()
        writer.close()

    try:
        server = await asyncio.start_server(answer, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = server.sockets[0].getsockname()[1]
    async with server:
        reply = await post(wire, f"http://[::1]:{port}")
        await reply.wait(whole=True)
    assert (reply.status, reply.take()) == (200, b"{}")
    assert f"host: [::1]:{port}\r\n".encode() in seen[0]
