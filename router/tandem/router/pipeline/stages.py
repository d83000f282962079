"""A generation request's way through the gateway. This file is the map: the stages, in order,
each one small object with one job, reading and writing the request's `RequestContext`.

    identify → parse → limit → hold → admit → pick → disaggregate → dispatch → relay

| stage | does | fails with |
|---|---|---|
| `Identify` | request id, tenant (API key or header), SLO headers, priority band | 400, 401, 403 |
| `Parse` | body read once, bounded, validated, steering fields dropped, tenant's cache salt set | 400-429 |
| `Limit` | the tenant's rate limits, before the prompt is tokenized | 429 |
| `Hold` | while the decode pool has no engine at all (from zero), waits for its first one | 429 |
| `Admit` | waits for decode capacity in fair (VTC) order; holds a `Grant` | 429 |
| `Pick` | the decode endpoint, so P/D can look at what it already caches | — |
| `Disaggregate` | the P/D decision, the prefill and the KV barrier (never fails the request) | — |
| `Dispatch` | the decode request, retried elsewhere before its first byte | 503 |
| `Relay` | the answer, byte for byte, charged as it streams; continued if pre-empted (`resume`) | — |

`Pipeline.run` runs them in order; a stage raises a `RouterError` to stop the request (the HTTP
shell, `tandem.router.http.server`, answers it in OpenAI's error shape). What a stage holds until the
request is over (the grant, the decode attempt) it registers in `ctx.cleanups`, which the shell runs
whatever happened. The code each stage calls lives in its own package: `identity`, `request`,
`admission`, `scheduling` (through `upstream.dispatch`), `pd`, `upstream`. `Relay` is in
`tandem.router.pipeline.answer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Protocol

import orjson

from tandem.core.logs import REQUEST_ID
from tandem.router.admission.access import Access
from tandem.router.admission.coldstart import ColdStartHold
from tandem.router.admission.gate import AdmissionGate
from tandem.router.errors import Overloaded, RequestTimeout
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.identity.headers import PriorityPolicy, TenantResolver, own_deadline, slo_from_headers
from tandem.router.identity.request_id import HEADER as REQUEST_ID_HEADER
from tandem.router.identity.request_id import request_ids
from tandem.router.observe.arrivals import Arrivals
from tandem.router.pd.ahead import PrefillAhead
from tandem.router.pd.disagg import Disaggregator
from tandem.router.pd.handoff import away_from_layout_body, lmcache_tagged
from tandem.router.pipeline.answer import Relay
from tandem.router.pipeline.context import RequestContext
from tandem.router.pipeline.exchange import Exchange
from tandem.router.pipeline.tokenize import tokenize_big
from tandem.router.request.context_limit import ContextLimit
from tandem.router.request.limits import BodyLimits, ReadingBudget
from tandem.router.request.parse import parse_generation, prompt_text
from tandem.router.types import SLO, Route
from tandem.router.upstream.client import UpstreamCall
from tandem.router.upstream.dispatch import Attempt, Dispatcher
from tandem.router.upstream.recall import ROOM_WAIT_S, Recalled
from tandem.router.upstream.usage import request_usage

log = logging.getLogger(__name__)


class Stage(Protocol):
    """One step of the request's way; raises `RouterError` to end the request with an error."""

    @property
    def name(self) -> str: ...

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Pipeline:
    """The stages in order (module docstring)."""

    stages: Sequence[Stage]

    async def run(self, ctx: RequestContext, exchange: Exchange) -> None:
        trace = ctx.trace
        if trace is None or not trace.sampled:
            for stage in self.stages:
                await stage(ctx, exchange)
            return
        clock = ctx.clock  # a sampled request: each stage's times, for its spans
        for stage in self.stages:
            start = clock()
            try:
                await stage(ctx, exchange)
            finally:
                trace.stages.append((stage.name, start, clock()))


@dataclass(frozen=True, slots=True)
class Identify:
    """Who is asking, and for what service level."""

    tenants: TenantResolver
    default_slo: SLO
    priorities: PriorityPolicy
    name: str = "identify"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        headers = exchange.headers
        ctx.request_id, ctx.upstream_id = request_ids(headers.get(REQUEST_ID_HEADER))
        REQUEST_ID.set(ctx.request_id)
        ctx.tenant = self.tenants.tenant(headers)  # 401 when auth is on and the key is bad
        ctx.slo = slo_from_headers(headers, default=self.default_slo)
        ctx.deadline_s = own_deadline(headers, ctx.slo)
        ctx.priority = self.priorities.priority(ctx.tenant, headers)  # 403 above the tenant's band


