"""A scriptable raw HTTP/1.1 server on 127.0.0.1 for upstream tests: each test says, byte for byte,
what the "engine" answers (or that it answers nothing, or cuts the connection), and sees the bytes
of every request and how many connections were opened."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawEngine:
    url: str
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return head + body


@contextlib.asynccontextmanager
async def raw_engine(answer: Answer) -> AsyncIterator[RawEngine]:
    """Serve `answer(request_bytes, writer)` for every request of every connection."""
    engine = RawEngine(url="")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        engine.connections += 1
        try:
            while (request := await _read_request(reader)) is not None:
                engine.requests.append(request)
                await answer(request, writer)
                if writer.is_closing():
                    return
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine.url = f"http://127.0.0.1:{port}"
    try:
        yield engine
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1)


def response(status: int, body: bytes, *, content_type: bytes = b"application/json") -> bytes:
    return (
        b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status, content_type, len(body))
        + body
    )


def chunked_head(status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" % status


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def streamed(parts: list[bytes], *, pause_s: float = 0.01) -> Answer:
    """An answer that streams `parts` as chunks, one write each, `pause_s` apart, then ends."""

    async def stream(request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(chunked_head())
        for part in parts:
            writer.write(chunk(part))
            await writer.drain()
            await asyncio.sleep(pause_s)
        writer.write(b"0\r\n\r\n")

    return stream
