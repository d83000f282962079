"""One service's components in a gateway (`compose_service`), exactly what a gateway of one service
builds for it, whether it is the gateway's only service or one of many (`tandem.router.compose.many`).

Its way to the engines is built in `engines`, its adapter workers (copier, warmer, janitor) in
`adapterparts`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.modeltokens import PromptEncoder
from tandem.kvpool.index import KVPoolIndex
from tandem.router.admission.gate import AdmissionGate
from tandem.router.admission.policy import TTFTPredictor
from tandem.router.compose.adapterparts import adapter_janitor, adapter_restarts, adapter_warmer, decode_loads
from tandem.router.compose.admission import build_gate, build_hold, handover_lead
from tandem.router.compose.engines import EngineSide, build_engine_side
from tandem.router.compose.routing import Routing
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
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pd.ahead import PrefillAhead, applies
from tandem.router.pd.disagg import Disaggregator
from tandem.router.pipeline.answer import Relay
from tandem.router.pipeline.resume import Resume
from tandem.router.pipeline.stages import Admit, Hold, Pipeline, service_stages
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.request.context_limit import ContextLimit
from tandem.router.types import Endpoint
from tandem.router.upstream.adaptercopy import AdapterWarmer
from tandem.router.upstream.adapters import AdapterJanitor, AdapterNamesCollector, AdapterNamesFile
from tandem.router.upstream.client import HTTPUpstream, metrics_fetch
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import Bus
from tandem.router.workers.counters import SharedCounters

# The adapter helpers are also imported from here (they lived here before `adapterparts`).
__all__ = [
    "ContextLearner",
    "Service",
    "ServiceParts",
    "adapter_janitor",
    "adapter_restarts",
    "adapter_warmer",
    "compose_service",
    "decode_loads",
]


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

    def stages(self) -> Pipeline:
        """Its stages from `Hold` on, which every gateway that serves it runs (`service_stages`)."""
        return service_stages(
            hold=self.hold,
            admit=self.admit,
            dispatcher=self.dispatcher,
            disaggregator=self.disaggregator,
            relay_stage=self.relay,
        )


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
    (default: the service's own). Raises `ConfigurationError` when its names file cannot be read.
    The metrics page and the listeners follow the order of the steps: keep it."""
    adapters = adapters or ServiceAdapters(served_names(config.spec.model), config.adapters)
    names_file, names_metrics = _adapter_names(config, adapters=adapters, prometheus=prometheus)
    engines = build_engine_side(
        config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        scrapes=scrapes,
        clock=clock,
        bus=bus,
        loop_lag=loop_lag,
        prefix=prefix,
        names_metrics=names_metrics,
    )
    stages = _stages(
        config,
        prometheus=prometheus,
        predictor=predictor,
        clock=clock,
        bus=bus,
        engines=engines,
        encoder=encoder,
        output_charge=output_charge,
    )
    background = _background(
        config, wire=wire, adapters=adapters, engines=engines, stages=stages, names_file=names_file
    )
    return ServiceParts(
        config=config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        routing=engines.routing,
        dispatcher=engines.dispatcher,
        disaggregator=engines.disaggregator,
        kv_pool=engines.kv_pool,
        context=stages.context,
        hold=_hold_stage(config, registry=registry, prometheus=prometheus, clock=clock),
        admit=Admit(stages.gate, ahead=stages.ahead),
        relay=stages.relay,
        adapters=adapters,
        warming=background.warming,
        services=background.services,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Stages:
    """What a service's requests pass after its `Hold` (`_stages`), and the gate's counters shared
    between replicas (background work, None when the workers' bus carries them or nothing does)."""

    gate: AdmissionGate
    counters: SharedCounters | None
    context: ContextLimit
    relay: Relay
    ahead: PrefillAhead | None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Background:
    """A service's background work in start order (`_background`), and why it is not ready yet
    while its declared adapters load (None without an adapter warmer)."""

    services: tuple[Service, ...]
    warming: Callable[[], str | None] | None


def _adapter_names(
    config: EffectiveConfig, *, adapters: ServiceAdapters, prometheus: CollectorRegistry
) -> tuple[AdapterNamesFile | None, AdapterNamesCollector]:
    """The file `adapters` follow (`adapterNamesFile`; None without one) and the names' metrics,
    registered on `prometheus` with LoRA. Raises `ConfigurationError` when the file cannot be read."""
    names_file = (
        AdapterNamesFile(config.adapter_names_file, adapters)
        if config.adapter_names_file is not None
        else None
    )
    names_metrics = AdapterNamesCollector(adapters, names_file)
    if config.lora:
        prometheus.register(names_metrics)
    return names_file, names_metrics


def _stages(
    config: EffectiveConfig,
    *,
    prometheus: CollectorRegistry,
    predictor: TTFTPredictor | None,
    clock: Callable[[], float],
    bus: Bus,
    engines: EngineSide,
    encoder: PromptEncoder,
    output_charge: Callable[[str], Callable[[int], None] | None],
) -> _Stages:
    """The admission gate over the decode pool (`predictor`, default: the scheduler's TTFT
    estimates), the context limit and the relay (`_Stages`)."""
    settings = config.settings
    share = settings.admission.prefill_ahead
    ahead = PrefillAhead(engines.disaggregator, share) if applies(share, engines.disaggregator) else None
    gate, counters = build_gate(
        config,
        registry=engines.registry,
        prometheus=prometheus,
        predictor=predictor or engines.routing.state,
        clock=clock,
        bus=bus,
        capacity=engines.capacity,
        ahead=ahead.limit if ahead is not None else None,
    )
    model = config.spec.model
    context = ContextLimit(
        max_token_chars=encoder.tokenizer.max_token_chars,
        model_names={model.name, model.public_name},
        exact=config.tokenizer_exact,
    )
    relay = Relay(
        output_charge,
        config.log_prompts,
        handover_tokens=settings.admission.handover_tokens,
        lead=handover_lead(settings.admission, prometheus),
        resume=Resume(gate, engines.dispatcher) if gate.preemption else None,
        topology_headers=settings.access.topology_headers,
        write_s=settings.proxy.client_write_seconds,
    )
    return _Stages(gate=gate, counters=counters, context=context, relay=relay, ahead=ahead)


def _background(
    config: EffectiveConfig,
    *,
    wire: Wire,
    adapters: ServiceAdapters,
    engines: EngineSide,
    stages: _Stages,
    names_file: AdapterNamesFile | None,
) -> _Background:
    """The metrics collector, what follows its rounds (the context learner, the adapter janitor and
    warmer, engine restarts), and the background work in start order (`_Background`)."""
    registry, upstream, capacity = engines.registry, engines.upstream, engines.capacity
    routing = engines.routing
    learner = ContextLearner(stages.context, upstream, timeout_s=config.settings.proxy.models_timeout_seconds)
    janitor = adapter_janitor(config, upstream, adapters)
    warmer = adapter_warmer(config, registry, adapters, routing.state.adapter_loads, engines.copier)
    collector = MetricsCollector(
        registry=registry,
        fetch=metrics_fetch(wire),
        settings=config.settings.collector,
        on_scrape=_scraped(routing, engines.dispatcher),
        on_members=_following(routing, capacity, learner, janitor, warmer),
        urgent=lambda: [s.endpoint.url for s in registry.snapshots("decode") if capacity.learning(s)],
    )
    restarts = adapter_restarts(routing.state.adapter_loads, warmer) if config.lora else None
    if restarts is not None:
        registry.on_restart(restarts)
    services: list[Service] = [] if stages.counters is None else [stages.counters]
    services += [routing, collector]  # subscribers follow the collector's rounds
    if names_file is not None:
        services.append(names_file)
    if janitor is not None:
        adapters.listeners.append(janitor.dropped)
        services.append(_Stopping(janitor.stop))
    if engines.copier is not None:
        services.append(_Stopping(engines.copier.stop))
    if warmer is not None:
        adapters.listeners.append(warmer.kick)
        services.append(_Stopping(warmer.stop))
    return _Background(services=tuple(services), warming=warmer.warming if warmer is not None else None)


def _hold_stage(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    clock: Callable[[], float],
) -> Hold:
    """The first of the service's stages: the cold-start hold, and the arrivals' record (exact
    with prefill autoscaling)."""
    return Hold(
        build_hold(config, registry=registry, prometheus=prometheus, clock=clock),
        arrivals=Arrivals(prometheus, exact=config.spec.prefill.autoscaling.enabled),
    )


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


@dataclass(frozen=True)
class _Stopping:
    """A `Service` that only stops (a background helper whose work starts with the collector's)."""

    stop_fn: Callable[[], Awaitable[None]]

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.stop_fn()


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
