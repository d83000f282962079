"""One service's components in a gateway (`compose_service`), exactly what a gateway of one service
builds for it, whether it is the gateway's only service or one of many (`tandem.router.compose.many`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.adapters import AdapterError, PvcSource, parse_source
from tandem.core.modeltokens import PromptEncoder
from tandem.kvpool.index import KVPoolIndex, connect
from tandem.router.admission.policy import TTFTPredictor
from tandem.router.compose.admission import build_gate, build_hold, engine_capacity
from tandem.router.compose.routing import Routing, build_routing
from tandem.router.config import EffectiveConfig, served_names
from tandem.router.discovery.capacity import (
    EngineCapacity,
)
from tandem.router.discovery.collector import MetricsCollector, ScrapeOutcome
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.http.catalog import engine_models
from tandem.router.observe.arrivals import Arrivals
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import PoolKeysCollector, RouterMetrics
from tandem.router.pd.disagg import Disaggregator, Prefiller
from tandem.router.pd.hold import PrefillHold
from tandem.router.pd.keycheck import STATES, PoolKeysCheck
from tandem.router.pd.prefetch import DecodeAdapterLoad
from tandem.router.pipeline.resume import Resume
from tandem.router.pipeline.stages import Admit, Hold, Relay
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.request.context_limit import ContextLimit
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.adapterwarm import warm_room
from tandem.router.types import Endpoint, Pool
from tandem.router.upstream.adaptercopy import AdapterCopier, AdapterWarmer
from tandem.router.upstream.adapters import AdapterJanitor, AdapterNamesCollector, AdapterNamesFile
from tandem.router.upstream.client import HTTPUpstream, metrics_fetch
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.recall import Recalls
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import Bus

log = logging.getLogger(__name__)


class Service(Protocol):
    """A component with background work: started after discovery filled the registry."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceParts:
    """What one InferenceService holds in a gateway: its engines and their metrics, its scheduler,
    its fair queue over its own decode capacity, its P/D, and the stages from `Hold` on."""

    config: EffectiveConfig
    registry: EndpointRegistry
    prometheus: CollectorRegistry
    metrics: RouterMetrics
    upstream: HTTPUpstream
    routing: Routing
    dispatcher: Dispatcher
    disaggregator: Disaggregator
    kv_pool: KVPoolIndex | None
    context: ContextLimit
    hold: Hold
    admit: Admit
    relay: Relay
    #: The adapters it serves now (they follow `config.adapter_names_file`).
    adapters: ServiceAdapters
    #: Why it is not ready yet while its declared adapters load at start-up (`AdapterWarmer.warming`).
    warming: Callable[[], str | None] | None
    #: Background work, in start order (stopped in reverse).
    services: Sequence[Service]


