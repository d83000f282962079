"""The second half of a pre-empted stream: wait for the tenant's turn, continue the answer on an
engine, relay the rest into the same response (`tandem.router.admission.preemption` says when a
stream is stopped, `tandem.router.upstream.continuation` how it is continued).

Failures after the seam cannot change the status line (it went out with the first half), so they end
the stream as a mid-stream failure does: an SSE error event, then `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson
from starlette.types import Send

from tandem.router.admission.gate import AdmissionGate
from tandem.router.admission.grant import Grant
from tandem.router.errors import RouterError
from tandem.router.pipeline.context import RequestContext
from tandem.router.upstream.client import UpstreamCall
from tandem.router.upstream.continuation import Generated, continuation_body, shift_usage
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.relay import SSE_DONE, ResponseMeter, relay, sse_error_event
from tandem.router.upstream.usage import request_usage

#: Makes the meter of the continuation: (its grant, the output tokens it may still generate).
MeterFactory = Callable[[Grant, int | None], ResponseMeter]


@dataclass(frozen=True, slots=True)
class Resume:
    """Continues pre-empted streams: capacity from `gate.resume`, an engine from `dispatcher`."""

    gate: AdmissionGate
    dispatcher: Dispatcher

    async def __call__(
        self, ctx: RequestContext, send: Send, *, so_far: Generated | None, tokens: int, meter: MeterFactory
    ) -> None:
        """Continue `ctx`'s answer after what the stopped stream carried (`tokens` generated)."""
        if so_far is None:  # `continuable` said plain text; an engine sent something else
            await _end(send, "the answer was interrupted and cannot be continued")
            return
        if so_far.finished:  # it ended as it was stopped: nothing to continue
            await send({"type": "http.response.body", "body": SSE_DONE, "more_body": False})
            ctx.response_end()
            return
        body, _ = request_usage(continuation_body(ctx.route, ctx.body, so_far.text, tokens))
        expected = ctx.expected_output()
        left = max(1, expected - tokens) if expected is not None else None
        try:
            grant = await self.gate.resume(tenant=ctx.tenant, priority=ctx.priority)
            ctx.cleanups.append(grant.release)
            call = UpstreamCall(
                path=ctx.route.value,
                body=orjson.dumps(body),
                # Its own id: the engine may still hold the stopped request's while it aborts it.
                headers={"x-request-id": f"{ctx.upstream_id}-continued", **ctx.trace_headers("decode")},
                stream=True,
            )
            attempt = await self.dispatcher.open("decode", request=ctx, call=call)
        except RouterError as exc:
            ctx.error = exc.message
            await _end(send, f"the answer was interrupted and could not be continued: {exc.public_message}")
            return
        ctx.cleanups.append(attempt.finish)
        ctx.grant, ctx.attempt, ctx.decode_endpoint = grant, attempt, attempt.endpoint.name
        inner = meter(grant, left)
        shifted = _ShiftedUsage(inner, tokens) if not ctx.strip_usage else inner
        await relay(attempt, send=send, headers=(), meter=shifted, progress=ctx, started=True)


async def _end(send: Send, message: str) -> None:
    body = sse_error_event(message) + SSE_DONE
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _ShiftedUsage:
    """The continuation's meter, with the usage the client asked for told as the whole answer's."""

    __slots__ = ("_inner", "_tokens")

    def __init__(self, inner: ResponseMeter, tokens: int) -> None:
        self._inner = inner
        self._tokens = tokens

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        return shift_usage(self._inner.stream_chunk(chunk), self._tokens)

    def stream_end(self) -> bytes:
        return shift_usage(self._inner.stream_end(), self._tokens)

    def buffered(self, status: int, body: bytes, /) -> None:
        self._inner.buffered(status, body)

    def close(self) -> None:
        self._inner.close()
