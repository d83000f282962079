"""A tiny HTTP server for the autoscaler's `/metrics` (Prometheus text) and `/healthz`.

asyncio streams, GET only, one answer per connection: the autoscaler needs nothing more, and running a
web framework's server inside its event loop would take over the process's signal handling.
`/healthz` answers 200 while `healthy()` is true (the control loop ran a round recently), else 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """Serves `registry` at /metrics and `healthy()` at /healthz on host:port."""

    def __init__(
        self, *, host: str, port: int, registry: CollectorRegistry, healthy: Callable[[], bool]
    ) -> None:
        self._host, self._port = host, port
        self._registry = registry
        self._healthy = healthy
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen; raises OSError when the address is taken."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request."""
        path = path.split("?", 1)[0]
        if method != "GET":
            return 405, "text/plain", b"GET only\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            ok = self._healthy()
            return (200, "text/plain", b"ok\n") if ok else (503, "text/plain", b"no recent round\n")
        return 404, "text/plain", b"not found\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=10.0)
            while (await asyncio.wait_for(reader.readline(), timeout=10.0)) not in (b"\r\n", b"\n", b""):
                pass
            method, path, *_ = request.decode("latin-1").split() or ["", ""]
            status, content_type, body = self.answer(method, path)
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ValueError, ConnectionError) as exc:
            log.debug("health request dropped", extra={"error": repr(exc)})
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