def compose_service(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    metrics: RouterMetrics,
    upstream: HTTPUpstream,
    wire: Wire,
    scrapes: httpx.AsyncClient,
    encoder: PromptEncoder,
    clock: Callable[[], float],
    bus: Bus,
    loop_lag: LoopLagMonitor,
    output_charge: Callable[[str], Callable[[int], None] | None],
    predictor: TTFTPredictor | None = None,
    prefix: PrefixSource | None = None,
    adapters: ServiceAdapters | None = None,
) -> ServiceParts:
    """One service's components (`ServiceParts`), its metrics in `prometheus`; `bus` carries what
    its workers share (a gateway of many services gives each a bus of its own kinds). `adapters`:
    its adapter names, made by a gateway of many services that checks them against the others'
    (default: the service's own). Raises `ConfigurationError` when its names file cannot be read."""
    settings = config.settings
    adapters = adapters or ServiceAdapters(served_names(config.spec.model), config.adapters)
    names_file = (
        AdapterNamesFile(config.adapter_names_file, adapters)
        if config.adapter_names_file is not None
        else None
    )
    names_metrics = AdapterNamesCollector(adapters, names_file)
    if config.lora:
        prometheus.register(names_metrics)
    capacity = engine_capacity(config)
    routing = build_routing(
        config, registry=registry, prometheus=prometheus, scrapes=scrapes, clock=clock, bus=bus
    )
    dispatcher = Dispatcher(
        registry=registry,
        scheduler=routing.scheduler,
        upstream=upstream,
        metrics=metrics,
        retries=settings.proxy.retries,
        observer=routing.state,
        loop_lag=loop_lag,
        # A connect timeout of which the loop lost half or more measured the router (dispatch).
        excusing_lag_s=settings.proxy.connect_timeout_seconds / 2,
        capacity=capacity,
        recalls=Recalls() if settings.admission.recall == "on" else None,
        adapter_hold_s=settings.proxy.adapter_hold_seconds,
    )
    copier = adapter_copier(config, upstream, routing.state.adapter_loads)
    names_metrics.copier = copier
    kv_pool = _kv_pool(config, clock)
    keys = PoolKeysCheck()
    if kv_pool is not None:
        prometheus.register(PoolKeysCollector(lambda: keys.state, STATES))
    hold = None
    if config.spec.disaggregation.late_prefill_binding:
        hold = PrefillHold(
            ahead=routing.state.ahead,
            candidates=lambda: [s.endpoint.url for s in registry.candidates("prefill")],
            clock=clock,
            held_gauge=metrics.pd_prefill_held,
            hold_seconds=metrics.pd_prefill_hold,
        )
        registry.on_members(_waking(hold))
    disaggregator = Disaggregator(
        prefiller=Prefiller(
            dispatcher=dispatcher,
            timeout_s=settings.disaggregation.prefill_timeout_seconds,
            clock=clock,
            hold=hold,
        ),
        mode=config.spec.disaggregation.mode,
        min_uncached_tokens=config.spec.disaggregation.min_uncached_tokens,
        barrier_timeout_s=settings.disaggregation.kv_barrier_timeout_seconds,
        pool=kv_pool,
        prefix=prefix or routing.state.prefix,
        convert=routing.state if config.spec.disaggregation.convertible_decoders else None,
        keys=keys,
        layout_keys=config.kv_layout_in_keys,
        decode_loads=decode_loads(config, routing.state.adapter_loads, copier),
    )
    gate, counters = build_gate(
        config,
        registry=registry,
        prometheus=prometheus,
        predictor=predictor or routing.state,
        clock=clock,
        bus=bus,
        capacity=capacity,
    )
    model = config.spec.model
    context = ContextLimit(
        max_token_chars=encoder.tokenizer.max_token_chars,
        model_names={model.name, model.public_name},
        exact=config.tokenizer_exact,
    )
    relay_stage = Relay(
        output_charge,
        config.log_prompts,
        handover_tokens=settings.admission.handover_tokens,
        resume=Resume(gate, dispatcher) if gate.preemption else None,
        topology_headers=settings.access.topology_headers,
        write_s=settings.proxy.client_write_seconds,
    )
    learner = ContextLearner(context, upstream, timeout_s=settings.proxy.models_timeout_seconds)
    janitor = adapter_janitor(config, upstream, adapters)
    warmer = adapter_warmer(config, registry, adapters, routing.state.adapter_loads, copier)
    collector = MetricsCollector(
        registry=registry,
        fetch=metrics_fetch(wire),
        settings=settings.collector,
        on_scrape=_scraped(routing, dispatcher),
        on_members=_following(routing, capacity, learner, janitor, warmer),
        urgent=lambda: [s.endpoint.url for s in registry.snapshots("decode") if capacity.learning(s)],
    )
    restarts = adapter_restarts(routing.state.adapter_loads, warmer) if config.lora else None
    if restarts is not None:
        registry.on_restart(restarts)
    services: list[Service] = [] if counters is None else [counters]
    services += [routing, collector]  # subscribers follow the collector's rounds
    if names_file is not None:
        services.append(names_file)
    if janitor is not None:
        adapters.listeners.append(janitor.dropped)
        services.append(_Stopping(janitor.stop))
    if copier is not None:
        services.append(_Stopping(copier.stop))
    if warmer is not None:
        adapters.listeners.append(warmer.kick)
        services.append(_Stopping(warmer.stop))
    return ServiceParts(
        config=config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        routing=routing,
        dispatcher=dispatcher,
        disaggregator=disaggregator,
        kv_pool=kv_pool,
        context=context,
        hold=Hold(
            build_hold(config, registry=registry, prometheus=prometheus, clock=clock),
            arrivals=Arrivals(prometheus, exact=config.spec.prefill.autoscaling.enabled),
        ),
        admit=Admit(gate),
        relay=relay_stage,
        adapters=adapters,
        warming=warmer.warming if warmer is not None else None,
        services=tuple(services),
    )


