"""Turning an upstream `Attempt` into the client's response.

Buffered answers (non-streaming, or any error status) are returned with the engine's status,
body bytes and content type. Streams are relayed chunk by chunk as they arrive, never parsed or
re-encoded. If the engine fails after bytes went out, the status line is long gone, so the stream
ends with an OpenAI-style SSE error event and the terminator:

    data: {"error": {"message": "...", "type": "BadGatewayError", "param": null, "code": 502}}

    data: [DONE]

(preceded by a blank line when the engine died inside an event, so the error is its own event).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping

import anyio
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.core.openai_api import error_body
from tandem.router.dispatch import Attempt
from tandem.router.errors import UpstreamError

SSE_DONE = b"data: [DONE]\n\n"


def sse_error_event(message: str, *, status: int = 502) -> bytes:
    """One SSE event carrying OpenAI's error object."""
    return b"data: " + json.dumps(error_body(status, message)).encode() + b"\n\n"


async def render(attempt: Attempt, *, headers: Mapping[str, str]) -> Response:
    """The client's response for `attempt`, with extra `headers`; takes ownership of `attempt`."""
    reply = attempt.reply
    if not reply.streaming:
        await attempt.finish()
        return Response(
            reply.head, status_code=reply.status, headers=dict(headers), media_type=reply.content_type
        )
    return RelayResponse(attempt, headers=headers)


class RelayResponse(StreamingResponse):
    """Streams an upstream reply; whatever ends the response (last chunk, engine failure, client
    disconnect, server shutdown), the upstream connection is closed and its slot freed."""

    def __init__(self, attempt: Attempt, *, headers: Mapping[str, str]) -> None:
        self._attempt = attempt
        self._chunks = _relay(attempt)
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
                await self._attempt.finish()


async def _relay(attempt: Attempt) -> AsyncGenerator[bytes, None]:
    reply = attempt.reply
    last = reply.head
    if reply.head:
        yield reply.head
    try:
        async for chunk in reply.rest():
            last = chunk
            yield chunk
    except UpstreamError as exc:
        await attempt.finish(exc)
        separator = b"" if last.endswith((b"\n\n", b"\r\n\r\n")) or not last else b"\n\n"
        message = f"upstream {attempt.endpoint.name} failed mid-stream: {exc.message}"
        yield separator + sse_error_event(message) + SSE_DONE
        return
    await attempt.finish()
