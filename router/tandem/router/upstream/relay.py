"""Turning an upstream `Attempt` into the client's response, written straight to the ASGI `send`.

Buffered answers (non-streaming, or any error status) are sent with the engine's status, body bytes
and content type. Streams are relayed chunk by chunk as they arrive, never parsed or re-encoded. If
the engine fails after bytes went out, the status line is long gone, so the stream ends with an
OpenAI-style SSE error event and the terminator:

    data: {"error": {"message": "...", "type": "BadGatewayError", "param": null, "code": 502}}

    data: [DONE]

(preceded by a blank line when the engine died inside an event, so the error is its own event).

A stream is moved from the upstream connection's callbacks (`UpstreamReply.pipe`): each read from
the engine is metered and written to the client there and then, with the ASGI `send` run at once
(`_EagerSend`: it completes without waiting unless the client's connection pushes back, and then the
engine's connection is paused until the client has caught up). The request's task waits once for the
stream's end, not once per chunk (docs/router-performance.md has the profile behind this).

A `ResponseMeter` may watch the answer on its way (the fair queue's token charges): it sees every
streamed chunk and returns the bytes to forward (the same bytes, unless it strips the usage event the
gateway asked for itself), or the buffered body; `close()` runs exactly once when the response is
over. Whatever ends the response (last chunk, engine failure, the client leaving, which cancels the
task), the attempt is finished (its connection back in the pool or closed, its slot freed) and the
meter closed: both are synchronous, so they also run while the task is being cancelled.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import orjson
from starlette.types import Message, Send

from tandem.core.openai_api import error_body
from tandem.router.errors import ClientStalled, UpstreamError
from tandem.router.upstream.continuation import Kept, whole_events
from tandem.router.upstream.dispatch import Attempt

log = logging.getLogger(__name__)
#: Seconds a client may take nothing of its stream before the stream ends (`_EagerSend`).
STALLED_WRITE_S = 30.0

SSE_DONE = b"data: [DONE]\n\n"
Header = tuple[bytes, bytes]


class ResponseMeter(Protocol):
    """Watches one answer as it is relayed (see the module docstring); never raises."""

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        """A streamed chunk from the engine; returns the bytes to send to the client now."""
        ...

    def stream_end(self) -> bytes:
        """The stream ended (or broke); returns bytes held back, to send before the end."""
        ...

    def buffered(self, status: int, body: bytes, /) -> None:
        """A buffered answer (non-streaming, or an error status)."""
        ...

    def close(self) -> None:
        """The response is over, whatever happened; called exactly once."""
        ...


def sse_error_event(message: str, *, status: int = 502) -> bytes:
    """One SSE event carrying OpenAI's error object."""
    return b"data: " + orjson.dumps(error_body(status, message)) + b"\n\n"


class Progress(Protocol):
    """Told what the relay sent: the response started (with its status), its first body bytes
    went out, and it is complete."""

    def response_start(self, status: int, /) -> None: ...

    def response_first_byte(self) -> None: ...

    def response_end(self) -> None: ...

    def response_failed(self, message: str, /) -> None:
        """The answer broke after it started (the client got an error event in the stream)."""
        ...


class Yielding:
    """A stream the admission gate may stop (pre-emption, `tandem.router.admission.preemption`):
    `kept` holds the text it carried (where the continuation starts); `stop` closes the upstream
    answer (the engine aborts it, its slot is free at once), and the relay then returns instead of
    ending the client's stream. `withdraw` is told once if the stream turns out not to be plain
    text (it can then no longer be stopped)."""

    __slots__ = ("_attempt", "kept", "on_stop", "stopped")

    def __init__(self, attempt: Attempt, *, chat: bool, withdraw: Callable[[], None]) -> None:
        self._attempt = attempt
        self.kept = Kept(chat=chat, on_unplain=withdraw)
        self.stopped = False
        #: Told when the stream is stopped (the relay, which then returns).
        self.on_stop: Callable[[], None] | None = None

    def stop(self) -> None:
        self.stopped = True
        self._attempt.finish()
        if self.on_stop is not None:
            self.on_stop()


