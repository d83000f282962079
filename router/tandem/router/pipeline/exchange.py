"""`Exchange`: the HTTP side of one request as the stages see it: its headers, its body (read once,
bounded) and the `send` the answer goes to. Built by the HTTP shell from the ASGI call."""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from tandem.router.request.parse import body_limit_error, disconnected, too_large


class Exchange:
    """Headers (case-insensitive), the body reader and the ASGI `send` of one request."""

    __slots__ = ("_receive", "headers", "on_body_read", "send")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.headers = Headers(scope=scope)
        self._receive = receive
        self.send = send
        #: Called once the body is read (the shell starts watching for the client leaving).
        self.on_body_read: Callable[[], None] | None = None

    async def read_body(self, *, limit: int) -> bytes:
        """The request body; `RequestTooLarge` (413) once it is longer than `limit` bytes (before
        reading it when `content-length` says so), `ClientDisconnected` if the client leaves."""
        early = body_limit_error(self.headers.get("content-length"), limit)
        if early is not None:
            raise early
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise disconnected()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                if self.on_body_read is not None:
                    self.on_body_read()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
