"""The gateway's tracer: starts each request's `RequestTrace` and builds its spans when it is over
(the spans and their attributes: `tandem.router.observe.tracing`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tandem.core.tracing import (
    TRACEPARENT,
    TRACESTATE,
    TracingSpec,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    sampled,
    span_processor,
)
from tandem.router.config import EffectiveConfig
from tandem.router.observe.tracing import RequestTrace
from tandem.router.pipeline.context import RequestContext
from tandem.router.types import Route

#: The operation names of the GenAI conventions, by route.
OPERATIONS = {Route.CHAT: "chat", Route.COMPLETIONS: "text_completion"}


class GatewayTracer:
    """Starts each request's trace, and exports its spans once it is over (module docstring)."""

    def __init__(
        self,
        settings: TracingSpec,
        *,
        service: str,
        clock: Callable[[], float] = time.monotonic,
        processor: Any = None,
        log_prompts: bool = False,
    ) -> None:
        from opentelemetry.sdk.resources import Resource

        self.ratio = settings.sampling_ratio
        self.clock = clock
        self.log_prompts = log_prompts
        self._processor = processor if processor is not None else span_processor(settings, service=service)
        self._resource = Resource.create({"service.name": service})
        # Clock seconds → epoch nanoseconds: the offset now (the clock is monotonic; drift is negligible
        # over a request).
        self._offset_ns = time.time_ns() - int(clock() * 1e9)

    def start(self, headers: Mapping[str, str]) -> RequestTrace:
        """The trace of a request with these headers: the client's parent and decision when it sent a
        valid `traceparent`, else a new trace sampled at the configured ratio."""
        parent = parse_traceparent(headers.get(TRACEPARENT))
        if parent is None:
            trace_id = new_trace_id()
            decision = sampled(trace_id, parent=None, ratio=self.ratio)
            parent_id, state = None, None
        else:
            trace_id, parent_id, flag = parent
            decision = sampled(trace_id, parent=flag, ratio=self.ratio)
            state = headers.get(TRACESTATE)
        return RequestTrace(trace_id, new_span_id(), parent_id, decision, state, new_span_id(), new_span_id())

    def finish(self, ctx: RequestContext, *, now: float) -> None:
        """Build and hand over the spans of `ctx` (nothing for an unsampled or untraced request)."""
        trace = ctx.trace
        if trace is None or not trace.sampled:
            return
        for span in self.spans(ctx, now=now):
            self._processor.on_end(span)

    def spans(self, ctx: RequestContext, *, now: float) -> list[Any]:
        """The request's spans (module docstring's table), server span first."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        trace = ctx.trace
        assert trace is not None
        flags = TraceFlags(TraceFlags.SAMPLED)
        scope = InstrumentationScope("tandem.router")

        def context(span_id: int) -> SpanContext:
            return SpanContext(trace.trace_id, span_id, is_remote=False, trace_flags=flags)

        server = context(trace.span_id)
        parent = (
            SpanContext(trace.trace_id, trace.parent_id, is_remote=True, trace_flags=flags)
            if trace.parent_id is not None
            else None
        )
        failed = _failure(ctx)
        status = Status(StatusCode.ERROR, failed) if failed is not None else Status(StatusCode.UNSET)
        operation = OPERATIONS.get(ctx.route, "text_completion")
        out = [
            ReadableSpan(
                name=f"{operation} {ctx.model}".rstrip(),
                context=server,
                parent=parent,
                resource=self._resource,
                attributes=self._server_attributes(ctx, operation),
                kind=SpanKind.SERVER,
                status=status,
                start_time=self._ns(ctx.started),
                end_time=self._ns(now),
                instrumentation_scope=scope,
            )
        ]
        for stage in _stage_spans(ctx, trace):
            out.append(
                ReadableSpan(
                    name=stage.name,
                    context=context(stage.span_id),
                    parent=server,
                    resource=self._resource,
                    attributes=stage.attrs,
                    kind=SpanKind[stage.kind],
                    status=Status(StatusCode.UNSET),
                    start_time=self._ns(stage.start),
                    end_time=self._ns(max(stage.start, stage.end)),
                    instrumentation_scope=scope,
                )
            )
        return out

    def _server_attributes(self, ctx: RequestContext, operation: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "tandem",
            "gen_ai.request.model": ctx.model,
            "gen_ai.request.stream": ctx.stream,
            "http.response.status_code": ctx.status or 0,
            "tandem.request_id": ctx.request_id,
            "tandem.tenant": ctx.tenant,
            "tandem.priority": ctx.priority,
            "tandem.pd": "disaggregated" if ctx.kv_loaded else "decode_only",
        }
        optional: dict[str, Any] = {
            "gen_ai.usage.input_tokens": ctx.prompt_length() if ctx.has_prompt_tokens() else None,
            "gen_ai.usage.output_tokens": ctx.grant.completion_tokens if ctx.grant is not None else None,
            "gen_ai.response.time_to_first_chunk": (
                None if ctx.first_byte_at is None else ctx.first_byte_at - ctx.started
            ),
            "tandem.queue_s": ctx.queue_s,
            "tandem.held_s": ctx.held_s,
            "tandem.pd_fallback": ctx.pd_fallback,
            "tandem.prefill_endpoint": ctx.prefill_endpoint,
            "tandem.decode_endpoint": ctx.decode_endpoint,
            "tandem.kv_barrier": _barrier_outcome(ctx)
            if ctx.trace and ctx.trace.barrier_s is not None
            else None,
            "tandem.continued": ctx.continued or None,
            "tandem.decode_rechosen": ctx.decode_rechosen or None,
            "tandem.retries": ctx.retries or None,
            "tandem.adapter": ctx.adapter,
            "tandem.client_disconnected": ctx.client_disconnected or None,
            "tandem.prompt": ctx.prompt_text if self.log_prompts else None,
            "tandem.output": ctx.output_text if self.log_prompts else None,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        return attrs

    def _ns(self, seconds: float) -> int:
        return self._offset_ns + int(seconds * 1e9)

    def shutdown(self) -> None:
        """Export what is queued, then stop the processor's thread."""
        self._processor.shutdown()


