"""vLLM's request span, as the simulator emits it under vLLM's flag (`--otlp-traces-endpoint`).

vLLM 0.32 (`vllm/tracing`, `OutputProcessor.do_tracing`) records one span per request when it
finishes: name `llm_request`, kind SERVER, from the request's arrival to its end, parented on the
request's incoming W3C `traceparent`/`tracestate` (a new trace without one), with these attributes:

- `gen_ai.request.id`: the engine's request id; `gen_ai.response.model`: the served name (or adapter);
- `gen_ai.request.max_tokens`, `.temperature`, `.top_p`, `.n`: the request's;
- `gen_ai.usage.prompt_tokens`, `.completion_tokens`, `.num_sequences`: the counts;
- `gen_ai.latency.time_to_first_token`, `gen_ai.latency.e2e`: seconds (vLLM's `time_in_queue` and
  its model-time attributes are not simulated).

Like vLLM, only requests that finish are traced (an aborted or failed request emits no span), the
protocol comes from `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (grpc by default, or http/protobuf), and
every request is recorded (no sampler of its own: the SDK's default follows the parent's flag, so an
unsampled parent records nothing). The simulator also accepts `file://DIR`, Tandem's file exporter
(`tandem.core.tracing`), which vLLM does not. Spans go through a batch processor on its own thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.core.tracing import (
    TRACEPARENT,
    TracingSpec,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    span_processor,
)


@dataclass(frozen=True, slots=True)
class RequestSpan:
    """What the simulator knows of one request when it finishes (times in epoch nanoseconds)."""

    request_id: str
    model: str
    traceparent: str | None
    arrival_ns: int
    first_token_ns: int | None
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int | None
    temperature: float | None
    top_p: float | None


class SimTracer:
    """Exports `llm_request` spans (module docstring)."""

    def __init__(
        self, endpoint: str, *, environ: Mapping[str, str], service: str, processor: Any = None
    ) -> None:
        from opentelemetry.sdk.resources import Resource

        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
        if protocol not in ("grpc", "http/protobuf"):
            # vLLM's own check and wording (`vllm/tracing`).
            raise ValueError(f"Unsupported OTLP protocol '{protocol}' is configured")
        settings = TracingSpec(endpoint=endpoint, protocol=protocol, sampling_ratio=1.0)
        self._processor = processor if processor is not None else span_processor(settings, service=service)
        self._resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", service)})

    def finished(self, span: RequestSpan, *, end_ns: int | None = None) -> None:
        """Record a finished request (an unsampled parent records nothing)."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

        end = end_ns if end_ns is not None else time.time_ns()
        parent = parse_traceparent(span.traceparent)
        if parent is not None and not parent[2]:
            return
        trace_id = parent[0] if parent is not None else new_trace_id()
        flags = TraceFlags(TraceFlags.SAMPLED)
        remote = (
            SpanContext(trace_id, parent[1], is_remote=True, trace_flags=flags)
            if parent is not None
            else None
        )
        ttft = None if span.first_token_ns is None else (span.first_token_ns - span.arrival_ns) / 1e9
        attrs: dict[str, Any] = {
            "gen_ai.request.id": span.request_id,
            "gen_ai.response.model": span.model,
            "gen_ai.request.n": 1,
            "gen_ai.usage.prompt_tokens": span.prompt_tokens,
            "gen_ai.usage.completion_tokens": span.completion_tokens,
            "gen_ai.usage.num_sequences": 1,
            "gen_ai.latency.e2e": (end - span.arrival_ns) / 1e9,
        }
        optional = {
            "gen_ai.request.max_tokens": span.max_tokens,
            "gen_ai.request.temperature": span.temperature,
            "gen_ai.request.top_p": span.top_p,
            "gen_ai.latency.time_to_first_token": ttft,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        self._processor.on_end(
            ReadableSpan(
                name="llm_request",
                context=SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=flags),
                parent=remote,
                resource=self._resource,
                attributes=attrs,
                kind=SpanKind.SERVER,
                start_time=span.arrival_ns,
                end_time=end,
                instrumentation_scope=InstrumentationScope("vllm.llm_engine"),
            )
        )

    def shutdown(self) -> None:
        self._processor.shutdown()


def request_traceparent(headers: Mapping[str, str]) -> str | None:
    """The incoming `traceparent` a request's span is parented on (None: a new trace)."""
    return headers.get(TRACEPARENT)