@dataclass(frozen=True, slots=True)
class Parse:
    """The body, read and parsed once; `log_prompts` keeps the prompt text for the log line.

    The body must arrive within `body_seconds` (408), fit `max_request_bytes` (413) and the
    `budget` of bytes all requests may be reading and parsing at once (429 `reading`), and pass
    `limits` (`tandem.router.request.limits`). A body of `off_loop_bytes` or more is tokenized in a
    worker thread, so one long prompt does not stall every other request's stream. With `scopes`,
    the body sent to engines carries the tenant's `cache_salt` (`tandem.router.identity.cachescope`),
    and the prompt's prefix keys are rooted in it and in the LoRA adapter `model` names, when it is
    one of `adapters` (`RequestContext.scope`; with `lmcache_engines` the body is tagged with the
    adapter for LMCache's keys). `accepted_models` None (a gateway of many services): `model` is
    resolved by the `Route` stage after it (`tandem.router.pipeline.route`), which then does what
    needs the service (the salt, the tag, the big prompt's tokens)."""

    accepted_models: AbstractSet[str] | None
    max_request_bytes: int
    log_prompts: bool
    limits: BodyLimits | None = None
    budget: ReadingBudget | None = None
    body_seconds: float = 60.0
    off_loop_bytes: int = 65_536
    scopes: CacheScopes | None = None
    context: ContextLimit | None = None
    tokenizing: asyncio.Semaphore | None = None
    adapters: AbstractSet[str] = frozenset()
    #: The engines run LMCache: an adapter's or a salted body is tagged
    #: (`tandem.router.pd.handoff.lmcache_tagged`).
    lmcache_engines: bool = False
    name: str = "parse"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        declared = exchange.headers.get("content-length")
        size = int(declared) if declared is not None and declared.isdigit() else self.max_request_bytes
        taken = min(size, self.max_request_bytes)
        if self.budget is not None and not self.budget.take(taken):
            raise Overloaded(
                "the gateway is reading too many request bodies at once; retry later",
                reason="reading",
                retry_after_s=1,
            )
        try:
            try:
                async with asyncio.timeout(self.body_seconds):
                    raw = await exchange.read_body(limit=self.max_request_bytes)
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body did not arrive within {self.body_seconds:g}s"
                ) from None
            parsed = parse_generation(ctx.route, raw, accepted=self.accepted_models, limits=self.limits)
            ctx.body, ctx.model, ctx.stream = parsed.body, parsed.model, parsed.stream
            ctx.body_bytes = len(raw)
            salt = self.scopes.salt(ctx.tenant) if self.scopes is not None else None
            if salt is not None:
                ctx.body["cache_salt"] = salt
            adapter = ctx.model if ctx.model in self.adapters else None
            if salt is not None or adapter is not None:
                ctx.scope(salt, adapter=adapter)
            if self.lmcache_engines:
                lmcache_tagged(ctx.body, adapter=adapter, salt=salt)
            if self.log_prompts:
                ctx.prompt_text = prompt_text(parsed.body)
            if len(raw) >= self.off_loop_bytes and ctx.encoder is not None:
                await tokenize_big(ctx, context=self.context, tokenizing=self.tokenizing)
        finally:
            if self.budget is not None:
                self.budget.give(taken)


@dataclass(frozen=True, slots=True)
class Limit:
    """The tenant's request and token budgets (the prompt is counted only if a token limit asks)."""

    access: Access
    name: str = "limit"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        self.access.admit(ctx.tenant, prompt_tokens=ctx.prompt_length)


@dataclass(frozen=True, slots=True)
class Hold:
    """While the decode pool has no member at all (scaled to zero, its first engine starting), the
    request waits for one here, before admission charges it anything (`admission.coldstart`)."""

    hold: ColdStartHold
    arrivals: Arrivals | None = None
    name: str = "hold"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        if self.arrivals is not None:
            self.arrivals.arrived(ctx)  # counted as it arrives: the autoscaler's leading signal
        ctx.held_s = await self.hold.wait()


@dataclass(frozen=True, slots=True)
class Admit:
    """A unit of decode capacity, in fair order between tenants. With `ahead`, a request the gate
    takes ahead of capacity starts its P/D step while it waits (`tandem.router.pd.ahead`)."""

    gate: AdmissionGate
    ahead: PrefillAhead | None = None
    name: str = "admit"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        ahead, on_ahead = self.ahead, None
        if ahead is not None and ahead.eligible(ctx):

            def on_ahead() -> None:
                ctx.ahead = ahead.start(ctx, headers=prefill_headers(ctx))

            ctx.cleanups.append(lambda: ahead.end(ctx.ahead, used=ctx.ahead_used))
        grant = await self.gate.admit(ctx, on_ahead=on_ahead)
        ctx.grant = grant
        ctx.cleanups.append(grant.release)
        ctx.queue_s = grant.queued_s


