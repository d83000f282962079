"""OTLP trace receivers on 127.0.0.1 for tests: gRPC (`TraceService/Export`, as an OpenTelemetry
Collector serves it) and HTTP/protobuf (`POST /v1/traces`). Each keeps every span it receives, decoded
from the wire's protobuf (`opentelemetry-proto`), as a `ReceivedSpan`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from tests.servers import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    service: str
    error: bool
    status_message: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def decode(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=span.kind,
                        service=str(resource.get("service.name")),
                        error=span.status.code == Status.STATUS_CODE_ERROR,
                        status_message=span.status.message,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return out


SERVER, CLIENT, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL


@dataclass
class Receiver:
    """The spans received so far, and the endpoint to send them to."""

    endpoint: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self.lock:
            self.spans.extend(spans)

    def wait_for(
        self, count: int, *, trace_id: str | None = None, timeout_s: float = 20.0
    ) -> list[ReceivedSpan]:
        """At least `count` spans (of `trace_id`, when given), waiting for the exporters' batches."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                found = [s for s in self.spans if trace_id is None or s.trace_id == trace_id]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.add(decode(request))
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def grpc_receiver() -> Iterator[Receiver]:
    import grpc  # type: ignore[import-untyped]

    port = free_port()
    receiver = Receiver(endpoint=f"http://127.0.0.1:{port}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        _Servicer(receiver), server
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None)


@contextmanager
def http_receiver() -> Iterator[Receiver]:
    port = free_port()
    receiver = Receiver(endpoint=f"http://127.0.0.1:{port}/v1/traces")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.add(decode(request))
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
