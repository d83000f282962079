"""The gateway's ASGI shell: generation requests go through the pipeline; everything else (models,
health, metrics, the OpenAPI document, unknown paths) goes to the side app (`http.side`).

For `POST /v1/completions` and `POST /v1/chat/completions` the shell
1. makes the request's `RequestContext` and `Exchange` and runs the `Pipeline` built at start-up
   (found in the lifespan state, `scope["state"]["gateway"]`);
2. once the body has been read, watches for the client leaving: a disconnect before the response is
   over cancels the request's task, which closes its upstream connections (engines abort the work,
   as vLLM does on disconnect) and records status 499;
3. answers a `RouterError` in OpenAI's JSON shape with its status and headers (`Retry-After`, ...),
   and anything unexpected with a 500 and a logged traceback;
4. runs the request's cleanups (free its decode capacity, close its attempt), counts it in
   `tandem_router_requests_total` and friends, and logs one structured line.

It is plain ASGI, not a framework's router, because this path runs for every token-streaming request
and each layer costs (docs/router-performance.md). Other paths are framework code (FastAPI) where
convenience wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.core.logs import REQUEST_ID
from tandem.core.modeltokens import PromptEncoder
from tandem.core.openai_api import error_body
from tandem.router.errors import ClientDisconnected, RouterError
from tandem.router.http.tracing import GatewayTracer
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pipeline.context import RequestContext
from tandem.router.pipeline.exchange import Exchange
from tandem.router.pipeline.stages import ROUTES, Pipeline

log = logging.getLogger("tandem.router")


@dataclass(frozen=True, slots=True)
class Gateway:
    """What the shell needs per request, built once at start-up by the composition root."""

    pipeline: Pipeline
    #: The prompt encoder of a gateway of one service; None in front of many (`Route` sets each
    #: request's).
    encoder: PromptEncoder | None
    metrics: RouterMetrics
    clock: Callable[[], float]
    #: Traces (`tandem.router.observe.tracing`); None: tracing is off, nothing is traced.
    tracer: GatewayTracer | None = None


class GatewayApp:
    """The ASGI app (module docstring); `side` serves every other route and runs the lifespan."""

    def __init__(self, side: ASGIApp) -> None:
        self.side = side

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ROUTES:
            await self.side(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _method_not_allowed(send)
            return
        gateway = scope.get("state", {}).get("gateway")
        if not isinstance(gateway, Gateway):
            raise RuntimeError("the router's lifespan has not run (serve the app with lifespan on)")
        await _serve(gateway, scope, receive, send)


async def _serve(gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    path = scope["path"]
    provisional = uuid.uuid4().hex
    ctx = RequestContext(
        request_id=provisional,
        upstream_id=provisional,
        path=path,
        started=gateway.clock(),
        clock=gateway.clock,
        encoder=gateway.encoder,
        route=ROUTES[path],
    )
    exchange = Exchange(scope, receive, send)
    if gateway.tracer is not None:
        ctx.trace = gateway.tracer.start(exchange.headers)
    watch = _Watch(receive, ctx)
    exchange.on_body_read = watch.start
    token = REQUEST_ID.set(provisional)
    try:
        await gateway.pipeline.run(ctx, exchange)
    except asyncio.CancelledError:
        if not watch.cancelled_request():
            raise
        ctx.client_disconnected = True
        ctx.error = "client disconnected"
    except RouterError as exc:
        await _answer_error(ctx, send, exc)
    except Exception as exc:  # top-level boundary: a bug still answers in OpenAI's shape
        log.error("unexpected error", exc_info=exc)
        await _answer_error(ctx, send, None, unexpected=type(exc).__name__)
    finally:
        watch.stop()
        _run_cleanups(ctx)
        _finish(gateway, ctx)
        REQUEST_ID.reset(token)


class _Watch:
    """After the body is read, the next message is the client's disconnect (module docstring)."""

    __slots__ = ("_ctx", "_receive", "_target", "_task", "fired")

    def __init__(self, receive: Receive, ctx: RequestContext) -> None:
        self._receive = receive
        self._ctx = ctx
        self._task: asyncio.Task[None] | None = None
        self._target: asyncio.Task[object] | None = None
        self.fired = False

    def start(self) -> None:
        self._target = asyncio.current_task()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self._ctx.response_complete and self._target is not None and not self._target.done():
            self.fired = True
            self._target.cancel()

    def cancelled_request(self) -> bool:
        """Whether this watch cancelled the request (then the cancellation is taken back)."""
        if not self.fired or self._target is None:
            return False
        self._target.uncancel()
        return self._target.cancelling() == 0

    def stop(self) -> None:
        # The references go first: a cancelled task keeps its CancelledError, whose traceback holds
        # `_run`'s frame and so this watch; kept, they would make each request's objects a reference
        # cycle that only the cyclic garbage collector frees (docs/soak.md).
        task, self._task, self._target = self._task, None, None
        if task is not None and not task.done():
            task.cancel()


async def _answer_error(
    ctx: RequestContext, send: Send, exc: RouterError | None, *, unexpected: str | None = None
) -> None:
    if exc is None:
        status, message, headers = 500, "internal router error", {}
        body = error_body(500, message)
        ctx.error = f"internal error: {unexpected}"
    else:
        if isinstance(exc, ClientDisconnected):
            ctx.client_disconnected = True
        status, headers = exc.status, exc.response_headers()
        body = error_body(exc.status, exc.public_message, param=exc.param)
        if exc.openai_type is not None:
            body["error"]["type"] = exc.openai_type
        if exc.openai_code is not None:
            body["error"]["code"] = exc.openai_code
        ctx.error = exc.message
    if ctx.response_started:
        return  # the response is under way (or gone): nothing more can be said
    ctx.response_start(status)
    payload = orjson.dumps(body)
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"x-request-id", ctx.request_id.encode()),
        *((k.encode(), v.encode()) for k, v in headers.items()),
    ]
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
    ctx.response_end()


async def _method_not_allowed(send: Send) -> None:
    payload = orjson.dumps(error_body(405, "Method Not Allowed"))
    headers = [
        (b"content-type", b"application/json"),
        (b"allow", b"POST"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 405, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _run_cleanups(ctx: RequestContext) -> None:
    while ctx.cleanups:
        cleanup = ctx.cleanups.pop()
        try:
            cleanup()
        except Exception:  # one failing cleanup must not keep the others from freeing capacity
            log.exception("request cleanup failed")


def _finish(gateway: Gateway, ctx: RequestContext) -> None:
    now = gateway.clock()
    if ctx.response_started and ctx.status is not None:
        status = ctx.status  # a client that left mid-stream is in the log line, not the status
    elif ctx.client_disconnected:
        status = 499
    else:
        status = 500
    ctx.status = status
    # A gateway of many services counts a routed request in its service's metrics (`model` label).
    metrics = gateway.metrics if ctx.service is None else ctx.service.metrics
    metrics.observe_request(ctx.path, status, duration_s=now - ctx.started, ttfb_s=_ttfb(ctx))
    level = logging.WARNING if status >= 500 else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "request", extra=ctx.log_fields(now=now))
    if gateway.tracer is not None:
        gateway.tracer.finish(ctx, now=now)


def _ttfb(ctx: RequestContext) -> float | None:
    return None if ctx.first_byte_at is None else ctx.first_byte_at - ctx.started
