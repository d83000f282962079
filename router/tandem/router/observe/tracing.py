"""A request's trace identity (`RequestTrace`), which the stages carry; `tandem.router.http.tracing`
builds and exports the spans. The gateway's traces: one server span per generation request, with
child spans for the stages that take time, built when the request is over (docs/observability.md, "Traces").

On the request path, with tracing on, a request costs one `RequestTrace` (a few integers: the trace id,
its own span id, its parent's, the sampling decision, the prefill and decode calls' span ids) and, when
sampled, one (name, start, end) tuple per stage, appended by `Pipeline.run`. No span object exists
until `GatewayTracer.finish`, which builds them (OpenTelemetry SDK `ReadableSpan`s with the ids drawn at
the start) and hands them to the batch processor, whose thread exports them. Unsampled requests build
nothing. With tracing off there is no tracer and `ctx.trace` stays None.

The spans of a sampled request (times from the gateway's clock; the prefill and KV-barrier spans end
where the disaggregate stage ended, minus what followed them, as `PDOutcome` measures):

| span | kind | when |
| --- | --- | --- |
| `{operation} {model}` (`chat qwen`, `text_completion qwen`) | SERVER | always: the whole request |
| `tandem.cold_start_hold` | INTERNAL | the request waited for a first decode engine |
| `tandem.admission` | INTERNAL | the fair queue (its wait is `tandem.queue_s`) |
| `tandem.prefill` | CLIENT | a prefill ran on another engine (its `traceparent` names this span) |
| `tandem.kv_barrier` | INTERNAL | the gateway waited for the prompt's KV in the pool |
| `tandem.decode` | CLIENT | from the decode call to its first byte (its `traceparent` names this span) |

The server span carries the GenAI attributes (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.response.time_to_first_chunk`),
`http.response.status_code`, and Tandem's own under `tandem.*`: the request id, tenant, priority,
queue wait, P/D decision and fallback, the engines, the KV-barrier outcome, pre-emptions (continued),
retries (`tandem.retries`: decode attempts that failed elsewhere first), the adapter. Prompt and
answer text only with `logPrompts`. A failure (status ≥ 400, a client that left, an exception) sets
the span's status to ERROR with the error's message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.core.tracing import TRACEPARENT, TRACESTATE, traceparent


@dataclass(slots=True)
class RequestTrace:
    """One request's trace identity and, when sampled, its stage times (module docstring)."""

    trace_id: int
    span_id: int
    parent_id: int | None
    sampled: bool
    tracestate: str | None
    prefill_span: int
    decode_span: int
    #: (stage name, start, end) in the gateway's clock, appended by `Pipeline.run` when sampled.
    stages: list[tuple[str, float, float]] = field(default_factory=list)
    barrier_s: float | None = None

    def headers(self, call: str) -> dict[str, str]:
        """The W3C headers of the prefill (`call` "prefill") or decode call: the call's span is the
        parent of what the engine records."""
        span = self.prefill_span if call == "prefill" else self.decode_span
        out = {TRACEPARENT: traceparent(self.trace_id, span, self.sampled)}
        if self.tracestate:
            out[TRACESTATE] = self.tracestate
        return out
