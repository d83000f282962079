"""Turning an upstream `Attempt` into the client's response, written straight to the ASGI `send`.

Buffered answers (non-streaming, or any error status) are sent with the engine's status, body bytes
and content type. Streams are relayed chunk by chunk as they arrive, never parsed or re-encoded. If
the engine fails after bytes went out, the status line is long gone, so the stream ends with an
OpenAI-style SSE error event and the terminator:

    data: {"error": {"message": "...", "type": "BadGatewayError", "param": null, "code": 502}}

    data: [DONE]

(preceded by a blank line when the engine died inside an event, so the error is its own event).

A `ResponseMeter` may watch the answer on its way (the fair queue's token charges): it sees every
streamed chunk and returns the bytes to forward (the same bytes, unless it strips the usage event the
gateway asked for itself), or the buffered body; `close()` runs exactly once when the response is
over. Whatever ends the response (last chunk, engine failure, the client leaving, which cancels the
task), the attempt is finished (its connection back in the pool or closed, its slot freed) and the
meter closed: both are synchronous, so they also run while the task is being cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import orjson
from starlette.types import Send

from tandem.core.openai_api import error_body
from tandem.router.errors import UpstreamError
from tandem.router.upstream.continuation import Kept, whole_events
from tandem.router.upstream.dispatch import Attempt

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


class Yielding:
    """A stream the admission gate may stop (pre-emption, `tandem.router.admission.preemption`):
    `kept` holds the text it carried (where the continuation starts); `stop` closes the upstream
    answer (the engine aborts it, its slot is free at once), and the relay then returns instead of
    ending the client's stream. `withdraw` is told once if the stream turns out not to be plain
    text (it can then no longer be stopped)."""

    __slots__ = ("_attempt", "kept", "stopped")

    def __init__(self, attempt: Attempt, *, chat: bool, withdraw: Callable[[], None]) -> None:
        self._attempt = attempt
        self.kept = Kept(chat=chat, on_unplain=withdraw)
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        self._attempt.finish()


async def relay(
    attempt: Attempt,
    *,
    send: Send,
    headers: Sequence[Header],
    meter: ResponseMeter,
    progress: Progress,
    yielding: Yielding | None = None,
    started: bool = False,
) -> bool:
    """Send `attempt`'s answer to the client with extra `headers`. Takes ownership of `attempt` and
    `meter` (module docstring). Returns True when `yielding` was stopped: the client's stream is
    still open, for the continuation. `started`: the response is already under way (a
    continuation), so only its body is sent; an engine that answers it with an error ends the stream
    with an SSE error event."""
    reply = attempt.reply
    content_type = (b"content-type", reply.content_type.encode("latin-1"))
    try:
        if started:
            if not reply.streaming:
                attempt.finish()
                meter.buffered(reply.status, reply.head)
                message = f"upstream {attempt.endpoint.name} answered {reply.status} to the continuation"
                body = sse_error_event(message) + SSE_DONE
                await send({"type": "http.response.body", "body": body, "more_body": False})
                progress.response_end()
                return False
            await _stream(attempt, send=send, meter=meter, progress=progress)
            progress.response_end()
            return False
        if not reply.streaming:
            attempt.finish()
            meter.buffered(reply.status, reply.head)
            length = (b"content-length", str(len(reply.head)).encode())
            progress.response_start(reply.status)
            start = [content_type, length, *headers]
            await send({"type": "http.response.start", "status": reply.status, "headers": start})
            progress.response_first_byte()
            await send({"type": "http.response.body", "body": reply.head, "more_body": False})
            progress.response_end()
            return False
        progress.response_start(reply.status)
        start = [content_type, *headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": start})
        if await _stream(attempt, send=send, meter=meter, progress=progress, yielding=yielding):
            return True
        progress.response_end()
        return False
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
) -> bool:
    """Relay the stream to its end (False), or until `yielding` is stopped (True, nothing ended).
    A stream that may be stopped is forwarded in whole events only, so that the client never holds
    half an event when the continuation's events follow."""
    reply = attempt.reply
    read, feed = reply.read, meter.stream_chunk
    keep = yielding.kept.add if yielding is not None else None
    chunk, last, first, held = reply.head, b"", True, b""
    try:
        while chunk:
            if keep is not None:
                chunk, held = whole_events(held + chunk if held else chunk)
                keep(chunk)
            if out := feed(chunk):
                if first:
                    progress.response_first_byte()
                    first = False
                last = out
                await send({"type": "http.response.body", "body": out, "more_body": True})
            chunk = await read()
    except UpstreamError as exc:
        if yielding is not None and yielding.stopped:
            return True
        attempt.finish(exc)
        tail = meter.stream_end()
        last = tail or last
        separator = b"" if last.endswith((b"\n\n", b"\r\n\r\n")) or not last else b"\n\n"
        message = f"upstream {attempt.endpoint.name} failed mid-stream: {exc.message}"
        body = tail + separator + sse_error_event(message) + SSE_DONE
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return False
    if yielding is not None and yielding.stopped:
        return True
    tail = feed(held) + meter.stream_end() if held else meter.stream_end()  # an unfinished last event
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return False
