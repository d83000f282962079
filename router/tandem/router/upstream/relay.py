"""Turning an upstream `Attempt` into the client's response.

Buffered answers (non-streaming, or any error status) are returned with the engine's status,
body bytes and content type. Streams are relayed chunk by chunk as they arrive, never parsed or
re-encoded. If the engine fails after bytes went out, the status line is long gone, so the stream
ends with an OpenAI-style SSE error event and the terminator:

    data: {"error": {"message": "...", "type": "BadGatewayError", "param": null, "code": 502}}

    data: [DONE]

(preceded by a blank line when the engine died inside an event, so the error is its own event).

A `ResponseMeter` may watch the answer on its way (the fair queue's token charges): it sees every
streamed chunk and returns the bytes to forward (the same bytes, unless it strips the usage event the
router asked for itself), or the buffered body; `close()` runs exactly once when the response is over.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import Protocol

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.core.openai_api import error_body
from tandem.router.errors import UpstreamError
from tandem.router.upstream.dispatch import Attempt

SSE_DONE = b"data: [DONE]\n\n"


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
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"


async def render(
    attempt: Attempt, *, headers: Mapping[str, str], meter: ResponseMeter | None = None
) -> Response:
    """The client's response for `attempt`, with extra `headers`; takes ownership of `attempt` and
    of `meter` (closed when the response is over)."""
    reply = attempt.reply
    if not reply.streaming:
        try:
            await attempt.finish()
            if meter is not None:
                meter.buffered(reply.status, reply.head)
        finally:
            if meter is not None:
                meter.close()
        return Response(
            reply.head, status_code=reply.status, headers=dict(headers), media_type=reply.content_type
        )
    return RelayResponse(attempt, headers=headers, meter=meter)


class RelayResponse(StreamingResponse):
    """Streams an upstream reply; whatever ends the response (last chunk, engine failure, client
    disconnect, server shutdown), the upstream connection is closed and its slot freed."""

    def __init__(
        self, attempt: Attempt, *, headers: Mapping[str, str], meter: ResponseMeter | None = None
    ) -> None:
        self._attempt = attempt
        self._meter = meter
        self._chunks = _relay(attempt, meter)
        super().__init__(
            self._chunks,
            status_code=attempt.reply.status,
            headers=dict(headers),
            media_type=attempt.reply.content_type,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Shielded: this cleanup must also run when the serving task is being cancelled.
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
                try:
                    await self._attempt.finish()
                finally:
                    if self._meter is not None:
                        self._meter.close()


async def _relay(attempt: Attempt, meter: ResponseMeter | None) -> AsyncGenerator[bytes, None]:
    reply = attempt.reply
    last = b""

    def forward(chunk: bytes) -> bytes:
        return chunk if meter is None else meter.stream_chunk(chunk)

    def held() -> bytes:
        return b"" if meter is None else meter.stream_end()

    if out := forward(reply.head):
        last = out
        yield out
    try:
        async for chunk in reply.rest():
            if out := forward(chunk):
                last = out
                yield out
    except UpstreamError as exc:
        await attempt.finish(exc)
        if tail := held():
            last = tail
            yield tail
        separator = b"" if last.endswith((b"\n\n", b"\r\n\r\n")) or not last else b"\n\n"
        message = f"upstream {attempt.endpoint.name} failed mid-stream: {exc.message}"
        yield separator + sse_error_event(message) + SSE_DONE
        return
    if tail := held():
        yield tail
    await attempt.finish()