def _kv_pool(config: EffectiveConfig, clock: Callable[[], float]) -> KVPoolIndex | None:
    access = config.kv_pool
    if access is None:
        return None
    client = connect(access.url, timeout_s=access.timeout_s, password=access.password)
    return KVPoolIndex(client, keys=access.keys, alternatives=access.alternatives, clock=clock)


def _scraped(routing: Routing, dispatcher: Dispatcher) -> Callable[[str, ScrapeOutcome], None]:
    """The collector's `on_scrape`: the scrape metrics, then what a good reading recalls."""
    recalls, capacity, registry = dispatcher.recalls, dispatcher.capacity, dispatcher.registry

    def scraped(url: str, outcome: ScrapeOutcome) -> None:
        routing.metrics.scraped(url, outcome)
        if recalls is None or capacity is None or outcome != "ok" or not recalls.pending(url):
            return
        for snapshot in registry.snapshots("decode"):
            if snapshot.endpoint.url == url:
                recalls.check(snapshot, limit=capacity.limit(snapshot))

    return scraped


def adapter_restarts(
    loads: AdapterLoads | None, warmer: AdapterWarmer | None
) -> Callable[[str], None] | None:
    """What an engine's restart (`EndpointRegistry.on_restart`: another start time, counters gone
    backwards) does to adapters: the engine holds none any more, so the placement's record forgets
    them and the warmer may load them again. None without adapter placement."""
    if loads is None:
        return None

    def restarted(url: str) -> None:
        log.info("engine restarted: it holds no adapter any more", extra={"endpoint": url})
        loads.restarted(url)
        if warmer is not None:
            warmer.restarted(url)

    return restarted


def _following(
    routing: Routing,
    capacity: EngineCapacity,
    context: ContextLearner,
    janitor: AdapterJanitor | None,
    warmer: AdapterWarmer | None = None,
) -> Callable[[Collection[str]], Awaitable[None]]:
    """The collector's `on_members`: what is known per engine follows discovery's engines."""

    async def follow(urls: Collection[str]) -> None:
        capacity.forget(set(urls))
        context.follow(urls)
        if janitor is not None:
            janitor.follow(urls)
        await routing.follow(urls)
        if warmer is not None:
            warmer.kick()

    return follow


def adapter_janitor(
    config: EffectiveConfig, upstream: HTTPUpstream, adapters: ServiceAdapters
) -> AdapterJanitor | None:
    """The janitor that unloads adapters the service no longer serves (`upstream.adapters`); None
    without LoRA, or when a volume's catalog holds names only the engines know (no names file)."""
    spec = config.spec
    catalog = spec.adapter_catalog
    unknown = catalog is not None and _on_volume(catalog.source) and config.adapter_names_file is None
    if spec.engine.lora is None or unknown:
        return None
    timeout_s = config.settings.proxy.models_timeout_seconds
    return AdapterJanitor(upstream, declared=adapters.names, timeout_s=timeout_s)


def adapter_copier(
    config: EffectiveConfig, upstream: HTTPUpstream, loads: AdapterLoads | None
) -> AdapterCopier | None:
    """The copier that loads a hot adapter onto another engine ahead of its requests
    (`upstream.adaptercopy`), joined to the placement's record of loads; None without
    `adapterLoadDir`, or without the `tandem` policy's placement (`loads`)."""
    if config.adapter_load_dir is None or loads is None:
        return None
    copier = AdapterCopier(
        upstream,
        directory=config.adapter_load_dir,
        # A read of a large adapter from network storage takes seconds: as long as a request may wait
        # for an engine that can load one.
        timeout_s=config.settings.proxy.adapter_hold_seconds,
        done=lambda url, adapter, ok: loads.copy_done(url, adapter, ok=ok),
    )
    loads.copier = copier.start
    return copier


