"""Traces: the settings, W3C trace context, sampling and the span exporters the gateway and the simulator
share (docs/observability.md, "Traces").

What is pure here: `TracingSpec` (the spec's `tracing` section), `parse_traceparent` /
`traceparent` (W3C Trace Context, version 00), `sampled` (parent-based trace-id ratio, as
OpenTelemetry's `ParentBased(TraceIdRatioBased(r))`), `settings_from_env` (the standard `OTEL_*`
variables over the spec's values). What is not: `span_processor` builds the OpenTelemetry SDK's batch
processor around an OTLP exporter (gRPC or HTTP/protobuf) or Tandem's file exporter (`file://DIR`: one
JSON line per span in `DIR/<service>-<pid>.jsonl`, which `tandem trace` reads). Export runs on the
processor's own thread, never on the event loop; a full queue drops the oldest spans, never blocks.

Spans are built once a request is over, from times the request already recorded, with ids drawn
when it started (so the prefill and decode calls can name their parent span before it exists).
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Protocol = Literal["grpc", "http/protobuf"]
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_RATIO_BOUND = 1 << 64


class TracingSpec(BaseModel):
    """`spec.tracing`: where spans go and how many requests are traced."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    endpoint: str = Field(
        min_length=1,
        max_length=2048,
        description="OTLP endpoint (e.g. http://otel-collector:4317 for grpc, "
        "http://otel-collector:4318/v1/traces for http/protobuf), or file://DIR to write spans as JSON "
        "lines (tandem up; read with tandem trace).",
    )
    protocol: Protocol = Field(default="grpc", description="OTLP protocol: grpc or http/protobuf.")
    sampling_ratio: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Share of requests without a sampled parent that are traced (parent-based: a client's "
        "sampled traceparent is always followed).",
    )


def settings_from_env(spec: TracingSpec | None, environ: Mapping[str, str]) -> TracingSpec | None:
    """The tracing settings in effect: the standard `OTEL_*` variables over `spec`'s values. None when
    tracing is off: no endpoint anywhere, or `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none`.

    Read: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`;
    `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`; `OTEL_TRACES_SAMPLER_ARG`
    (the ratio, with a parent-based ratio sampler, the only one offered)."""
    if (
        environ.get("OTEL_SDK_DISABLED", "").lower() == "true"
        or environ.get("OTEL_TRACES_EXPORTER") == "none"
    ):
        return None
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ratio = environ.get("OTEL_TRACES_SAMPLER_ARG")
    if spec is None and not endpoint:
        return None
    values: dict[str, Any] = spec.model_dump() if spec is not None else {}
    if endpoint:
        values["endpoint"] = endpoint
    if protocol:
        values["protocol"] = protocol
    if ratio:
        values["sampling_ratio"] = float(ratio)
    return TracingSpec.model_validate(values)


def engine_tracing(tracing: TracingSpec | None, *, kind: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The engine's arguments and environment for `tracing` (vLLM's flag and the OpenTelemetry SDK's
    variables, which vLLM reads): `--otlp-traces-endpoint`, the protocol, and a parent-based ratio
    sampler (requests from the gateway carry its decision; others are sampled at the ratio). Nothing
    when tracing is off, or for vLLM with a `file://` endpoint (Tandem's own; vLLM exports OTLP only)."""
    if tracing is None or (kind == "vllm" and tracing.endpoint.startswith("file://")):
        return (), {}
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": tracing.protocol,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": f"{tracing.sampling_ratio:g}",
    }
    return ("--otlp-traces-endpoint", tracing.endpoint), env


def parse_traceparent(value: str | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent`, or None when absent or invalid (an
    all-zero id is invalid). Only version 00 is read."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, bool(int(match[3], 16) & 1)


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    """The W3C header for a call whose parent span is `span_id`.

    >>> traceparent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'"""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def sampled(trace_id: int, *, parent: bool | None, ratio: float) -> bool:
    """Parent-based ratio sampling: a parent's decision is followed; without a parent, the trace is
    sampled when its id's low 64 bits fall under `ratio` of their range (OpenTelemetry's
    TraceIdRatioBased), so every service deciding on the same id agrees."""
    if parent is not None:
        return parent
    return (trace_id & (_RATIO_BOUND - 1)) < ratio * _RATIO_BOUND


def new_trace_id(rng: random.Random | None = None) -> int:
    return (rng or random).getrandbits(128) or 1


def new_span_id(rng: random.Random | None = None) -> int:
    return (rng or random).getrandbits(64) or 1


class FileSpanExporter:
    """Spans as JSON lines in `DIR/<service>-<pid>.jsonl` (an OpenTelemetry `SpanExporter`): one object per
    span with `trace_id`, `span_id`, `parent_id` (hex), `name`, `kind`, `service`, `start_ns`, `end_ns`,
    `status` (`ok`/`error`), `status_message` and `attributes`. Lines are appended and flushed per batch."""

    def __init__(self, directory: Path, *, service: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{service}-{os.getpid()}.jsonl"
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans]
        try:
            with self._lock, self.path.open("a", encoding="utf-8") as out:
                out.writelines(lines)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def span_record(span: Any) -> dict[str, Any]:
    """A finished OpenTelemetry span as the file exporter's JSON object (module docstring)."""
    context = span.context
    parent = span.parent
    status = span.status
    return {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name.lower(),
        "service": span.resource.attributes.get("service.name"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": "error" if status.status_code.name == "ERROR" else "ok",
        "status_message": status.description,
        "attributes": dict(span.attributes or {}),
    }


def span_processor(settings: TracingSpec, *, service: str) -> Any:
    """The batch span processor for `settings` (an OpenTelemetry SDK `BatchSpanProcessor`)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter: Any
    if settings.endpoint.startswith("file://"):
        exporter = FileSpanExporter(Path(settings.endpoint.removeprefix("file://")), service=service)
    elif settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter = GrpcExporter(endpoint=settings.endpoint, insecure=settings.endpoint.startswith("http://"))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter(endpoint=settings.endpoint)
    # Half a second between exports (SGLang's choice; the SDK's 5 s holds spans longer than a trace
    # viewer waits), and room for a burst: a full queue drops the oldest spans, never blocks.
    return BatchSpanProcessor(
        exporter, max_queue_size=8192, schedule_delay_millis=500, max_export_batch_size=512
    )
