"""One generation request end to end: admission, the P/D step, the decode dispatch, and the
response with the `x-tandem-*` headers.

1. `AdmissionGate.admit` waits for decode capacity in fair order, or raises `Overloaded` (429).
2. The scheduler chooses the decode endpoint first, so the P/D decision can look at what that
   endpoint already has cached (`Disaggregator.run`: decide, prefill, KV barrier; never fails).
3. Decode: the body for decode, with `stream_options.include_usage` added when the client streams
   without it (the usage event is then stripped from the client's stream), sent to the chosen endpoint
   (retried elsewhere before the first byte).
4. The answer is relayed through a `GrantMeter`, which charges generated tokens to the tenant and frees
   the capacity when the response is over. Any failure before that frees it at once.

Response headers added here: `x-tandem-decode-endpoint` (always), `x-tandem-prefill-endpoint`
(when the decode got KV from a prefill), `x-tandem-pd-fallback` (the reason, when a disaggregated
request went decode-only). `x-request-id` is added by the middleware, `Retry-After` by the error handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import Response

from tandem.router.admission.gate import AdmissionGate, Grant
from tandem.router.admission.meter import GrantMeter
from tandem.router.admission.ratelimit import RateLimiter
from tandem.router.observe.report import RequestReport
from tandem.router.pd.disagg import Disaggregator
from tandem.router.types import RequestView
from tandem.router.upstream.client import UpstreamCall
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.relay import render
from tandem.router.upstream.usage import request_usage


@dataclass(frozen=True, slots=True, kw_only=True)
class Gateway:
    dispatcher: Dispatcher
    disaggregator: Disaggregator
    admission: AdmissionGate
    #: Charged with each request's output tokens as they stream (its prompt is taken at the door).
    rate_limiter: RateLimiter | None = None
    #: Put the output text in the request's log line (`spec.router.logPrompts`, `--log-prompts`).
    log_prompts: bool = False

    async def generate(self, request: RequestView, *, report: RequestReport) -> Response:
        """Serve a validated request. Raises `Overloaded` when it is not admitted and
        `NoEndpointAvailable` when no decode endpoint could take it; never fails because of prefill
        or the KV pool."""
        grant = await self.admission.admit(request)
        report.queue_s = grant.queued_s
        try:
            return await self._serve(request, grant=grant, report=report)
        except BaseException:
            grant.release()
            raise

    async def _serve(self, request: RequestView, *, grant: Grant, report: RequestReport) -> Response:
        upstream_headers = {"x-request-id": request.request_id}
        response_headers: dict[str, str] = {}
        decode = self.dispatcher.choose("decode", request)
        pd = await self.disaggregator.run(request, decode=decode, headers=upstream_headers)
        report.prefill_s = pd.prefill_s
        if pd.prefill_endpoint is not None:
            report.prefill_endpoint = pd.prefill_endpoint.name
            response_headers["x-tandem-prefill-endpoint"] = pd.prefill_endpoint.name
        elif pd.fallback is not None:
            report.pd_fallback = pd.fallback
            response_headers["x-tandem-pd-fallback"] = pd.fallback
        body, strip_usage = request_usage(pd.body)
        call = UpstreamCall(
            path=request.route.value, body=body, headers=upstream_headers, stream=request.stream
        )
        attempt = await self.dispatcher.open("decode", request=request, call=call, first=decode)
        report.decode_endpoint = attempt.endpoint.name
        response_headers["x-tandem-decode-endpoint"] = attempt.endpoint.name
        meter = GrantMeter(
            grant,
            strip_usage=strip_usage,
            on_output=self._output_charge(request.tenant),
            on_text=report.record_output if self.log_prompts else None,
        )
        return await render(attempt, headers=response_headers, meter=meter)

    def _output_charge(self, tenant: str) -> Callable[[int], None] | None:
        limiter = self.rate_limiter
        if limiter is None or limiter.limits(tenant).tokens_per_minute is None:
            return None
        return lambda tokens: limiter.charge(tenant, tokens)
