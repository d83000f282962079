"""The gateway's HTTP connections: a deadline on each request's head, and a cap on how many one
process serves.

uvicorn bounds the idle time between keep-alive requests (`timeout_keep_alive`, 5 s) and nothing
else before a request reaches the app: a client that connects and sends nothing, or sends one header
byte every few seconds (slowloris), or one byte after each response, holds its connection for ever.
And it accepts every connection. Its `limit_concurrency` is not a connection cap: it answers 503 at
each request's head while the process's connections *or* running tasks number `limit_concurrency`
or more, so at the limit every established client's next request is refused too, while each new
connection is still accepted, parsed and held as long as its client likes.

`guarded_protocol` makes uvicorn's httptools protocol (what its `http="auto"` picks, since
`uvicorn[standard]` installs httptools; pinned here, so h11 is never used) with both limits:

- **Header deadline.** From the moment a connection is accepted, and again from the first byte that
  arrives after a response ended (uvicorn's keep-alive timer stops at that byte) or the first byte of
  a pipelined request, the request line and headers must be complete within `header_seconds` (the
  body has its own deadline in the app, `AccessSettings.body_seconds`). A connection has at most one
  timer (`loop.call_at`): complete headers do not cancel it, it finds nothing due and stops, or waits
  on for a head begun since, so a busy keep-alive connection makes one every `header_seconds`
  rather than one per request (a timer made and cancelled costs 2.5 µs with uvloop). On expiry the
  client is answered 408 with `Connection: close` and the connection is closed, or, when a response
  is still being sent on it, it is closed once that response is over.
- **Cap.** A connection accepted while `cap` are served is answered 503 (`Retry-After: 1`,
  `Connection: close`) at once, without reading its request, and closed: it gets no task and its
  bytes are never parsed. The connections served are those of this process (with `--workers`, each
  worker has its own cap).

Both answers close the connection the way HTTP servers do (`_Closing`): the answer is written, the
sending side shut, and what the client still sends is read and dropped until it closes its side, or
for `LINGER_S` at most. Closing a socket with unread bytes in it makes the kernel send a reset, and
the client could lose the answer before reading it. At most `cap` refused connections linger at once
(more are closed at once), so a process holds at most 2 × `cap` client sockets.

The counts go to a `ConnectionTally`, which the gateway's /metrics reads.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from typing import ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tandem.core.openai_api import error_body
from tandem.router.observe.metrics import ConnectionTally

#: Seconds a connection ended with a last answer stays open for its client to read the answer.
LINGER_S = 2.0
#: File descriptors beyond the client connections' (listening socket, logs, engine scrapes, Redis).
FD_SPARE = 256


def answer(status: int, phrase: str, message: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 response that ends the connection: an OpenAI-shaped JSON error, `headers`
    (uvicorn's `server` and `date`, `retry-after`, ...) and `connection: close`."""
    body = orjson.dumps(error_body(status, message))
    lines = [f"HTTP/1.1 {status} {phrase}\r\n".encode()]
    for name, value in [
        *headers,
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]:
        lines += [name, b": ", value, b"\r\n"]
    return b"".join([*lines, b"\r\n", body])