async def relay(
    attempt: Attempt,
    *,
    send: Send,
    headers: Sequence[Header],
    meter: ResponseMeter,
    progress: Progress,
    yielding: Yielding | None = None,
    started: bool = False,
    write_s: float = STALLED_WRITE_S,
    rename: Callable[[bytes], bytes] | None = None,
) -> bool:
    """Send `attempt`'s answer to the client with extra `headers`. Takes ownership of `attempt` and
    `meter` (module docstring). Returns True when `yielding` was stopped: the client's stream is
    still open, for the continuation. `started`: the response is already under way (a
    continuation), so only its body is sent; an engine that answers it with an error ends the stream
    with an SSE error event. `rename`: applied to a buffered answer's body (an alias's `model`,
    `tandem.router.upstream.rename`; a stream's meter renames its chunks)."""
    reply = attempt.reply
    content_type = (b"content-type", reply.content_type.encode("latin-1"))
    try:
        if started:
            if not reply.streaming:
                attempt.finish()
                meter.buffered(reply.status, reply.head)
                message = f"the engine answered {reply.status} to the continuation"
                log.warning(
                    "continuation refused by the engine",
                    extra={"endpoint": attempt.endpoint.name, "status": reply.status},
                )
                body = sse_error_event(message) + SSE_DONE
                await send({"type": "http.response.body", "body": body, "more_body": False})
                progress.response_end()
                return False
            # it marks the end itself
            await _stream(attempt, send=send, meter=meter, progress=progress, write_s=write_s)
            return False
        if not reply.streaming:
            attempt.finish()
            meter.buffered(reply.status, reply.head)
            body = reply.head if rename is None else rename(reply.head)
            length = (b"content-length", str(len(body)).encode())
            progress.response_start(reply.status)
            start = [content_type, length, *headers]
            await send({"type": "http.response.start", "status": reply.status, "headers": start})
            progress.response_first_byte()
            await send({"type": "http.response.body", "body": body, "more_body": False})
            progress.response_end()
            return False
        progress.response_start(reply.status)
        start = [content_type, *headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": start})
        # the stream marks the response complete itself, when its last bytes are sent (`_EagerSend`)
        return await _stream(
            attempt, send=send, meter=meter, progress=progress, yielding=yielding, write_s=write_s
        )
    finally:
        attempt.finish()
        meter.close()


async def _stream(
    attempt: Attempt,
    *,
    send: Send,
    meter: ResponseMeter,
    progress: Progress,
    yielding: Yielding | None = None,
    write_s: float = STALLED_WRITE_S,
) -> bool:
    """Relay the stream to its end (False), or until `yielding` is stopped (True, nothing ended)."""
    pump = _Pump(attempt, send=send, meter=meter, progress=progress, yielding=yielding, write_s=write_s)
    return await pump.run()


class _Pump:
    """Moves one streamed answer to the client (module docstring); the upstream's `Sink`.

    A stream that may be stopped is forwarded in whole events only, so that the client never holds
    half an event when the continuation's events follow. The callbacks run in the request's context
    (its request id in log lines), whichever request opened the connection."""

    __slots__ = (
        "_attempt",
        "_context",
        "_done",
        "_feed",
        "_first",
        "_held",
        "_keep",
        "_last",
        "_meter",
        "_progress",
        "_send",
        "_yielding",
    )

    def __init__(
        self,
        attempt: Attempt,
        *,
        send: Send,
        meter: ResponseMeter,
        progress: Progress,
        yielding: Yielding | None,
        write_s: float,
    ) -> None:
        loop = asyncio.get_running_loop()
        reply = attempt.reply
        self._attempt = attempt
        self._meter = meter
        self._feed = meter.stream_chunk
        self._progress = progress
        self._yielding = yielding
        self._keep = yielding.kept.add if yielding is not None else None
        self._first = True
        self._held = b""
        self._last = b""
        self._done: asyncio.Future[bool] = loop.create_future()
        self._send = _EagerSend(
            send, pause=reply.pause, resume=reply.resume, failed=self._failed, stall_s=write_s
        )
        self._context = contextvars.copy_context()

    async def run(self) -> bool:
        reply = self._attempt.reply
        if self._yielding is not None:
            self._yielding.on_stop = self._stopped
        try:
            if reply.head:
                self._data(reply.head)
            if not self._done.done():
                reply.pipe(self)
            stopped = await self._done
            await self._send.drained()
            return stopped
        finally:
            self._send.abandon()
            if self._yielding is not None:
                self._yielding.on_stop = None

    # the upstream's Sink (called from the connection's callbacks)

    def data(self, chunk: bytes, /) -> None:
        self._context.run(self._data, chunk)

    def end(self) -> None:
        self._context.run(self._end)

    def fail(self, error: UpstreamError, /) -> None:
        self._context.run(self._fail, error)

    def _data(self, chunk: bytes) -> None:
        if self._done.done():
            return
        try:
            if self._keep is not None:
                held = self._held
                chunk, self._held = whole_events(held + chunk if held else chunk)
                self._keep(chunk)
            out = self._feed(chunk)
            if out:
                if self._first:
                    self._progress.response_first_byte()
                    self._first = False
                self._last = out
                self._send.post({"type": "http.response.body", "body": out, "more_body": True})
        except Exception as exc:  # noqa: BLE001 (a bug: the request's task raises it, not the connection)
            self._failed(exc)

    def _end(self) -> None:
        if self._done.done():
            return

        def tail() -> bytes:
            held, meter = self._held, self._meter  # held: an unfinished last event
            return self._feed(held) + meter.stream_end() if held else meter.stream_end()

        self._close(tail)

    def _fail(self, error: UpstreamError) -> None:
        if self._done.done():
            return
        if self._yielding is not None and self._yielding.stopped:
            self._done.set_result(True)
            return

        def tail() -> bytes:
            attempt = self._attempt
            attempt.finish(error)
            tail = self._meter.stream_end()
            last = tail or self._last
            separator = b"" if last.endswith((b"\n\n", b"\r\n\r\n")) or not last else b"\n\n"
            message = "the engine failed mid-stream"
            self._progress.response_failed(f"{message}: {error.message}")
            log.warning(
                "upstream failed mid-stream",
                extra={"endpoint": attempt.endpoint.name, "error": error.message},
            )
            return tail + separator + sse_error_event(message) + SSE_DONE

        self._close(tail)

    def _close(self, last: Callable[[], bytes]) -> None:
        """Send the body's last bytes (`last()`) and end the relay; the response is complete once they
        are handed to the server (`_EagerSend.when_sent`)."""
        try:
            self._send.post({"type": "http.response.body", "body": last(), "more_body": False})
            self._send.when_sent(self._progress.response_end)
        except Exception as exc:  # noqa: BLE001 (as in _data)
            self._failed(exc)
            return
        self._done.set_result(False)

    def _stopped(self) -> None:
        if not self._done.done():
            self._done.set_result(True)

    def _failed(self, exc: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(exc)


class _EagerSend:
    """The ASGI `send`, run at once from a callback. A server's `send` for body bytes writes to its
    transport and returns without waiting unless the client's connection is applying backpressure
    (uvicorn: its write buffer is over the high-water mark); then the coroutine is finished on the
    event loop once the server is ready, the engine's connection is paused meanwhile (`pause`,
    `resume`), and later messages wait their turn in order. `failed` is told if `send` raises, or
    with `ClientStalled` when the client has taken nothing for `stall_s` seconds (it stopped reading:
    its stream ends, and with it the upstream request and the request's hold on capacity)."""

    __slots__ = (
        "_blocked",
        "_failed",
        "_idle",
        "_on_sent",
        "_pause",
        "_queue",
        "_resume",
        "_send",
        "_stall",
        "_stall_s",
    )

    def __init__(
        self,
        send: Send,
        *,
        pause: Callable[[], None],
        resume: Callable[[], None],
        failed: Callable[[BaseException], None],
        stall_s: float = STALLED_WRITE_S,
    ) -> None:
        self._send = send
        self._pause = pause
        self._resume = resume
        self._failed = failed
        self._stall_s = stall_s
        self._stall: asyncio.TimerHandle | None = None
        self._blocked: Generator[Any, Any, None] | None = None
        self._queue: deque[Message] = deque()
        self._idle: asyncio.Future[None] | None = None
        self._on_sent: Callable[[], None] | None = None

    def post(self, message: Message) -> None:
        if self._blocked is not None:
            self._queue.append(message)
            return
        self._step(self._send(message).__await__())

    def _step(self, coro: Generator[Any, Any, None]) -> None:
        try:
            waiter = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 (the request's task raises it)
            self._failed(exc)
            return
        self._blocked = coro
        self._pause()
        if self._stall is None:
            self._stall = asyncio.get_running_loop().call_later(self._stall_s, self._stalled)
        if isinstance(waiter, asyncio.Future):
            waiter.add_done_callback(self._wake)
        else:  # a bare yield (asyncio.sleep(0)): go on at the next turn of the loop
            asyncio.get_running_loop().call_soon(self._wake, None)

    def _wake(self, _: object) -> None:
        coro, self._blocked = self._blocked, None
        if coro is None:  # abandoned meanwhile
            return
        self._step(coro)
        while self._blocked is None and self._queue:
            self._step(self._send(self._queue.popleft()).__await__())
        if self._blocked is None:
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None
            self._resume()
            on_sent, self._on_sent = self._on_sent, None
            if on_sent is not None:
                on_sent()
            idle = self._idle
            if idle is not None and not idle.done():
                idle.set_result(None)

    def _stalled(self) -> None:
        self._stall = None
        if self._blocked is not None:
            self._failed(ClientStalled(f"the client took nothing for {self._stall_s:g}s: its stream ended"))

    def when_sent(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every message posted so far has been sent: now, or when the client
        takes the rest. The relay marks the response complete this way the moment its last bytes
        are handed to the server, not when the request's task next runs: a client that reads the
        end and closes at once has not disconnected early."""
        if self._blocked is None:
            callback()
        else:
            self._on_sent = callback

    async def drained(self) -> None:
        """Until every posted message has been sent."""
        if self._blocked is not None:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def abandon(self) -> None:
        """The request is over (or cancelled): what was not sent is dropped, and the callbacks
        (bound to the relay, which holds this) are let go."""
        coro, self._blocked = self._blocked, None
        self._queue.clear()
        self._on_sent = None
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._pause = self._resume = _nothing
        self._failed = _ignore
        if coro is not None:
            coro.close()


def _nothing() -> None:
    pass


def _ignore(_: BaseException) -> None:
    pass
