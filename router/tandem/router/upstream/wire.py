"""HTTP/1.1 to the engines, on asyncio protocols: the gateway's upstream wire.

One `Wire` per gateway process keeps the engines' keep-alive connections and makes exchanges on
them. An exchange writes its request in one go (head and body), reads the answer with httptools'
parser (llhttp: status, headers, a body framed by content-length, chunked, or the connection's end)
and hands the body to its reader as it arrives:

- before `Answer.pipe`, arriving body bytes are kept, and `Answer.wait` returns when the head (and
  the first body bytes, or the whole body) is there;
- after `Answer.pipe(sink)`, each read from the socket goes to `sink.data` at once, from the
  protocol's callback (every piece of body the read carried joined into one call), then `sink.end`
  or `sink.fail`. No task wakes up per chunk and no future is made: this is the streamed path, and
  its cost per chunk is the gateway's CPU per token (docs/router-performance.md).

Connections: idle ones are kept per engine (host, port) and taken most recent first. One idle for
`KEEPALIVE_S` or more is closed instead of used, and the oldest such are closed whenever a connection
returns to the pool (engines close theirs after 5 s, and a connection reused just as the engine
closes it breaks before any answer); one the engine closed leaves the pool when the close arrives. An
exchange that ends early (`Answer.close` before the answer's end, an error) closes its connection,
which is how an engine learns that its client went away.

Timeouts: `connect_s` for the TCP connect; `read_s` is the longest silence allowed between two
bytes of the answer, from the request's write to its end. It is one timer per exchange, moved only
when it fires early (to the last byte's time plus `read_s`), not rescheduled for every read; it is
suspended while the reader has paused the connection (`Answer.pause`, the client's backpressure).

Errors are the router's `UpstreamError`s naming the endpoint: `UpstreamConnectError` (refused,
unreachable), `UpstreamConnectTimeout`, `UpstreamTimeout` (silence), `UpstreamBroken` (the
connection closed or sent what is not HTTP before the answer's end).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from tandem.router.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamTimeout,
)

#: Seconds an idle upstream connection is kept (engines close theirs after 5 s).
KEEPALIVE_S = 2.0

Address = tuple[str, int]


class Sink(Protocol):
    """Where a piped answer's body goes, from the connection's callbacks (never raises)."""

    def data(self, chunk: bytes, /) -> None: ...

    def end(self) -> None: ...

    def fail(self, error: UpstreamError, /) -> None: ...


def address(url: str) -> Address:
    """(host, port) of an engine's base URL; ValueError for anything but http://host:port."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// engine address: {url!r}")
    return parts.hostname, parts.port or 80


