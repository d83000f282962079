"""Per-request context (the request id and one structured log line per request) and vLLM's API key.

The id is the client's `x-request-id` header when it sends one, else a fresh one; it is set in
`tandem.core.logs.REQUEST_ID` for every log line of the request and echoed in the response's
`x-request-id` header. Handlers add fields to the line through `log_fields(request)`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.core.logs import REQUEST_ID

logger = logging.getLogger("tandem.sim.access")
#: Paths polled by probes and scrapers: logged at debug level only.
QUIET_PATHS = frozenset({"/health", "/metrics"})


def log_fields(request: Request) -> dict[str, Any]:
    """The mutable dict of extra fields for this request's log line."""
    fields: dict[str, Any] = request.scope.setdefault("state", {}).setdefault("log_fields", {})
    return fields


class RequestContextMiddleware:
    """Pure ASGI middleware (it does not buffer streaming bodies)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get("x-request-id") or uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        fields: dict[str, Any] = scope.setdefault("state", {}).setdefault("log_fields", {})
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            level = logging.DEBUG if scope["path"] in QUIET_PATHS else logging.INFO
            logger.log(
                level,
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "wall_ms": round((time.perf_counter() - started) * 1000, 2),
                    **fields,
                },
            )
            REQUEST_ID.reset(token)


class ApiKeyMiddleware:
    """vLLM's `--api-key` (`VLLM_API_KEY`): every request to a path under `/v1` needs
    `Authorization: Bearer <key>`, else 401 `{"error": "Unauthorized"}`, as vLLM answers; `/health`,
    `/metrics`, `/tokenize` and the rest stay open, as in vLLM. Digests are compared in constant time."""

    def __init__(self, app: ASGIApp, *, api_key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(f"Bearer {api_key}".encode()).digest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not path.startswith("/v1"):
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("authorization", "")
        if hmac.compare_digest(hashlib.sha256(given.encode()).digest(), self._digest):
            await self.app(scope, receive, send)
            return
        body = b'{"error":"Unauthorized"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