class _Closing(asyncio.Protocol):
    """Takes over a connection to end it with a last answer (module docstring): writes it, shuts the
    sending side, drops what the client still sends, and closes when the client closes its side or
    after `linger_s` (abort: a client that does not read is not waited for). `closed` runs once the
    connection is gone."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        answer: bytes,
        loop: asyncio.AbstractEventLoop,
        linger_s: float,
        closed: Callable[[], None],
    ) -> None:
        self._closed = closed
        transport.set_protocol(self)
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = loop.call_later(linger_s, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass  # the rest of a request nobody will serve

    def eof_received(self) -> bool:
        return False  # the client is done too: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        self._closed()


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and the cap (module docstring); made per
    server by `guarded_protocol`, which sets the class attributes."""

    tally: ClassVar[ConnectionTally]
    header_seconds: ClassVar[float]
    linger_s: ClassVar[float]

    _head_due: float | None = None  # loop time by which the head begun must be complete
    _head_timer: asyncio.TimerHandle | None = None
    _counted = False  # this connection is one of `tally.open`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        tally = self.tally
        if tally.open >= tally.cap:
            self._refuse(transport)
            return
        tally.open += 1
        self._counted = True
        super().connection_made(transport)
        self._head_begun()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        # The first byte after a response: a new head (or the rest of an answered request's body)
        # begins, and uvicorn's keep-alive timer stops. Mid-request bytes pass with two looks.
        if self._head_due is None and cycle is not None and cycle.response_complete:
            self._head_begun()
        super().data_received(data)

    def on_message_begin(self) -> None:
        if self._head_due is None:  # a pipelined request, while the one before it is being answered
            self._head_begun()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_due = None  # the timer, if it runs, finds nothing due and stops
        super().on_headers_complete()

    def _unsupported_upgrade_warning(self) -> None:
        # The gateway serves no WebSocket (ws="none": an upgraded connection would leave the count);
        # uvicorn's two warnings per such request, one telling to install a library, are noise.
        self.logger.debug("upgrade request served as plain HTTP")

    def _head_begun(self) -> None:
        """A head's deadline starts (module docstring: one timer at a time)."""
        self._head_due = due = self.loop.time() + self.header_seconds
        if self._head_timer is None:
            self._head_timer = self.loop.call_at(due, self._head_check)

    def _head_check(self) -> None:
        self._head_timer = None
        due = self._head_due
        if due is None:
            return  # no head pending: the next one starts a timer
        if due > self.loop.time():
            self._head_timer = self.loop.call_at(due, self._head_check)
            return
        self._head_due = None
        if not self.transport.is_closing():
            self._head_expired()

    def _head_expired(self) -> None:
        self.tally.refused["header_deadline"] += 1
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # its response ends the connection
            return
        # Ours from here: uvicorn forgets it (its shutdown would wait for it) and its timers stop.
        self.connections.discard(self)
        self._unset_keepalive_if_required()
        message = f"request line and headers not received within {self.header_seconds:g} s"
        _Closing(
            self.transport,
            answer=answer(408, "Request Timeout", message, self.server_state.default_headers),
            loop=self.loop,
            linger_s=self.linger_s,
            closed=self._release,
        )

    def _refuse(self, transport: asyncio.Transport) -> None:
        tally = self.tally
        tally.refused["cap"] += 1
        message = f"the gateway is serving its most connections ({tally.cap}); retry"
        headers = [*self.server_state.default_headers, (b"retry-after", b"1")]
        refusal = answer(503, "Service Unavailable", message, headers)
        if tally.lingering >= tally.cap:  # a flood: no more sockets held for it
            transport.write(refusal)
            transport.close()
            return
        tally.lingering += 1

        def closed() -> None:
            tally.lingering -= 1

        _Closing(transport, answer=refusal, loop=self.loop, linger_s=self.linger_s, closed=closed)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self.tally.open -= 1


def guarded_protocol(
    tally: ConnectionTally, *, header_seconds: float, linger_s: float = LINGER_S
) -> type[GuardedHttpTools]:
    """The protocol class to give `uvicorn.Config(http=...)` for one server: its connections are
    counted in `tally` and capped at `tally.cap`, and each request head has `header_seconds`."""
    counts, head_s, linger = tally, header_seconds, linger_s

    class GatewayHttpProtocol(GuardedHttpTools):
        tally = counts
        header_seconds = head_s
        linger_s = linger

    return GatewayHttpProtocol


def open_files_for(cap: int) -> str | None:
    """Raise this process's soft limit on open files, up to its hard limit, to what `cap` needs: a
    socket per served connection and one to its engine while it streams, a lingering refusal per
    served connection at most, and `FD_SPARE`. Returns a warning when even the hard limit is lower
    (then accepting fails before the cap is reached: clients wait in the listen queue), else None."""
    need = 3 * cap + FD_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < need:
        return (
            f"open files are limited to {target}: --max-connections {cap} needs about {need}; "
            "raise the limit (ulimit -n) or lower --max-connections"
        )
    return None
