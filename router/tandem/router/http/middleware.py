"""Request ids, metrics and a debug log line for the side routes (`/v1/models`, `/health`,
`/metrics`, `/openapi.json`, unknown paths): a pure ASGI middleware around the side app. Generation
requests are counted by the gateway's own shell (`http.server`) instead.

The client's `x-request-id` is echoed when it is valid (`identity.request_id`), else a new id is used;
it is set in `tandem.core.logs.REQUEST_ID` while the request runs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.core.logs import REQUEST_ID
from tandem.router.identity.request_id import ALLOWED, MAX_LENGTH
from tandem.router.observe.metrics import RouterMetrics

log = logging.getLogger("tandem.router")

#: Route label values; any other path is reported as "other" (bounded label cardinality).
KNOWN_ROUTES = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/openapi.json"}
)


class SideRouteMiddleware:
    """Wraps the side app; `metrics_for(scope)` finds the app's metrics in the lifespan state (None
    before start-up), `clock` gives seconds for durations."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        clock: Callable[[], float],
        metrics_for: Callable[[Scope], RouterMetrics | None],
    ) -> None:
        self._app = app
        self._clock = clock
        self._metrics_for = metrics_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        given = Headers(scope=scope).get("x-request-id")
        valid = given is not None and len(given) <= MAX_LENGTH and ALLOWED.fullmatch(given) is not None
        request_id = given if valid and given is not None else uuid.uuid4().hex
        path = scope["path"]
        route = path if path in KNOWN_ROUTES else "other"
        started = self._clock()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("x-request-id", request_id)
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self._app(scope, receive, send_with_id)
        finally:
            duration = self._clock() - started
            metrics = self._metrics_for(scope)
            if metrics is not None:
                metrics.observe_request(route, status, duration_s=duration, ttfb_s=None)
            log.debug("request", extra={"route": route, "status": status, "duration_s": round(duration, 4)})
            REQUEST_ID.reset(token)
