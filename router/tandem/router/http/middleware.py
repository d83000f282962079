"""Per-request context for every HTTP request: the request id, the request metrics and the one
log line per request. A pure ASGI middleware, so it sees streamed responses end (or break).

Request id: the client's `x-request-id` when given, else a new uuid4 hex; it is set in
`tandem.core.logs.REQUEST_ID` for the request's whole life, sent upstream by the gateway, and
added to every response.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.core.logs import REQUEST_ID
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.observe.report import RequestReport
from tandem.router.types import Route

log = logging.getLogger("tandem.router")

#: Route label values; any other path is reported as "other" (bounded label cardinality).
KNOWN_ROUTES = frozenset({*(r.value for r in Route), "/v1/models", "/health", "/metrics", "/openapi.json"})
GENERATION_ROUTES = frozenset(r.value for r in Route)


class RequestContextMiddleware:
    """Wraps the app; `metrics_for(scope)` finds the app's metrics in the lifespan state (None
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
        request_id = Headers(scope=scope).get("x-request-id") or uuid.uuid4().hex
        path = scope["path"]
        report = RequestReport(
            request_id=request_id,
            route=path if path in KNOWN_ROUTES else "other",
            started=self._clock(),
        )
        scope.setdefault("state", {})["report"] = report
        completed = False

        async def send_with_context(message: Message) -> None:
            nonlocal completed
            if message["type"] == "http.response.start":
                report.status = message["status"]
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    headers.append("x-request-id", request_id)
            elif message["type"] == "http.response.body":
                if message.get("body") and report.first_byte is None:
                    report.first_byte = self._clock()
                completed = not message.get("more_body", False)
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self._app(scope, receive, send_with_context)
        finally:
            report.client_disconnected = report.status is not None and not completed
            self._finish(scope, report)
            REQUEST_ID.reset(token)

    def _finish(self, scope: Scope, report: RequestReport) -> None:
        now = self._clock()
        status = report.status if report.status is not None else 500
        report.status = status
        metrics = self._metrics_for(scope)
        if metrics is not None:
            metrics.requests.labels(route=report.route, status=str(status)).inc()
            metrics.request_duration.labels(route=report.route).observe(now - report.started)
            if report.route in GENERATION_ROUTES and report.first_byte is not None:
                metrics.time_to_first_byte.labels(route=report.route).observe(
                    report.first_byte - report.started
                )
        if report.route in GENERATION_ROUTES:
            level = logging.WARNING if status >= 500 else logging.INFO
        else:
            level = logging.DEBUG
        log.log(level, "request", extra=report.fields(now=now))
