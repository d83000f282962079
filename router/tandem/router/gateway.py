"""One generation request end to end: the P/D decision, the prefill step, the decode dispatch,
and the response with the `x-tandem-*` headers.

Response headers added here: `x-tandem-decode-endpoint` (always), `x-tandem-prefill-endpoint`
(when the decode got KV from a prefill), `x-tandem-pd-fallback` (the reason, when a disaggregated
request went decode-only). `x-request-id` is added by the middleware.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import Response

from tandem.router.disagg import DisaggregationMode, Prefiller, should_disaggregate
from tandem.router.dispatch import Dispatcher
from tandem.router.handoff import decode_body
from tandem.router.proxy import UpstreamCall
from tandem.router.relay import render
from tandem.router.report import RequestReport
from tandem.router.types import RequestView


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    dispatcher: Dispatcher
    prefiller: Prefiller
    mode: DisaggregationMode

    async def generate(self, request: RequestView, *, report: RequestReport) -> Response:
        """Serve a validated request. Raises `NoEndpointAvailable` when no decode endpoint could
        take it; never fails because of prefill."""
        upstream_headers = {"x-request-id": request.request_id}
        response_headers: dict[str, str] = {}
        body = request.body
        metrics = self.dispatcher.metrics
        prefill_members = len(self.dispatcher.registry.endpoints("prefill"))
        if should_disaggregate(self.mode, prefill_members=prefill_members):
            metrics.pd_decisions.labels(decision="disaggregate").inc()
            outcome = await self.prefiller.prefill(request, headers=upstream_headers)
            report.prefill_s = outcome.duration_s
            if outcome.kv_transfer_params is not None and outcome.endpoint is not None:
                body = decode_body(body, outcome.kv_transfer_params)
                report.prefill_endpoint = outcome.endpoint.name
                response_headers["x-tandem-prefill-endpoint"] = outcome.endpoint.name
            else:
                report.pd_fallback = outcome.fallback
                response_headers["x-tandem-pd-fallback"] = outcome.fallback or "unknown"
        else:
            metrics.pd_decisions.labels(decision="decode_only").inc()
        call = UpstreamCall(
            path=request.route.value, body=body, headers=upstream_headers, stream=request.stream
        )
        attempt = await self.dispatcher.open("decode", request=request, call=call)
        report.decode_endpoint = attempt.endpoint.name
        response_headers["x-tandem-decode-endpoint"] = attempt.endpoint.name
        return await render(attempt, headers=response_headers)
