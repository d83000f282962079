"""The composition root's construction: every component of one gateway process, built once from the
`EffectiveConfig` and passed down. Nothing is mutated after it is built, nothing lives at module
level, and the only things that run in the background are listed in `Components.services` (started
and stopped in order by the app's lifespan, `tandem.router.app`).

`compose` builds a gateway of one service: what belongs to the gateway here, what belongs to the
service in `compose_service` (`service`), from its scheduling side (`routing`) and its admission side
(`admission`). `many` builds a gateway in front of several services from the same parts.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from tandem.core.modeltokens import PromptEncoder
from tandem.core.spec import RouterSpec
from tandem.kvpool.index import KVPoolIndex
from tandem.router.admission.access import Access, build_access
from tandem.router.admission.gate import AdmissionGate
from tandem.router.admission.policy import TTFTPredictor
from tandem.router.compose.admission import build_gate, build_hold, engine_capacity, scales_from_zero
from tandem.router.compose.routing import PREFIX_POLICIES, Routing, build_routing, prefix_source
from tandem.router.compose.service import ContextLearner, Service, ServiceParts, compose_service
from tandem.router.config import EffectiveConfig
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.http.server import Gateway
from tandem.router.http.side import Operations
from tandem.router.http.tracing import gateway_tracer
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pipeline.stages import Identify, Limit, Parse, Pipeline, generation_stages
from tandem.router.request.context_limit import ContextLimit
from tandem.router.request.limits import BodyLimits, ReadingBudget
from tandem.router.settings import AccessSettings
from tandem.router.upstream.client import HTTPUpstream
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import Bus, SoloBus, WorkerBus
from tandem.router.workers.share import LIMITS, SharedLimits, apply_limits

__all__ = [
    "PREFIX_POLICIES",
    "Components",
    "ContextLearner",
    "Routing",
    "Service",
    "ServiceParts",
    "build_gate",
    "build_hold",
    "build_routing",
    "cache_scopes",
    "compose",
    "compose_service",
    "engine_capacity",
    "gateway_access",
    "gateway_parse",
    "new_bus",
    "new_registry",
    "prefix_source",
    "scales_from_zero",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Components:
    """What one gateway process holds while it serves."""

    config: EffectiveConfig
    registry: EndpointRegistry
    prometheus: CollectorRegistry
    metrics: RouterMetrics
    upstream: HTTPUpstream
    dispatcher: Dispatcher
    admission: AdmissionGate
    access: Access
    routing: Routing
    kv_pool: KVPoolIndex | None
    loop_lag: LoopLagMonitor
    gateway: Gateway
    operations: Operations
    #: Background work, in start order (stopped in reverse).
    services: Sequence[Service]


def compose(
    config: EffectiveConfig,
    *,
    wire: Wire,
    scrapes: httpx.AsyncClient,
    encoder: PromptEncoder,
    key_file: KeyFile | None,
    clock: Callable[[], float],
    predictor: TTFTPredictor | None = None,
    prefix: PrefixSource | None = None,
) -> Components:
    """Build every component (pure construction: nothing starts, nothing connects): what belongs to
    the gateway (identity, rate limits, body limits, the HTTP shell) and what belongs to the service
    (`compose_service`), in one pipeline."""
    settings = config.settings
    registry = new_registry(config, clock=clock)
    prometheus = CollectorRegistry()
    # The gateway process's own CPU, memory and file descriptors (process_*): its cost per request.
    ProcessCollector(registry=prometheus)
    metrics = RouterMetrics(prometheus, registry)
    loop_lag = LoopLagMonitor(prometheus, busy=registry.busy)
    upstream = HTTPUpstream(wire, settings.proxy)
    bus = new_bus(config)
    access = gateway_access(config, key_file=key_file, prometheus=prometheus, clock=clock, bus=bus)
    service = compose_service(
        config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        wire=wire,
        scrapes=scrapes,
        encoder=encoder,
        clock=clock,
        bus=bus,
        loop_lag=loop_lag,
        output_charge=access.output_charge,
        predictor=predictor,
        prefix=prefix,
    )
    pipeline = _pipeline(config, access=access, service=service)
    if isinstance(bus, WorkerBus):
        bus.answer_metrics(lambda: generate_latest(prometheus))
    services: list[Service] = [bus, loop_lag]
    if key_file is not None:
        services.append(key_file)  # follows Secret updates
    services += service.services
    return Components(
        config=config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        dispatcher=service.dispatcher,
        admission=service.admit.gate,
        access=access,
        routing=service.routing,
        kv_pool=service.kv_pool,
        loop_lag=loop_lag,
        gateway=_gateway(config, pipeline=pipeline, encoder=encoder, metrics=metrics, clock=clock),
        operations=_operations(service, access=access, bus=bus),
        services=tuple(services),
    )


def _pipeline(config: EffectiveConfig, *, access: Access, service: ServiceParts) -> Pipeline:
    """A request's way through a gateway of one service: the gateway's identity, body parsing (the
    service's model, adapters, cache scopes and context limit) and rate limits, then the
    service's stages from `Hold` on."""
    return generation_stages(
        identify=Identify(access.tenants, config.default_slo, access.priorities),
        parse=gateway_parse(
            config,
            accepted=service.adapters.accepted,
            scopes=cache_scopes(config.spec.router, config.settings.access),
            context=service.context,
            adapters=service.adapters.names,
        ),
        limit=Limit(access),
        service=service.stages(),
    )


def _gateway(
    config: EffectiveConfig,
    *,
    pipeline: Pipeline,
    encoder: PromptEncoder,
    metrics: RouterMetrics,
    clock: Callable[[], float],
) -> Gateway:
    """The HTTP shell around `pipeline`, with the tracer `config` asks for."""
    return Gateway(
        pipeline=pipeline,
        encoder=encoder,
        metrics=metrics,
        clock=clock,
        tracer=gateway_tracer(config, clock=clock),
    )


def _operations(service: ServiceParts, *, access: Access, bus: Bus) -> Operations:
    """What the side routes of a gateway of one service read: that service's engines, upstream,
    metrics (the gateway's registry is the service's), model and adapters; the gateway's tenants."""
    config = service.config
    return Operations(
        registry=service.registry,
        upstream=service.upstream,
        prometheus=service.prometheus,
        metrics=service.metrics,
        tenants=access.tenants,
        bus=bus,
        model=config.spec.model,
        started_unix=int(time.time()),
        models_timeout_s=config.settings.proxy.models_timeout_seconds,
        scales_from_zero=scales_from_zero(config),
        adapters=service.adapters,
        warming=service.warming,
    )


def new_registry(config: EffectiveConfig, *, clock: Callable[[], float]) -> EndpointRegistry:
    """A service's engines, as discovery and the metrics collector keep them."""
    settings = config.settings
    return EndpointRegistry(
        failure_threshold=settings.rotation.failure_threshold,
        cooldown_seconds=settings.rotation.cooldown_seconds,
        clock=clock,
        stale_after=settings.collector.stale_after,
        unreachable_after=settings.collector.unreachable_after,
    )


def new_bus(config: EffectiveConfig) -> Bus:
    """The bus to this process's sibling workers (none with one worker)."""
    workers = config.settings.workers
    if workers.count <= 1:
        return SoloBus()
    return WorkerBus(
        key=workers.key, index=workers.index, count=workers.count, token=workers.token.get_secret_value()
    )


def gateway_access(
    config: EffectiveConfig,
    *,
    key_file: KeyFile | None,
    prometheus: CollectorRegistry,
    clock: Callable[[], float],
    bus: Bus,
) -> Access:
    """Who is asking and how much they may send: API keys or the tenant header, bands, rate limits
    (one limit across the workers, not one per worker)."""
    access = build_access(
        router=config.spec.router,
        settings=config.settings,
        key_file=key_file,
        prometheus=prometheus,
        clock=clock,
    )
    if isinstance(bus, WorkerBus):
        access.limiter.on_take = SharedLimits(bus).took
        bus.on(LIMITS, apply_limits(access.limiter.absorb))
    return access


def gateway_parse(
    config: EffectiveConfig,
    *,
    accepted: AbstractSet[str] | None,
    scopes: CacheScopes | None,
    context: ContextLimit | None,
    log_prompts: bool | None = None,
    adapters: AbstractSet[str] = frozenset(),
) -> Parse:
    """The body's reading and parsing, with the gateway's limits on bodies (`accepted` None: the
    model is resolved after it, `tandem.router.pipeline.route`); a `model` among the service's
    `adapters` (live sets: `ServiceAdapters`) roots the prompt's keys in the adapter."""
    access = config.settings.access
    return Parse(
        accepted,
        access.max_request_bytes,
        config.log_prompts if log_prompts is None else log_prompts,
        limits=BodyLimits.of(access),
        budget=ReadingBudget(access.max_reading_bytes),
        body_seconds=access.body_seconds,
        scopes=scopes,
        context=context,
        tokenizing=asyncio.Semaphore(1),
        adapters=adapters if accepted is not None else frozenset(),
        lmcache_engines=config.lmcache_engines,
    )


def cache_scopes(router: RouterSpec, access: AccessSettings) -> CacheScopes | None:
    """The tenants' cache salts (`tandem.router.identity.cachescope`); None with isolation off. A
    gateway given no key (`TANDEM_CACHE_KEY`) draws one for its life: its tenants stay apart, but
    another gateway before the same engines hits none of its cache entries."""
    if router.cache_isolation == "off":
        return None
    key = access.cache_key.get_secret_value().encode() or secrets.token_bytes(32)
    groups = {t.name: t.cache_group for t in router.tenants if t.cache_group is not None}
    return CacheScopes(key=key, mode=router.cache_isolation, groups=groups)
