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

from tandem.core.gateway import GatewayFile, GatewayService, name_conflicts
from tandem.core.modeltokens import PromptEncoder
from tandem.core.routerconfig import RouterConfig
from tandem.core.tracing import settings_from_env
from tandem.kvpool.client import PASSWORD_ENV, POOL_KEY_ENV
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
from tandem.router.compose.startup import engine_clients, load_key_file, model_tokenizer
from tandem.router.config import EffectiveConfig, resolve, served_names
from tandem.router.discovery.sources import Discovery, discovery_for
from tandem.router.errors import ConfigurationError
from tandem.router.http.server import Gateway, GatewayApp
from tandem.router.http.side import ManyModels, Operations, ServedModel, side_app
from tandem.router.http.tracing import GatewayTracer
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.observe.models import ModelsCollector, NameMetrics
from tandem.router.pipeline.route import Route, Serve, ServiceRoute
from tandem.router.pipeline.stages import Identify, Limit, Pipeline, service_stages
from tandem.router.request.adapters import Change, ServiceAdapters
from tandem.router.request.names import ModelNames
from tandem.router.settings import RouterSettings
from tandem.router.upstream.client import HTTPUpstream
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import ScopedBus, WorkerBus

T = TypeVar("T")
log = logging.getLogger("tandem.router")


def service_configs(file: GatewayFile, *, api_keys_file: str | None) -> list[RouterConfig]:
    """Each service's router config with the gateway's settings in place of its own (module
    docstring), and the gateway's API key file."""
    gateway = file.spec
    out = []
    for service in file.services:
        config = service.config
        router = config.spec.router.model_copy(
            update={
                "auth": gateway.auth,
                "tenants": gateway.tenants,
                "rate_limits": gateway.rate_limits,
                "max_queue": gateway.max_queue,
                "replicas": gateway.replicas,
                "workers": gateway.workers,
            }
        )
        spec = config.spec.model_copy(update={"router": router})
        out.append(config.model_copy(update={"spec": spec, "api_keys_file": api_keys_file}))
    return out


def service_environ(environ: Mapping[str, str], service: GatewayService) -> dict[str, str]:
    """The environment one service's configuration is resolved in: its own pool key and Redis
    password from the variables its entry names (`poolKeyEnv`, `kvPoolPasswordEnv`), in place of
    the single-service ones; an entry that names none keeps those."""
    out = dict(environ)
    for base, named in ((POOL_KEY_ENV, service.pool_key_env), (PASSWORD_ENV, service.kv_pool_password_env)):
        if named is not None:
            out[base] = environ.get(named, "")
    return out


def service_settings(
    settings: RouterSettings, environ: Mapping[str, str], service: GatewayService
) -> RouterSettings:
    """`settings` with the key this service's engines require, from the variable its entry names
    (`engineApiKeyEnv`); an entry that names none keeps the process's (`TANDEM_ENGINE_API_KEY`)."""
    if service.engine_api_key_env is None:
        return settings
    proxy = settings.proxy.model_copy(
        update={"engine_api_key": environ.get(service.engine_api_key_env) or None}
    )
    return settings.model_copy(update={"proxy": proxy})


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
        model = config.spec.model.public_name
        routes[model] = ServiceRoute(
            name=config.service,
            model=model,
            encoder=encoder,
            context=part.context,
            scopes=cache_scopes(config.spec.router, settings.access),
            log_prompts=config.log_prompts,
            stages=service_stages(
                hold=part.hold,
                admit=part.admit,
                dispatcher=part.dispatcher,
                disaggregator=part.disaggregator,
                relay_stage=part.relay,
            ),
            metrics=metrics,
            lmcache_engines=config.lmcache_engines,
        )
    served = {c.service: c.spec.model.public_name for c in configs}
    adapters = {name: p.config.spec.model.public_name for p in parts for name in p.adapters.ordered}
    tokenizing = asyncio.Semaphore(1)
    model_names = ModelNames(
        routes, {a: [(served[s], w) for s, w in t] for a, t in aliases.items()}, adapters
    )
    for part in parts:
        part.adapters.listeners.append(following(model_names, routes[part.config.spec.model.public_name]))
        part.adapters.listeners.append(retrying(members, part.adapters))
    route = Route(
        model_names,
        unknown=names.unknown,
        aliased=lambda alias, service: names.aliased(alias, service.name),
        tokenizing=tokenizing,
    )
    pipeline = Pipeline(
        (
            Identify(access.tenants, first.default_slo, access.priorities),
            gateway_parse(first, accepted=None, scopes=None, context=None, log_prompts=False),
            route,
            Limit(access),
            Serve(),
        )
    )
    exposed = CollectorRegistry(auto_describe=False)
    exposed.register(
        ModelsCollector(prometheus, [(p.config.spec.model.public_name, p.prometheus) for p in parts])
    )
    if isinstance(bus, WorkerBus):
        bus.answer_metrics(lambda: generate_latest(exposed))
    background: list[Service] = [bus, loop_lag]
    if key_file is not None:
        background.append(key_file)
    for part in parts:
        background += part.services
    many = ManyModels(
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
    configs = [
        resolve(config, service_settings(settings, env, entry), environ=service_environ(env, entry))
        for entry, config in zip(file.services, service_configs(file, api_keys_file=keys), strict=True)
    ]
    # The file checked its declared names; a catalog's (`adapterNames`) are first seen here.
    conflicts = name_conflicts(
        {c.service: (c.spec.model.public_name, *c.adapters) for c in configs}, file.spec.aliases
    )
    if conflicts:
        raise ConfigurationError("; ".join(conflicts))
    key_file = load_key_file(configs[0], auth_field="spec.auth.enabled", source="the gateway file")
    fields = [f"services[{c.service}].config.tokenizerPath" for c in configs]
    encoders = [PromptEncoder(model_tokenizer(c, field=f)) for c, f in zip(configs, fields, strict=True)]
    found = {
        c.service: (discoveries or {}).get(c.service)
        or discovery_for(c.discovery, environ=env, kube_api_server=settings.discovery.kube_api_server)
        for c in configs
    }
    aliases = {a.name: [(t.service, t.weight) for t in a.targets] for a in file.spec.aliases}
    tracing = settings_from_env(file.spec.tracing, env)
    tracer = (
        GatewayTracer(tracing, service=f"{file.gateway}-gateway", clock=clock,
                      log_prompts=any(c.log_prompts for c in configs))
        if tracing is not None
        else None
    )  # fmt: skip

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
