"""The `Relay` stage of a generation request's way (`tandem.router.pipeline.stages` is the map): the
answer, relayed as it arrives and metered for the fair queue and the rate limits; a stream the
admission gate stops is continued (`tandem.router.pipeline.resume`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tandem.router.admission.grant import Grant
from tandem.router.pipeline.context import RequestContext
from tandem.router.pipeline.exchange import Exchange
from tandem.router.pipeline.lead import HandoverLead
from tandem.router.pipeline.meter import GrantMeter
from tandem.router.pipeline.resume import Resume
from tandem.router.types import Route
from tandem.router.upstream.continuation import continuable
from tandem.router.upstream.dispatch import Attempt
from tandem.router.upstream.relay import STALLED_WRITE_S, ResponseMeter, Yielding, relay
from tandem.router.upstream.rename import RenamingMeter


@dataclass(frozen=True, slots=True)
class Relay:
    """The answer, relayed as it arrives, metered for the fair queue and the rate limits. With
    `resume` (pre-emption on), a stream that can be continued may be stopped by the admission gate
    for another tenant, and is then continued when its tenant's turn comes (`pipeline.resume`)."""

    output_charge: Callable[[str], Callable[[int], None] | None]
    log_prompts: bool
    handover_tokens: int = 0  # 0: a slot frees only when its answer is over
    #: How long the next request takes to reach its decode engine (None: hand over at
    #: `handover_tokens` only); learned from the requests relayed here.
    lead: HandoverLead | None = None
    resume: Resume | None = None
    #: Name the engines that served the request in `x-tandem-*` headers (diagnostics; off by
    #: default: a client would learn pod addresses, and whether its prompt was cached).
    topology_headers: bool = False
    #: Seconds a client may take nothing of its stream before the stream ends (`ClientStalled`).
    write_s: float = STALLED_WRITE_S
    name: str = "relay"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        attempt, grant = ctx.attempt, ctx.grant
        if attempt is None or grant is None:
            raise RuntimeError("relay before dispatch")
        yielding = None
        if self.resume is not None and continuable(ctx.route, ctx.body):

            def withdraw() -> None:
                grant.preempt = None

            yielding = Yielding(attempt, chat=ctx.route is Route.CHAT, withdraw=withdraw)
            grant.preempt, grant.at = yielding.stop, attempt.endpoint.url
        meter = self._meter(ctx, grant, ctx.expected_output(), attempt=attempt)
        stopped = await relay(
            attempt,
            send=exchange.send,
            headers=_headers(ctx, topology=self.topology_headers),
            meter=meter,
            progress=ctx,
            yielding=yielding,
            write_s=self.write_s,
            rename=ctx.rename,
        )
        self._learn_lead(ctx, grant)
        if stopped and yielding is not None and self.resume is not None:
            ctx.continued = True
            await self.resume(
                ctx,
                exchange.send,
                so_far=yielding.kept.result(),
                tokens=grant.completion_tokens,
                meter=lambda again, left: self._meter(ctx, again, left, attempt=ctx.attempt),
            )

    def _learn_lead(self, ctx: RequestContext, grant: Grant) -> None:
        """Tell the lead how long this request took from its grant to its decode engine, and there
        to its first byte when it was prefilled elsewhere (`tandem.router.pipeline.lead`)."""
        lead, sent, first = self.lead, ctx.dispatched_at, ctx.first_byte_at
        if lead is None or grant.granted_at is None or sent is None or first is None or ctx.retries:
            return
        lead.record(phase_s=sent - grant.granted_at, start_s=first - sent if ctx.kv_loaded else None)

    def _meter(
        self, ctx: RequestContext, grant: Grant, expected: int | None, *, attempt: Attempt | None
    ) -> ResponseMeter:
        """The grant's meter; for a request that came by an alias, renaming its stream's `model`."""
        meter = self._grant_meter(ctx, grant, expected, attempt=attempt)
        return meter if ctx.rename is None else RenamingMeter(meter, ctx.rename)

    def _grant_meter(
        self, ctx: RequestContext, grant: Grant, expected: int | None, *, attempt: Attempt | None
    ) -> GrantMeter:
        def hand_over() -> None:
            if attempt is not None:
                attempt.hand_over()  # the endpoint's slot first: the gate's pump dispatches into it
            grant.hand_over()

        return GrantMeter(
            grant,
            strip_usage=ctx.strip_usage,
            on_output=self.output_charge(ctx.tenant),
            on_text=ctx.keep_output if self.log_prompts else None,
            expected=expected if self.handover_tokens else None,
            handover_tokens=self.handover_tokens,
            on_handover=hand_over,
            lead=self.lead,
            clock=ctx.clock,
        )


def _headers(ctx: RequestContext, *, topology: bool) -> list[tuple[bytes, bytes]]:
    """`x-request-id`, and with `topology` the `x-tandem-*` headers naming the engines that served
    the request."""
    headers = [(b"x-request-id", ctx.request_id.encode())]
    if not topology:
        return headers
    if ctx.decode_endpoint is not None:
        headers.append((b"x-tandem-decode-endpoint", ctx.decode_endpoint.encode()))
    if ctx.prefill_endpoint is not None:
        headers.append((b"x-tandem-prefill-endpoint", ctx.prefill_endpoint.encode()))
    elif ctx.pd_fallback is not None:
        headers.append((b"x-tandem-pd-fallback", ctx.pd_fallback.encode()))
    return headers
