"""The diagnostics port: the gateway's `/metrics` off the client port, behind a token.

`/metrics` says where requests ran: per-endpoint in-flight counts, P/D decisions by reason, prefill
durations, KV-barrier outcomes. On a port every client reaches, a tenant could read from it whether
its probe prompt was cached by another tenant (docs/security.md, "Tenant cache isolation"). With
`--metrics-port P` (the operator sets 9090) the gateway serves the same app on a second socket, and
this guard, wrapped around the whole app, splits the two:

| request arrives on | path | answer |
| --- | --- | --- |
| the client port | `/metrics` | 404 in OpenAI's error shape, as an unknown path |
| the client port | anything else | the gateway, as before |
| the diagnostics port | `/metrics`, with `Authorization: Bearer <token>` | the metrics |
| the diagnostics port | `/metrics`, without the token or with a wrong one | 401 |
| the diagnostics port | anything else (the `/v1` routes included) | 404 |

The token is `TANDEM_METRICS_TOKEN` (a Secret in a cluster); without one the diagnostics port is open
to whoever reaches it, which the NetworkPolicy limits to the metrics namespaces. Tokens are compared
in constant time. The port is told apart by the listening socket's own port (`scope["server"]`).
"""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.core.openai_api import error_body

METRICS_PATH = "/metrics"


class DiagnosticsGuard:
    """The ASGI wrapper of the module docstring's table."""

    def __init__(self, app: ASGIApp, *, port: int, token: str | None) -> None:
        self.app = app
        self.port = port
        self._token = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        server = scope.get("server")
        on_diagnostics = server is not None and len(server) > 1 and server[1] == self.port
        path = scope["path"]
        if not on_diagnostics:
            if path == METRICS_PATH:
                await _answer(send, 404, f"Not Found: {path} is served on the diagnostics port only")
                return
            await self.app(scope, receive, send)
            return
        if path != METRICS_PATH:
            await _answer(send, 404, f"Not Found: the diagnostics port serves {METRICS_PATH} only")
            return
        if self._token is not None and not hmac.compare_digest(_authorization(scope), self._token):
            headers = [(b"www-authenticate", b'Bearer realm="tandem-metrics"')]
            message = "the diagnostics port needs its token (Authorization: Bearer ...)"
            await _answer(send, 401, message, headers)
            return
        await self.app(scope, receive, send)


def _authorization(scope: Scope) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return bytes(value)
    return b""


async def _answer(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps(error_body(status, message))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