class Answer:
    """One exchange's answer (module docstring). `status` and `headers` (lower-case names) are set
    once `wait` has returned; `done` once the whole body has arrived."""

    __slots__ = (
        "_closed",
        "_conn",
        "_error",
        "_kept",
        "_loop",
        "_paused",
        "_read_s",
        "_sink",
        "_timer",
        "_waiter",
        "done",
        "headers",
        "last_byte",
        "name",
        "status",
        "until_close",
    )

    def __init__(self, conn: _Connection, *, name: str, read_s: float) -> None:
        self._conn: _Connection | None = conn
        self._loop = conn.loop
        self.name = name
        self._read_s = read_s
        self.status = 0
        self.headers: dict[str, str] = {}
        self.done = False
        self.until_close = False
        self._kept: list[bytes] = []
        self._error: UpstreamError | None = None
        self._sink: Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._paused = False
        self.last_byte = self._loop.time()
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(self.last_byte + read_s, self._silence)

    # -- the reader's side ---------------------------------------------------------------------

    async def wait(self, *, whole: bool) -> None:
        """Until the head is in and either the whole body (`whole`, or any status >= 400) or its
        first bytes or its end; raises `UpstreamError`."""
        while not (self.status and (self.done or (not whole and self.status < 400 and self._kept))):
            if self._error is not None:
                raise self._error
            await self._next()

    def take(self) -> bytes:
        """The body bytes kept so far (and forget them)."""
        kept, self._kept = self._kept, []
        return kept[0] if len(kept) == 1 else b"".join(kept)

    async def read(self) -> bytes:
        """The next body bytes after what was taken, b"" at the end; raises `UpstreamError`. (The
        streamed relay pipes instead; this is for readers that want a loop.)"""
        while not self._kept:
            if self.done:
                return b""
            if self._error is not None:
                raise self._error
            await self._next()
        return self.take()

    async def _next(self) -> None:
        """Until the connection has news for this answer (head, body, end or error)."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def pipe(self, sink: Sink) -> None:
        """Hand the rest of the body to `sink` (module docstring), starting with what is kept."""
        self._sink = sink
        if self._kept:
            sink.data(self.take())
        if self.done:
            sink.end()
        elif self._error is not None:
            sink.fail(self._error)

    def pause(self) -> None:
        """Stop reading from the engine (the reader's own client is slow); the silence timer stops."""
        conn = self._conn
        if conn is not None and not self._paused:
            self._paused = True
            conn.transport.pause_reading()

    def resume(self) -> None:
        conn = self._conn
        if conn is not None and self._paused:
            self._paused = False
            self.last_byte = self._loop.time()
            conn.transport.resume_reading()

    def close(self) -> None:
        """The reader is done: before the answer's end this closes the connection (the engine stops
        the work); no sink call follows. Idempotent."""
        self._closed = True
        self._sink = None
        self._cancel_timer()
        conn, self._conn = self._conn, None
        if conn is not None and not self.done:
            conn.discard()

    # -- the connection's side -----------------------------------------------------------------

    def _notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def head(self, status: int) -> None:
        self.status = status
        self._notify()

    def body(self, chunk: bytes) -> None:
        sink = self._sink
        if sink is not None:
            sink.data(chunk)
            return
        self._kept.append(chunk)
        self._notify()

    def finished(self) -> None:
        self.done = True
        self._cancel_timer()
        self._conn = None
        sink, self._sink = self._sink, None  # the sink holds its reply, which holds this answer
        if sink is not None:
            sink.end()
        else:
            self._notify()

    def failed(self, error: UpstreamError) -> None:
        if self.done or self._closed or self._error is not None:
            return
        self._error = error
        self._cancel_timer()
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.discard()
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.fail(error)
        else:
            self._notify()

    def _silence(self) -> None:
        self._timer = None
        if self._conn is None or self.done:
            return
        loop = self._loop
        if self._paused:
            self._timer = loop.call_at(loop.time() + self._read_s, self._silence)
            return
        due = self.last_byte + self._read_s
        if loop.time() < due:
            self._timer = loop.call_at(due, self._silence)
            return
        self.failed(UpstreamTimeout(f"{self.name}: no answer bytes for {self._read_s:g}s"))

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls its `on_*` methods while it parses."""

    def __init__(self, wire: Wire, key: Address) -> None:
        self.wire = wire
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None
        self.closed = False
        self.idle_since = 0.0
        self._pieces: list[bytes] = []
        self._header_name = b""
        self._complete = False
        self._keep_alive = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        answer = self.answer
        if answer is None:  # bytes while idle: not a well-behaved engine
            self.discard()
            return
        answer.last_byte = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._pieces = []
            answer.failed(UpstreamBroken(f"{answer.name}: connection broke (not HTTP: {exc})"))
            return
        pieces, complete = self._pieces, self._complete
        if pieces:
            self._pieces = []
            answer.body(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        if complete:
            self._complete = False
            self._finish(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.wire.forget(self)
        answer, self.answer = self.answer, None
        if answer is None:
            return
        if answer.until_close and answer.status:
            answer.finished()
            return
        detail = str(exc) if exc is not None else "closed by the engine"
        answer.failed(UpstreamBroken(f"{answer.name}: connection broke ({detail})"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        answer = self.answer
        if answer is not None:
            answer.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        answer = self.answer
        if answer is None:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (e.g. 100 Continue): the real one follows
            answer.headers.clear()
            return
        headers = answer.headers
        answer.until_close = "content-length" not in headers and "chunked" not in headers.get(
            "transfer-encoding", ""
        )
        answer.head(status)

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.answer is not None and self.answer.status:
            self._complete = True
            self._keep_alive = self.parser.should_keep_alive()  # valid only inside this callback

    # the wire's side

    def _finish(self, answer: Answer) -> None:
        keep = self._keep_alive and not self.closed
        self.answer = None
        answer.finished()
        if keep:
            self.wire.release(self)
        else:
            self.discard()

    def discard(self) -> None:
        """Close now; an exchange on it is abandoned (its reader already knows)."""
        self.answer = None
        if not self.closed:
            self.closed = True
            self.wire.forget(self)
            self.transport.abort()


class Wire:
    """The gateway's connections to the engines (module docstring)."""

    def __init__(self, *, connect_s: float) -> None:
        self._connect_s = connect_s
        self._idle: dict[Address, deque[_Connection]] = {}
        self._addresses: dict[str, Address] = {}

    async def exchange(
        self,
        url: str,
        *,
        name: str,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        read_s: float,
    ) -> Answer:
        """Send one request to the engine at `url` (its base URL) and return its `Answer` as soon as
        the request is written; raises `UpstreamError` for connect failures."""
        key = self._addresses.get(url)
        if key is None:
            key = self._addresses[url] = address(url)
        conn = self._idle_connection(key)
        if conn is None:
            conn = await self._connect(key, name=name)
        answer = Answer(conn, name=name, read_s=read_s)
        conn.answer = answer
        host, port = key
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal in brackets
        lines = [f"{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-length: {len(body)}\r\n"]
        lines.extend(f"{k}: {v}\r\n" for k, v in headers.items())
        lines.append("\r\n")
        conn.transport.write("".join(lines).encode("latin-1") + body)
        return answer

    def _idle_connection(self, key: Address) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.discard()
        return None

    async def _connect(self, key: Address, *, name: str) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_s):
                _, conn = await loop.create_connection(lambda: _Connection(self, key), *key)
        except TimeoutError:
            raise UpstreamConnectTimeout(f"{name}: connect timeout") from None
        except OSError as exc:
            raise UpstreamConnectError(f"{name}: cannot connect ({exc})") from None
        return conn

    def release(self, conn: _Connection) -> None:
        """A connection whose answer ended, back to the pool; the oldest idle ones past the keep-alive
        limit are closed on the way (taking the most recent first leaves them at the far end, and an
        engine that never closes idle connections would otherwise keep a burst's worth open)."""
        now = conn.idle_since = conn.loop.time()
        idle = self._idle.setdefault(conn.key, deque())
        while idle and now - idle[0].idle_since >= KEEPALIVE_S:
            idle.popleft().discard()
        idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def idle_connections(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def close(self) -> None:
        """Close every idle connection (at shutdown)."""
        for idle in self._idle.values():
            while idle:
                idle.pop().discard()
