"""One gateway process in front of many InferenceServices (`tandem.core.gateway.GatewayFile`).

What is built once, for the gateway: the HTTP shell and the side routes, identity (API keys or the
tenant header), the tenants' bands and rate limits, the body limits and the reading budget, the
names (`tandem.router.request.names`), the upstream connections, the bus to sibling workers, the
process's metrics. What is built per service, exactly as a gateway of one service builds it
(`compose_service`): its engines' registry and discovery, the metrics collector, the scheduler, the
admission gate (its own fair queue over its own decode capacity), the cold-start hold, P/D, the
relay, its tokenizer and context limit, its cache isolation mode, and its metrics in a registry of
its own, exposed with a `model` label (`tandem.router.observe.models`).

Gateway-level settings come from the gateway spec and replace the services' own: `auth`, `tenants`
(weights, bands, rate limits, cache groups), `rateLimits`, `maxQueue` (each service's queue bound),
`replicas` and `workers` (which divide every engine's capacity). The tenant header is the first
service's `spec.router.fairness.tenantHeader`. The pipeline:

    identify → parse → route → limit → serve: [the service's hold → … → relay]

What the file configures is resolved first (`manyconfig`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.registry import Collector

from tandem.core.gateway import GatewayFile
from tandem.core.modeltokens import PromptEncoder
from tandem.router.admission.access import Access
from tandem.router.compose import (
    Service,
    ServiceParts,
    cache_scopes,
    compose_service,
    gateway_access,
    gateway_parse,
    new_bus,
    new_registry,
    scales_from_zero,
)
from tandem.router.compose.manyconfig import gateway_file_tracer, resolve_services, service_discoveries
from tandem.router.compose.startup import engine_clients, load_key_file, model_tokenizer
from tandem.router.config import EffectiveConfig, served_names
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.discovery.sources import Discovery
from tandem.router.http.server import Gateway, GatewayApp
from tandem.router.http.side import ManyModels, Operations, ServedModel, side_app
from tandem.router.http.tracing import GatewayTracer
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.observe.models import ModelsCollector, NameMetrics
from tandem.router.pipeline.route import Route, Serve, ServiceRoute
from tandem.router.pipeline.stages import Identify, Limit, Pipeline
from tandem.router.request.adapters import Change, ServiceAdapters
from tandem.router.request.names import ModelNames
from tandem.router.settings import AccessSettings, RouterSettings
from tandem.router.upstream.client import HTTPUpstream
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import Bus, ScopedBus, WorkerBus

T = TypeVar("T")
log = logging.getLogger("tandem.router")


@dataclass(frozen=True, slots=True, kw_only=True)
class ManyComponents:
    """What one gateway process in front of many services holds while it serves."""

    gateway: Gateway
    operations: Operations
    #: The page `/metrics` shows: the gateway's registry and every service's, labelled `model`.
    exposed: CollectorRegistry
    #: The gateway's own registry (where extra gateway-level collectors go).
    prometheus: CollectorRegistry
    parts: Sequence[ServiceParts]
    #: Background work, in start order (stopped in reverse).
    services: Sequence[Service]


def compose_many(
    configs: Sequence[EffectiveConfig],
    *,
    aliases: Mapping[str, Sequence[tuple[str, int]]],
    wire: Wire,
    scrapes: httpx.AsyncClient,
    encoders: Sequence[PromptEncoder],
    key_file: KeyFile | None,
    clock: Callable[[], float],
    tracer: GatewayTracer | None = None,
) -> ManyComponents:
    """Build the gateway's parts and each service's (module docstring); `aliases`: alias →
    (service name, weight) in order. Pure construction, as `compose`."""
    first = configs[0]
    settings = first.settings
    prometheus = CollectorRegistry()
    ProcessCollector(registry=prometheus)
    registries = [new_registry(c, clock=clock) for c in configs]
    # Requests that never reached a service (401, 404, 429 of the rate limits), and the side routes.
    gateway_metrics = RouterMetrics(prometheus, new_registry(first, clock=clock))
    loop_lag = LoopLagMonitor(prometheus, busy=lambda: any(r.busy() for r in registries))
    upstream = HTTPUpstream(wire, settings.proxy)
    bus = new_bus(first)
    access = gateway_access(first, key_file=key_file, prometheus=prometheus, clock=clock, bus=bus)
    names = NameMetrics(prometheus)
    parts, routes, members = _compose_services(
        configs,
        registries=registries,
        encoders=encoders,
        aliases=aliases,
        wire=wire,
        scrapes=scrapes,
        clock=clock,
        bus=bus,
        loop_lag=loop_lag,
        access=access,
    )
    served = {c.service: c.spec.model.public_name for c in configs}
    route = _route(parts, routes=routes, served=served, aliases=aliases, names=names, members=members)
    pipeline = _pipeline(first, access=access, route=route)
    exposed = _exposed(prometheus, parts=parts, bus=bus)
    background = _background(bus, loop_lag, key_file=key_file, parts=parts)
    many = _many_models(parts, served=served, aliases=aliases)
    return ManyComponents(
        gateway=Gateway(pipeline=pipeline, encoder=None, metrics=gateway_metrics, clock=clock, tracer=tracer),
        operations=Operations(
            registry=registries[0],
            upstream=upstream,
            prometheus=exposed,
            metrics=gateway_metrics,
            tenants=access.tenants,
            bus=bus,
            model=first.spec.model,
            started_unix=int(time.time()),
            models_timeout_s=settings.proxy.models_timeout_seconds,
            many=many,
        ),
        exposed=exposed,
        prometheus=prometheus,
        parts=tuple(parts),
        services=tuple(background),
    )


def _compose_services(
    configs: Sequence[EffectiveConfig],
    *,
    registries: Sequence[EndpointRegistry],
    encoders: Sequence[PromptEncoder],
    aliases: Mapping[str, Sequence[tuple[str, int]]],
    wire: Wire,
    scrapes: httpx.AsyncClient,
    clock: Callable[[], float],
    bus: Bus,
    loop_lag: LoopLagMonitor,
    access: Access,
) -> tuple[list[ServiceParts], dict[str, ServiceRoute], list[ServiceAdapters]]:
    """Each service's parts, built as a gateway of one service builds them (`compose_service`) with
    its metrics in a registry of its own; the route to each by its served name; and the services'
    adapter names (`owned_adapters`: each refuses a name another service, model or alias holds)."""
    access_settings = configs[0].settings.access
    parts: list[ServiceParts] = []
    routes: dict[str, ServiceRoute] = {}
    owners = name_owners(configs, aliases)
    members: list[ServiceAdapters] = []
    for config, registry, encoder in zip(configs, registries, encoders, strict=True):
        own = CollectorRegistry()
        metrics = RouterMetrics(own, registry)
        # Its own upstream: the same wire, with the key its engines require (`service_settings`).
        part = compose_service(
            config,
            registry=registry,
            prometheus=own,
            metrics=metrics,
            upstream=HTTPUpstream(wire, config.settings.proxy),
            wire=wire,
            scrapes=scrapes,
            encoder=encoder,
            clock=clock,
            bus=ScopedBus(bus, config.service),
            loop_lag=loop_lag,
            output_charge=access.output_charge,
            adapters=owned_adapters(config, owners, members),
        )
        parts.append(part)
        routes[config.spec.model.public_name] = _service_route(part, encoder=encoder, access=access_settings)
    return parts, routes, members


def _service_route(part: ServiceParts, *, encoder: PromptEncoder, access: AccessSettings) -> ServiceRoute:
    """One service as the gateway routes to it: its stages from `Hold` on, its tenants' cache scopes
    (`access`: the gateway's settings)."""
    config = part.config
    return ServiceRoute(
        name=config.service,
        model=config.spec.model.public_name,
        encoder=encoder,
        context=part.context,
        scopes=cache_scopes(config.spec.router, access),
        log_prompts=config.log_prompts,
        stages=part.stages(),
        metrics=part.metrics,
        lmcache_engines=config.lmcache_engines,
    )


def _route(
    parts: Sequence[ServiceParts],
    *,
    routes: dict[str, ServiceRoute],
    served: Mapping[str, str],
    aliases: Mapping[str, Sequence[tuple[str, int]]],
    names: NameMetrics,
    members: Sequence[ServiceAdapters],
) -> Route:
    """The route stage over the gateway's name map: each service's served name (`served`: service →
    served name) and adapters, and the aliases; the map follows each service's adapter names
    (`following`), and a service that drops names lets the others retry theirs (`retrying`)."""
    adapters = {name: p.config.spec.model.public_name for p in parts for name in p.adapters.ordered}
    tokenizing = asyncio.Semaphore(1)
    model_names = ModelNames(
        routes, {a: [(served[s], w) for s, w in t] for a, t in aliases.items()}, adapters
    )
    for part in parts:
        part.adapters.listeners.append(following(model_names, routes[part.config.spec.model.public_name]))
        part.adapters.listeners.append(retrying(members, part.adapters))
    return Route(
        model_names,
        unknown=names.unknown,
        aliased=lambda alias, service: names.aliased(alias, service.name),
        tokenizing=tokenizing,
    )


def _exposed(prometheus: CollectorRegistry, *, parts: Sequence[ServiceParts], bus: Bus) -> CollectorRegistry:
    """The page `/metrics` shows: the gateway's registry and every service's, labelled `model`; the
    sibling workers read it over the bus."""
    exposed = CollectorRegistry(auto_describe=False)
    exposed.register(
        ModelsCollector(prometheus, [(p.config.spec.model.public_name, p.prometheus) for p in parts])
    )
    if isinstance(bus, WorkerBus):
        bus.answer_metrics(lambda: generate_latest(exposed))
    return exposed


def _pipeline(first: EffectiveConfig, *, access: Access, route: Route) -> Pipeline:
    """The gateway's stages: identify → parse → route → limit → serve (module docstring), with the
    first service's identity and body settings (the gateway's own: `service_configs`)."""
    return Pipeline(
        (
            Identify(access.tenants, first.default_slo, access.priorities),
            gateway_parse(first, accepted=None, scopes=None, context=None, log_prompts=False),
            route,
            Limit(access),
            Serve(),
        )
    )


def _background(
    bus: Bus, loop_lag: LoopLagMonitor, *, key_file: KeyFile | None, parts: Sequence[ServiceParts]
) -> list[Service]:
    """The gateway's background work in start order: the bus, the loop-lag monitor, the key file
    (it follows Secret updates), then each service's in the services' order."""
    background: list[Service] = [bus, loop_lag]
    if key_file is not None:
        background.append(key_file)
    for part in parts:
        background += part.services
    return background


def _many_models(
    parts: Sequence[ServiceParts],
    *,
    served: Mapping[str, str],
    aliases: Mapping[str, Sequence[tuple[str, int]]],
) -> ManyModels:
    """The services as `/v1/models` and `/health` see them, and each alias's targets' served names
    (`served`: service → served name)."""
    return ManyModels(
        services=[
            ServedModel(
                model=p.config.spec.model,
                adapters=p.adapters,
                registry=p.registry,
                upstream=p.upstream,
                scales_from_zero=scales_from_zero(p.config),
                warming=p.warming,
            )
            for p in parts
        ],
        aliases={a: [served[s] for s, _ in t] for a, t in aliases.items()},
    )


def name_owners(
    configs: Sequence[EffectiveConfig], aliases: Mapping[str, Sequence[tuple[str, int]]]
) -> dict[str, str]:
    """Every name the gateway serves → what it names (`owned_adapters` keeps it current): each
    service's model names, its fixed adapters, and the aliases."""
    owners = {alias: "an alias" for alias in aliases}
    for config in configs:
        model = config.spec.model
        owners |= dict.fromkeys((model.public_name, model.name), f"service {config.service}'s model")
        owners |= dict.fromkeys(config.adapters, f"service {config.service}'s adapter")
    return owners


def owned_adapters(
    config: EffectiveConfig, owners: dict[str, str], members: list[ServiceAdapters]
) -> ServiceAdapters:
    """`config`'s adapter names, refusing a listed name another service, model or alias holds in
    `owners`, and keeping `owners` current as its names change; it joins `members`, the services'
    names (`retrying`)."""
    mine = f"service {config.service}'s adapter"

    def refuse(name: str) -> str | None:
        owner = owners.get(name)
        return None if owner is None or owner == mine else f"{name!r} is already {owner}"

    def changed(change: Change) -> None:
        for name in change.removed:
            if owners.get(name) == mine:
                del owners[name]
        owners.update(dict.fromkeys(change.added, mine))

    adapters = ServiceAdapters(served_names(config.spec.model), config.adapters, refuse=refuse)
    adapters.listeners.append(changed)
    members.append(adapters)
    return adapters


def retrying(members: Sequence[ServiceAdapters], adapters: ServiceAdapters) -> Callable[[Change], None]:
    """A `ServiceAdapters` listener, the last of `adapters`' (after the name map has dropped its
    names): when it drops names, the other services try their refused names again."""

    def changed(change: Change) -> None:
        if change.removed:
            for other in members:
                if other is not adapters:
                    other.retry()

    return changed


def following(names: ModelNames[T], route: T) -> Callable[[Change], None]:
    """A `ServiceAdapters` listener keeping the gateway's name map equal to the service's names."""

    def changed(change: Change) -> None:
        for name in change.removed:
            names.drop_adapter(name)
        for name in change.added:
            names.add_adapter(name, route)

    return changed


def create_many_app(
    file: GatewayFile,
    *,
    settings: RouterSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    discoveries: Mapping[str, Discovery] | None = None,
    environ: Mapping[str, str] | None = None,
    api_keys_file: str | None = None,
    collectors: Sequence[Collector] = (),
    own_process: bool = False,
) -> GatewayApp:
    """The gateway in front of `file`'s services (`tandem.router.app.create_app` for a gateway
    file). `discoveries`: per service name, replaces the one its config names (tests).
    `api_keys_file`: the gateway's key table (else the file's `apiKeysFile`). `collectors`:
    registered on the gateway's registry (the HTTP server's connections). Raises
    `ConfigurationError` for a file this build cannot serve."""
    env = os.environ if environ is None else environ
    keys = api_keys_file or file.api_keys_file
    settings = settings or RouterSettings()
    configs = resolve_services(file, settings=settings, environ=env, api_keys_file=keys)
    key_file = load_key_file(configs[0], auth_field="spec.auth.enabled", source="the gateway file")
    fields = [f"services[{c.service}].config.tokenizerPath" for c in configs]
    encoders = [PromptEncoder(model_tokenizer(c, field=f)) for c, f in zip(configs, fields, strict=True)]
    found = service_discoveries(configs, given=discoveries, environ=env, settings=settings)
    aliases = {a.name: [(t.service, t.weight) for t in a.targets] for a in file.spec.aliases}
    tracer = gateway_file_tracer(file, configs, environ=env, clock=clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            wire, scrapes = await engine_clients(stack, settings.proxy)
            parts = compose_many(
                configs,
                aliases=aliases,
                wire=wire,
                scrapes=scrapes,
                encoders=encoders,
                key_file=key_file,
                clock=clock,
                tracer=tracer,
            )
            if tracer is not None:
                stack.callback(tracer.shutdown)
            await _start(stack, parts, collectors=collectors, found=found)
            log.info(
                "gateway ready",
                extra={
                    "gateway": file.gateway,
                    "models": [c.spec.model.public_name for c in configs],
                    "aliases": sorted(aliases),
                    "services": [c.describe() for c in configs],
                },
            )
            if own_process:
                gc.collect()
                gc.freeze()
            yield {"gateway": parts.gateway, "operations": parts.operations}

    served = frozenset({c.spec.model.public_name for c in configs} | set(aliases))
    served |= {name for c in configs for name in c.adapters}
    return GatewayApp(side_app(lifespan=lifespan, served=served, auth=key_file is not None, clock=clock))


async def _start(
    stack: AsyncExitStack,
    parts: ManyComponents,
    *,
    collectors: Sequence[Collector],
    found: Mapping[str, Discovery],
) -> None:
    """Register `collectors` on the gateway's registry, start each service's discovery (`found`: by
    service name), then the background work in order; `stack` stops each in reverse, and closes
    the services' KV pools."""
    for collector in collectors:
        parts.prometheus.register(collector)
    for part in parts.parts:
        if part.kv_pool is not None:
            stack.push_async_callback(part.kv_pool.aclose)
        discovery = found[part.config.service]
        await discovery.start(part.registry)
        stack.push_async_callback(discovery.stop)
    for service in parts.services:
        await service.start()
        stack.push_async_callback(service.stop)