@dataclass(frozen=True, slots=True)
class Pick:
    """The decode endpoint, chosen before P/D (None: none in rotation; `Dispatch` answers 503). A
    request of a service with a prefill pool that pre-empted a stream goes where that stream's blocks
    were freed (`Dispatcher.choose`, `prefer`; `tandem.router.pd.disagg`, "The swap"), but for one
    under a LoRA adapter, which goes where the adapter placement sends it."""

    dispatcher: Dispatcher
    name: str = "pick"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        ctx.decode_members = self.dispatcher.registry.endpoints("decode")
        grant, registry = ctx.grant, self.dispatcher.registry
        swap = grant.stopped_on if grant is not None and ctx.lora_name is None else None
        if swap is not None and not registry.endpoints("prefill"):
            swap = None  # an aggregated pool: the scheduler's choice
        ctx.decode = self.dispatcher.choose("decode", ctx, prefer=swap)
        ctx.swapped_in = swap is not None and ctx.decode is not None and ctx.decode.url == swap


@dataclass(frozen=True, slots=True)
class Disaggregate:
    """Prefill elsewhere when it pays, then decode loads the KV (never fails the request). A step
    started while the request waited (`tandem.router.pd.ahead`) is awaited instead, but for a request
    swapped into a stopped stream's place, decided anew there (`tandem.router.pd.disagg`)."""

    disaggregator: Disaggregator
    name: str = "disaggregate"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        ahead = ctx.ahead  # started as it waited (`pd.ahead`)
        if ahead is not None and ctx.swapped_in:  # decided anew where it swaps in
            ahead.cancel()
            ahead = None
        if ahead is not None:
            pd, ctx.ahead_used = await asyncio.shield(ahead), True
        else:
            pd = await self.disaggregator.run(ctx, decode=ctx.decode, headers=prefill_headers(ctx))
        if ctx.trace is not None:
            ctx.trace.barrier_s = pd.barrier_s
        ctx.decode_body = dict(pd.body) if pd.body is not ctx.body else None
        ctx.prefill_s = pd.prefill_s
        if pd.prefill_endpoint is not None:
            ctx.kv_loaded = True
            ctx.prefill_endpoint = pd.prefill_endpoint.name
            ctx.kv_layout = pd.prefill_endpoint.layout
        ctx.pd_fallback = pd.fallback


