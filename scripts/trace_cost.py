#!/usr/bin/env python3
"""What tracing costs the gateway per request, by part, in-process and single-threaded.

With the gateway's own objects (`tandem.router.http.tracing.GatewayTracer`, a `RequestContext` whose
stages are recorded as `Pipeline.run` records them, a P/D request's five child spans), it times, as
the median of `--repeat` runs of `--requests` requests each (microseconds per request,
`time.process_time`, so the exporter's thread is counted as the gateway's CPU):

- `off (added work)`: with tracing off, what the request path still does for tracing (two `None`
  tests and two empty header merges), as the difference to the same work without it;
- `start`: `GatewayTracer.start` (a request's ids and decision; every request pays it when tracing
  is on, sampled or not);
- `sampled, to file`: start, the stage records, and `finish` (the spans built and handed to the batch
  processor) with the file exporter, flushed, so the export's encoding and writing are in;
- `sampled, OTLP protobuf`: the same with the OTLP exporter's protobuf encoding (`encode_spans`) and no
  network, an upper bound on what the gRPC or HTTP exporter spends before its socket.

Compare with the gateway's CPU per request (about 3 ms on a 2-core host, docs/benchmarks.md):

    .venv/bin/python scripts/trace_cost.py --requests 2000 --repeat 5

No server is started and nothing is sent anywhere (the file exporter writes into a temporary folder).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tandem.core.tracing import FileSpanExporter, TracingSpec
from tandem.router.http.tracing import GatewayTracer
from tandem.router.pipeline.context import RequestContext
from tandem.router.types import Route

STAGES = ("identify", "parse", "limit", "admit", "pick", "disaggregate", "dispatch", "relay")
#: Room for every span of a run: none dropped, so every export is in the figure.
QUEUE = 1 << 20
HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


class EncodeOnly(SpanExporter):
    """The OTLP exporters' protobuf encoding, then nothing (no socket)."""

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def request(tracer: GatewayTracer, *, finish: bool) -> None:
    ctx = RequestContext(request_id="r", upstream_id="r", path="/v1/chat/completions", started=0.0,
                         route=Route.CHAT)  # fmt: skip
    ctx.trace = tracer.start(HEADERS)
    if not finish:
        return
    ctx.model, ctx.status, ctx.queue_s, ctx.prefill_s = "qwen", 200, 0.001, 0.02
    ctx.prefill_endpoint, ctx.decode_endpoint, ctx.kv_loaded = "10.0.0.1:8000", "10.0.0.2:8000", True
    ctx.first_byte_at = 0.05
    ctx.trace.barrier_s = 0.002
    ctx.trace.stages.extend((name, i * 0.01, i * 0.01 + 0.005) for i, name in enumerate(STAGES))
    tracer.finish(ctx, now=0.2)


def measure(name: str, make: Callable[[], tuple[GatewayTracer, Any]], *, finish: bool, requests: int,
            repeat: int) -> float:  # fmt: skip
    runs = []
    for _ in range(repeat):
        tracer, processor = make()
        start = time.process_time()
        for _ in range(requests):
            request(tracer, finish=finish)
        processor.force_flush()
        runs.append((time.process_time() - start) / requests * 1e6)
        tracer.shutdown()
    value = statistics.median(runs)
    sys.stdout.write(f"{name:<24} {value:8.1f} µs per request\n")
    return value


def off_path(*, requests: int, repeat: int) -> float:
    """With tracing off, what the request path still does for it: the shell's `tracer is None` test,
    `Pipeline.run`'s `trace is None` test, and the two engine calls' `trace_headers` (an empty dict
    merged into each call's headers); against the same work without them."""
    ctx = RequestContext(request_id="r", upstream_id="r", path="/v1/chat/completions", started=0.0,
                         route=Route.CHAT)  # fmt: skip
    tracer = None

    def with_hooks() -> None:
        if tracer is not None:
            return
        if ctx.trace is None:
            pass
        _ = {"x-request-id": ctx.upstream_id, **ctx.trace_headers("prefill")}
        _ = {"x-request-id": ctx.upstream_id, **ctx.trace_headers("decode")}

    def without() -> None:
        _ = {"x-request-id": ctx.upstream_id}
        _ = {"x-request-id": ctx.upstream_id}

    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(requests):
            with_hooks()
        middle = time.process_time()
        for _ in range(requests):
            without()
        runs.append(((middle - start) - (time.process_time() - middle)) / requests * 1e6)
    value = statistics.median(runs)
    sys.stdout.write(f"{'off (added work)':<24} {value:8.3f} µs per request\n")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="tandem-trace-cost-"))

    def to_file() -> tuple[GatewayTracer, Any]:
        exporter = FileSpanExporter(folder, service="cost")
        processor = BatchSpanProcessor(exporter, max_queue_size=QUEUE, max_export_batch_size=256)
        return GatewayTracer(TracingSpec(endpoint="file://x"), service="cost", processor=processor), processor

    def to_protobuf() -> tuple[GatewayTracer, Any]:
        processor = BatchSpanProcessor(EncodeOnly(), max_queue_size=QUEUE, max_export_batch_size=256)
        return GatewayTracer(TracingSpec(endpoint="http://x"), service="cost", processor=processor), processor

    off_path(requests=max(args.requests, 100_000), repeat=args.repeat)
    measure("start", to_file, finish=False, requests=args.requests, repeat=args.repeat)
    measure("sampled, to file", to_file, finish=True, requests=args.requests, repeat=args.repeat)
    measure("sampled, OTLP protobuf", to_protobuf, finish=True, requests=args.requests, repeat=args.repeat)


if __name__ == "__main__":
    main()