def decode_loads(
    config: EffectiveConfig, loads: AdapterLoads | None, copier: AdapterCopier | None
) -> DecodeAdapterLoad | None:
    """A disaggregated request's decode engine reads its adapter while the prefill runs
    (`tandem.router.pd.prefetch`); None without a copier, or without room in the engines' CPU tier
    beyond their GPU slots (`maxCpuLoras` above `maxLoras`, `warm_room`): at vLLM's default, where
    the CPU tier holds only the adapters of the running batch, a read the engine's scheduler did not
    ask for evicts one of them, and the batch reads it again at its next step."""
    lora = config.spec.engine.lora
    if copier is None or loads is None or lora is None or lora.max_cpu_loras is None:
        return None
    if warm_room(max_cpu_loras=lora.max_cpu_loras, max_loras=lora.max_loras) < 1:
        return None
    return DecodeAdapterLoad(loads, copier)


def adapter_warmer(
    config: EffectiveConfig,
    registry: EndpointRegistry,
    adapters: ServiceAdapters,
    loads: AdapterLoads | None,
    copier: AdapterCopier | None,
) -> AdapterWarmer | None:
    """The warmer that loads the declared adapters onto the prefill and the decode engines ahead of
    their first requests (`upstream.adaptercopy`; each pool its own plan); None without a copier,
    without `maxCpuLoras` above `maxLoras` (`warm_room`). Every worker and replica runs one: they
    plan the same homes in the same order, and vLLM takes one load of a name at a time (a lock per
    adapter name) and answers the others "already loaded" without a read, so each process learns
    where every adapter is held."""
    lora = config.spec.engine.lora
    if copier is None or loads is None or lora is None or lora.max_cpu_loras is None:
        return None
    room = warm_room(max_cpu_loras=lora.max_cpu_loras, max_loras=lora.max_loras)
    if room < 1:
        return None

    def pools() -> list[list[tuple[str, int]]]:
        roles: tuple[Pool, ...] = ("prefill", "decode")
        return [[(s.endpoint.url, s.in_flight) for s in registry.snapshots(role)] for role in roles]

    return AdapterWarmer(
        loads,
        copier,
        pools=pools,
        names=lambda: adapters.ordered,
        capacity=lora.max_cpu_loras,
        room=room,
        ready_after_s=config.settings.proxy.adapter_warmup_seconds,
    )


def _on_volume(source: str) -> bool:
    """Whether a catalog's source is a volume (`pvc://`), as `tandem.core.adapters` parses it; an
    unparsable one counts as such (the names it holds are unknown here)."""
    try:
        return isinstance(parse_source(source), PvcSource)
    except AdapterError:
        return True


@dataclass(frozen=True)
class _Stopping:
    """A `Service` that only stops (a background helper whose work starts with the collector's)."""

    stop_fn: Callable[[], Awaitable[None]]

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.stop_fn()


def _waking(hold: PrefillHold) -> Callable[[Pool], None]:
    """A membership listener that wakes the prefill hold when the prefill pool changes."""

    def changed(pool: Pool) -> None:
        if pool == "prefill":
            hold.wake()

    return changed


class ContextLearner:
    """Asks each new engine its `/v1/models` for the context length (`request.context_limit`), in the
    background (a slow engine never delays the collector's round), again every `retry_s` while it
    states none."""

    def __init__(
        self, limit: ContextLimit, upstream: HTTPUpstream, *, timeout_s: float, retry_s: float = 30.0
    ) -> None:
        self._limit, self._upstream, self._timeout_s, self._retry_s = limit, upstream, timeout_s, retry_s
        self._asked: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def follow(self, urls: Collection[str]) -> None:
        self._limit.forget(urls)
        now = time.monotonic()
        asked = self._asked
        due = [u for u in urls if not self._limit.knows(u) and now - asked.get(u, -1e18) >= self._retry_s]
        if due and (self._task is None or self._task.done()):
            self._asked.update(dict.fromkeys(due, now))
            self._task = asyncio.create_task(self._ask(due))

    async def _ask(self, urls: Sequence[str]) -> None:
        endpoints = [Endpoint("decode", url) for url in urls]
        answers = await asyncio.gather(
            *(engine_models(self._upstream, e, timeout_s=self._timeout_s) for e in endpoints)
        )
        for url, entries in zip(urls, answers, strict=True):
            self._limit.learn(url, entries)