def gateway_tracer(config: EffectiveConfig, *, clock: Callable[[], float]) -> GatewayTracer | None:
    """The tracer of a service's own gateway (spans of service `<service>-router`); None when off."""
    if config.tracing is None:
        return None
    return GatewayTracer(
        config.tracing, service=f"{config.service}-router", clock=clock, log_prompts=config.log_prompts
    )


@dataclass(frozen=True, slots=True)
class _StageSpan:
    """One child of the server span: a stage of the request, from `start` to `end` (clock seconds; an
    end before the start is clamped to it when the span is built), `kind` a `SpanKind` member's name."""

    name: str
    span_id: int
    start: float
    end: float
    kind: Literal["INTERNAL", "CLIENT"]
    attrs: dict[str, Any]


def _stage_spans(ctx: RequestContext, trace: RequestTrace) -> list[_StageSpan]:
    """The server span's children (module docstring's table), in this order: the cold-start hold, the
    admission, the prefill and the KV barrier of a disaggregated request, the decode. New span ids are
    drawn in that order too."""
    out: list[_StageSpan] = []
    stages = {name: (start, end) for name, start, end in trace.stages}
    if "hold" in stages and ctx.held_s:
        start, end = stages["hold"]
        out.append(_StageSpan("tandem.cold_start_hold", new_span_id(), start, end, "INTERNAL", {}))
    if "admit" in stages:
        start, end = stages["admit"]
        attrs: dict[str, Any] = {"tandem.queue_s": ctx.queue_s or 0.0, "tandem.priority": ctx.priority}
        out.append(_StageSpan("tandem.admission", new_span_id(), start, end, "INTERNAL", attrs))
    if "disaggregate" in stages:
        _, end = stages["disaggregate"]
        barrier_s = trace.barrier_s or 0.0
        if ctx.prefill_s is not None:
            prefill_end = end - barrier_s
            attrs = {"tandem.prefill_endpoint": ctx.prefill_endpoint or ""}
            start = prefill_end - ctx.prefill_s
            out.append(_StageSpan("tandem.prefill", trace.prefill_span, start, prefill_end, "CLIENT", attrs))
        if trace.barrier_s is not None:
            attrs = {"tandem.kv_barrier": _barrier_outcome(ctx)}
            out.append(
                _StageSpan("tandem.kv_barrier", new_span_id(), end - barrier_s, end, "INTERNAL", attrs)
            )
    if "dispatch" in stages:
        start, end = stages["dispatch"]
        first = ctx.first_byte_at if ctx.first_byte_at is not None else end
        attrs = {"tandem.decode_endpoint": ctx.decode_endpoint or ""}
        out.append(_StageSpan("tandem.decode", trace.decode_span, start, first, "CLIENT", attrs))
    return out


def _failure(ctx: RequestContext) -> str | None:
    """Why the request failed (the span's ERROR description), or None when it succeeded."""
    if ctx.client_disconnected:
        return "client disconnected"
    if ctx.status is not None and ctx.status >= 400:
        return ctx.error or f"HTTP {ctx.status}"
    if ctx.error is not None:
        return ctx.error
    return None


def _barrier_outcome(ctx: RequestContext) -> str:
    if ctx.pd_fallback in ("barrier_timeout", "pool_unavailable"):
        return ctx.pd_fallback
    return "ok"