@dataclass(frozen=True, slots=True)
class Dispatch:
    """The decode request; usage is always asked for, so output tokens are charged exactly.

    It goes to the endpoint `Pick` chose, but for one case: the prompt was prefilled elsewhere (its KV
    is where any decode engine loads it: the KV pool, or the prefill engine its `kv_transfer_params`
    name) and the decode pool's members changed while the prefill ran. Then the scheduler chooses
    again among the pool as it is now. At a step an engine joins the decode pool while the requests
    that arrived before it are in prefill; bound to the one engine chosen at their arrival, they
    waited behind its queue while the new one stood idle (docs/autoscaler.md). Counted in
    `tandem_router_pd_decode_rechosen_total`.

    With `gate`, a request still without an answer may be recalled from an engine that queues it
    beyond its capacity (`tandem.router.upstream.recall`): it gives its grant back, waits for its
    tenant's turn again (`AdmissionGate.resume`) and is sent again under an id of its own. A
    request that took its slot by pre-emption, disaggregated or swapped into the stopped stream's
    place (`tandem.router.pd.disagg`), makes room on the decode engine it is sent to
    (`Recalls.make_room`: other tenants' requests there without an answer are recalled while the
    engine has more open than it runs). Requests whose KV was loaded from a prefill
    elsewhere are recalled only to make such room, and are placed again (chosen anew, retried) only
    on engines of the prefill's KV layout (`tandem.router.pd.disagg`, pairing)."""

    dispatcher: Dispatcher
    gate: AdmissionGate | None = None
    name: str = "dispatch"

    async def __call__(self, ctx: RequestContext, exchange: Exchange, /) -> None:
        first = ctx.decode
        if (
            ctx.kv_loaded
            and first is not None
            and self.dispatcher.registry.endpoints("decode") != ctx.decode_members
        ):
            first, ctx.decode_rechosen = None, True
            self.dispatcher.metrics.pd_decode_rechosen.inc()
        pairs_with = self._layout(ctx)
        body, ctx.strip_usage = request_usage(ctx.decode_body if ctx.decode_body is not None else ctx.body)
        call = UpstreamCall(
            path=ctx.route.value,
            body=orjson.dumps(body),
            headers={"x-request-id": ctx.upstream_id, **ctx.trace_headers("decode")},
            stream=ctx.stream,
        )
        recallable = ctx.tenant if self.gate is not None and ctx.grant is not None else None
        recalls = 0
        ctx.dispatched_at = ctx.clock()
        while True:
            try:
                attempt: Attempt = await self.dispatcher.open(
                    "decode",
                    request=ctx,
                    call=call,
                    first=first,
                    recallable=recallable,
                    pairs_with=pairs_with,
                    room_for=self._room_for(ctx),
                )
                break
            except Recalled as recalled:
                recalls += 1
                first = None
                headers = {"x-request-id": f"{ctx.upstream_id}-r{recalls}", **ctx.trace_headers("decode")}
                call = replace(call, headers=headers)
                await self._wait_again(ctx, recalled)
        ctx.attempt = attempt
        ctx.cleanups.append(attempt.finish)
        ctx.decode_endpoint = attempt.endpoint.name
        ctx.retries = attempt.retries

    @staticmethod
    def _room_for(ctx: RequestContext) -> str | None:
        """The tenant to make room for on the decode engine (class docstring): a pre-empting request
        disaggregated, or sent where the stream it stopped ran (`Pick`)."""
        if ctx.grant is None or not ctx.grant.preempting:
            return None
        return ctx.tenant if ctx.kv_loaded or ctx.swapped_in else None

    def _layout(self, ctx: RequestContext) -> str | None:
        """The KV layout the decode engine must pair with (None: any); when none of the prefill's is
        left, decode-only under a salt of its own (`tandem.router.pd.disagg`, pairing)."""
        if not ctx.kv_loaded or ctx.kv_layout is None:
            return None
        if self.dispatcher.registry.candidates("decode", pairs_with=ctx.kv_layout):
            return ctx.kv_layout
        extra = {"request_id": ctx.request_id, "kv_layout": ctx.kv_layout}
        log.warning("no decode endpoint of the prefill's KV layout left: decode only", extra=extra)
        self.dispatcher.metrics.pd_fallbacks.labels("layout_mismatch").inc()
        ctx.decode_body = away_from_layout_body(ctx.body, ctx.kv_layout)
        ctx.kv_loaded, ctx.pd_fallback, ctx.prefill_endpoint = False, "layout_mismatch", None
        return None

    async def _wait_again(self, ctx: RequestContext, recalled: Recalled) -> None:
        """The recalled request's grant goes back; a new one comes at its tenant's turn. Recalled to
        make room (`until`), it keeps its grant and goes behind the request it made room for."""
        if recalled.until is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(recalled.until.wait(), ROOM_WAIT_S)
            return
        if self.gate is None or ctx.grant is None:
            raise RuntimeError("recalled without a gate")
        log.info(
            "request recalled from an engine's queue: waits for its turn again",
            extra={"endpoint": recalled.endpoint.name, "tenant": ctx.tenant},
        )
        charged = ctx.grant.prompt_tokens  # charged once: the usage corrects it on the new grant
        ctx.grant.release()
        grant = await self.gate.resume(tenant=ctx.tenant, priority=ctx.priority, prompt_tokens=charged)
        ctx.grant = grant
        ctx.cleanups.append(grant.release)
        ctx.queue_s = (ctx.queue_s or 0.0) + grant.queued_s


def prefill_headers(ctx: RequestContext) -> dict[str, str]:
    """The headers of a request's prefill: its upstream id, its trace's context."""
    return {"x-request-id": ctx.upstream_id, **ctx.trace_headers("prefill")}


def generation_stages(*, identify: Identify, parse: Parse, limit: Limit, service: Pipeline) -> Pipeline:
    """The generation pipeline, in the order of the module docstring: the gateway's own stages, then
    the service's from `Hold` on (`service_stages`)."""
    return Pipeline((identify, parse, limit, *service.stages))


def service_stages(
    *,
    hold: Hold,
    admit: Admit,
    dispatcher: Dispatcher,
    disaggregator: Disaggregator,
    relay_stage: Relay,
) -> Pipeline:
    """A service's stages, from `Hold` on (a gateway of many services runs them after routing,
    `tandem.router.pipeline.route`)."""
    return Pipeline(
        (
            hold,
            admit,
            Pick(dispatcher),
            Disaggregate(disaggregator),
            Dispatch(dispatcher, gate=admit.gate if dispatcher.recalls is not None else None),
            relay_stage,
        )
    )


ROUTES: Mapping[str, Route] = {route.value: route for route in Route}
