"""The composition root's construction: every component of one gateway process, built once from the
`EffectiveConfig` and passed down. Nothing is mutated after it is built, nothing lives at module
level, and the only things that run in the background are listed in `Components.services` (started
and stopped in order by the app's lifespan, `tandem.router.app`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import httpx
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from tandem.core.kvevents import KVEventsAddresses
from tandem.core.modeltokens import PromptEncoder
from tandem.core.spec import RouterSpec
from tandem.kvpool.index import KVPoolIndex, connect
from tandem.router.admission.access import Access, build_access
from tandem.router.admission.coldstart import ColdStartHold
from tandem.router.admission.fairness.fcfs import FCFSQueue
from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.admission.gate import AdmissionGate, Waiter
from tandem.router.admission.metrics import AdmissionMetrics, EngineCapacityCollector, HoldMetrics
from tandem.router.admission.policy import SaturationLimits, TTFTPredictor, load_from_snapshot, pool_capacity
from tandem.router.config import EffectiveConfig
from tandem.router.discovery.capacity import (
    DEFAULT_CAPACITY,
    MAX_CAPACITY,
    EngineCapacity,
    capacity_from_args,
)
from tandem.router.discovery.collector import MetricsCollector, ScrapeOutcome
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.http.catalog import engine_models
from tandem.router.http.server import Gateway
from tandem.router.http.side import Operations
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.observe.arrivals import Arrivals
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import PoolKeysCollector, RouterMetrics
from tandem.router.observe.schedmetrics import SchedulingMetrics
from tandem.router.pd.disagg import Disaggregator, Prefiller
from tandem.router.pd.hold import PrefillHold
from tandem.router.pd.keycheck import STATES, PoolKeysCheck
from tandem.router.pipeline.resume import Resume
from tandem.router.pipeline.stages import Admit, Hold, Identify, Limit, Parse, Relay, generation_stages
from tandem.router.request.context_limit import ContextLimit
from tandem.router.request.limits import BodyLimits, ReadingBudget
from tandem.router.scheduling import Scheduler, SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.prefix import ApproximatePrefixIndex
from tandem.router.scheduling.ttft import PrefillRates
from tandem.router.settings import AccessSettings, KVEventsSettings
from tandem.router.types import Endpoint, Pool
from tandem.router.upstream.client import HTTPUpstream, metrics_fetch
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.recall import Recalls
from tandem.router.upstream.wire import Wire
from tandem.router.workers.bus import Bus, SoloBus, WorkerBus
from tandem.router.workers.counters import SharedCounters
from tandem.router.workers.counters import register as register_counters
from tandem.router.workers.share import (
    LIMITS,
    ROUTE,
    SERVICE,
    SharedLimits,
    SharedService,
    apply_limits,
    apply_routes,
    apply_service,
    share_routes,
)

if TYPE_CHECKING:  # zmq is imported only when engines publish KV events
    from tandem.router.discovery.kvevents.subscriber import EventSource, KVEventSubscribers


#: Policies whose scorers read prefix matches.
PREFIX_POLICIES = frozenset({"tandem", "prefix"})


class Service(Protocol):
    """A component with background work: started after discovery filled the registry."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


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
    pipeline = generation_stages(
        identify=Identify(access.tenants, config.default_slo, access.priorities),
        parse=gateway_parse(
            config,
            accepted=config.served_models,
            scopes=cache_scopes(config.spec.router, settings.access),
            context=service.context,
        ),
        limit=Limit(access),
        hold=service.hold,
        admit=service.admit,
        dispatcher=service.dispatcher,
        disaggregator=service.disaggregator,
        relay_stage=service.relay,
    )
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
        gateway=Gateway(pipeline=pipeline, encoder=encoder, metrics=metrics, clock=clock),
        operations=Operations(
            registry=registry,
            upstream=upstream,
            prometheus=prometheus,
            metrics=metrics,
            tenants=access.tenants,
            bus=bus,
            model=config.spec.model,
            started_unix=int(time.time()),
            models_timeout_s=settings.proxy.models_timeout_seconds,
            scales_from_zero=scales_from_zero(config),
        ),
        services=tuple(services),
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
    accepted: frozenset[str] | None,
    scopes: CacheScopes | None,
    context: ContextLimit | None,
    log_prompts: bool | None = None,
) -> Parse:
    """The body's reading and parsing, with the gateway's limits on bodies (`accepted` None: the
    model is resolved after it, `tandem.router.pipeline.route`)."""
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
    )


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
) -> ServiceParts:
    """One service's components (`ServiceParts`), its metrics in `prometheus`; `bus` carries what
    its workers share (a gateway of many services gives each a bus of its own kinds)."""
    settings = config.settings
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
    )
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
    collector = MetricsCollector(
        registry=registry,
        fetch=metrics_fetch(wire),
        settings=settings.collector,
        on_scrape=_scraped(routing, dispatcher),
        on_members=_following(routing, capacity, learner),
        urgent=lambda: [s.endpoint.url for s in registry.snapshots("decode") if capacity.learning(s)],
    )
    services: list[Service] = [] if counters is None else [counters]
    services += [routing, collector]  # subscribers follow the collector's rounds
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
        services=tuple(services),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """The scheduling side of one gateway. `state` is the dispatcher's observer, the admission
    layer's TTFT predictor and, through `state.prefix`, the P/D decision's prefix source.

    The prefix source (`config.prefix_source`): `approximate` (default), the router's own routing
    history; `precise`, the engines' KV events, one ZMQ subscriber per engine at the address
    `kv_events.endpoints[<engine URL>]` names, else `config.kv_events`' templates filled in with the
    engine's host and port, following discovery each collector round. The approximate index is fed
    either way: it holds the routed-prefix state the prefix scorer uses to spread new prompts."""

    state: SchedulingState
    scheduler: Scheduler
    metrics: SchedulingMetrics
    kv_events: KVEventsSettings
    addresses: KVEventsAddresses
    subscribers: KVEventSubscribers | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        if self.subscribers is not None:
            await self.subscribers.aclose()

    async def follow(self, urls: Collection[str]) -> None:
        """The engines are now `urls`: forget the others; keep one KV-event subscriber per engine."""
        self.state.forget(urls)
        if self.subscribers is not None:
            await self.subscribers.sync(_event_sources(urls, self.kv_events, self.addresses))


def build_routing(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    scrapes: httpx.AsyncClient,
    clock: Callable[[], float],
    bus: Bus,
    timer: Callable[[], float] = time.perf_counter,
) -> Routing:
    """The scheduling side: state, policy, its metrics, the metrics collector and, with
    `prefix_source: precise`, the KV-event subscribers (`tandem.router.routing`)."""
    tuning = config.settings.scheduling
    approximate = ApproximatePrefixIndex(
        default_block_size=tuning.default_block_size, default_capacity_blocks=tuning.default_index_blocks
    )
    prefix, subscribers = prefix_source(config.prefix_source, approximate=approximate, prometheus=prometheus)
    state = SchedulingState(
        clock=clock,
        approximate=approximate,
        prefix=prefix,
        # Prefix state costs a tokenization and a hash of every prompt: kept only where something
        # reads it (a prefix policy, the P/D decision of mode auto, KV events to follow).
        track_prefixes=config.spec.router.policy in PREFIX_POLICIES
        or (config.spec.disaggregation.mode == "auto" and config.prefill_pool_possible)
        or config.prefix_source == "precise",
        on_record=share_routes(bus) if bus.worker is not None else None,
        rates=PrefillRates(
            prior_tokens_per_second=tuning.prior_tokens_per_second, smoothing=tuning.rate_smoothing
        ),
        pending_ttl_s=tuning.pending_ttl_seconds,
    )
    metrics = SchedulingMetrics(prometheus, endpoints=registry, state=state)
    state.events = metrics
    bus.on(ROUTE, apply_routes(approximate.record_keys))
    deps = SchedulerDeps(
        state=state,
        weights=config.spec.router.scoring,
        guard=ImbalanceGuard(
            abs_threshold=tuning.imbalance_abs_threshold, rel_threshold=tuning.imbalance_rel_threshold
        ),
        cache_threshold=tuning.cache_threshold,
        timer=timer,
        on_decision=metrics.decided,
    )
    return Routing(
        state=state,
        scheduler=scheduler_for(config.spec.router.policy, deps),
        metrics=metrics,
        kv_events=tuning.kv_events,
        addresses=config.kv_events,
        subscribers=subscribers,
    )


def build_gate(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    predictor: TTFTPredictor,
    clock: Callable[[], float],
    bus: Bus,
    capacity: EngineCapacity,
) -> tuple[AdmissionGate, SharedCounters | None]:
    """The admission gate over the decode pool, its fair queue and its metrics. Each worker and
    replica admits into its share of every engine (`EngineCapacity.share`); the fair queue's
    counters are shared: through the KV pool's Redis between replicas (`SharedCounters`, returned
    to be started, which then also serves the sibling workers), else over the workers' bus."""
    spec, settings = config.spec, config.settings.admission
    queue_type: type[VTCQueue[Waiter]] = FCFSQueue if settings.fairness == "fcfs" else VTCQueue
    queue = queue_type(
        input_weight=spec.router.fairness.input_weight,
        output_weight=spec.router.fairness.output_weight,
        tenant_weights=config.tenant_weights,
        max_size=spec.router.max_queue + 1,  # the gate bounds *waiting* requests at maxQueue
    )
    counters: SharedCounters | None = None
    access = config.shared_counters
    if access is not None:
        store = connect(access.url, timeout_s=access.timeout_s, password=access.password)
        counters = SharedCounters(store, key=access.key, interval_s=access.interval_s, add=queue.add_service)
        register_counters(counters, prometheus)
        queue.on_charge = counters.charged
    elif bus.worker is not None:  # sibling workers: the counters travel on the bus
        queue.on_charge = SharedService(bus).charged
        bus.on(SERVICE, apply_service(queue.add_service))
    limits = SaturationLimits(
        max_waiting=settings.max_waiting_per_endpoint, max_kv_usage=settings.max_kv_usage
    )
    checks = limits.max_waiting is not None or limits.max_kv_usage is not None

    def pool() -> int | None:
        candidates = registry.candidates("decode")
        if not candidates:
            return None
        if not checks:
            return capacity.total(candidates)
        return pool_capacity((load_from_snapshot(s, limit=capacity.limit(s)) for s in candidates), limits)

    metrics = AdmissionMetrics(prometheus, max_tenants=settings.max_tenant_labels)
    prometheus.register(EngineCapacityCollector(capacity, lambda: iter(registry.snapshots("decode"))))
    gate = AdmissionGate(
        queue=queue,
        max_queue=spec.router.max_queue,
        capacity=pool,
        candidates=lambda: registry.candidates("decode"),
        predictor=predictor,
        metrics=metrics,
        clock=clock,
        max_queue_wait_s=settings.max_queue_wait_seconds,
        poll_s=settings.poll_seconds,
        preemption=settings.preemption == "on" and settings.fairness == "vtc",
    )
    metrics.watch(gate)
    return gate, counters


def build_hold(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    clock: Callable[[], float],
) -> ColdStartHold:
    """The cold-start hold (`spec.router.coldStart`), woken by discovery's changes to the decode pool."""
    metrics = HoldMetrics(prometheus)
    hold = ColdStartHold(
        spec=config.spec.router.cold_start,
        members=lambda: len(registry.endpoints("decode")),
        metrics=metrics,
        clock=clock,
    )
    metrics.watch(lambda: hold.held)
    registry.on_members(hold.members_changed)
    return hold


def scales_from_zero(config: EffectiveConfig) -> bool:
    """Whether an empty decode pool is a cold start the gateway waits out (`/health` stays 200):
    decode autoscaling may go to zero, and the gateway holds requests meanwhile."""
    spec = config.spec
    scaling = spec.decode.autoscaling
    return scaling.enabled and scaling.min == 0 and spec.router.cold_start.max_held_requests > 0


def prefix_source(
    kind: str, *, approximate: ApproximatePrefixIndex, prometheus: CollectorRegistry
) -> tuple[PrefixSource, KVEventSubscribers | None]:
    if kind != "precise":
        return approximate, None
    from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
    from tandem.router.discovery.kvevents.subscriber import KVEventSubscribers
    from tandem.router.observe.kveventmetrics import KVEventMetrics

    index = PrecisePrefixIndex()
    return index, KVEventSubscribers(sink=index, metrics=KVEventMetrics(prometheus, index=index))


def _event_sources(
    urls: Collection[str], settings: KVEventsSettings, addresses: KVEventsAddresses
) -> list[EventSource]:
    """One source per engine URL: the settings' explicit address for it, else the templates'."""
    from tandem.router.discovery.kvevents.subscriber import EventSource

    sources = []
    for url in urls:
        explicit = settings.endpoints.get(url)
        events, replay = (explicit.events, explicit.replay) if explicit else addresses.for_engine(url)
        sources.append(EventSource(endpoint=url, events_url=events, replay_url=replay, topic=settings.topic))
    return sources


def engine_capacity(config: EffectiveConfig) -> EngineCapacity:
    """Each engine's dispatch limit: its concurrency from the settings, the spec's engine args or
    vLLM's default, shared by this process's sibling workers and, in a cluster, by the gateway's
    replicas (each takes its part of every engine)."""
    settings = config.settings.admission
    replicas = config.replicas
    known = settings.engine_capacity or capacity_from_args(config.spec.engine.args)
    return EngineCapacity(
        initial=known or DEFAULT_CAPACITY,
        lookahead=settings.lookahead,
        share=config.settings.workers.count * replicas,
        cap=settings.max_in_flight_per_endpoint,
        ceiling=known or MAX_CAPACITY,
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


def _following(
    routing: Routing, capacity: EngineCapacity, context: ContextLearner
) -> Callable[[Collection[str]], Awaitable[None]]:
    """The collector's `on_members`: what is known per engine follows discovery's engines."""

    async def follow(urls: Collection[str]) -> None:
        capacity.forget(set(urls))
        context.follow(urls)
        await routing.follow(urls)

    return follow


def _waking(hold: PrefillHold) -> Callable[[Pool], None]:
    """A membership listener that wakes the prefill hold when the prefill pool changes."""

    def changed(pool: Pool) -> None:
        if pool == "prefill":
            hold.wake()

    return changed


def cache_scopes(router: RouterSpec, access: AccessSettings) -> CacheScopes | None:
    """The tenants' cache salts (`tandem.router.identity.cachescope`); None with isolation off. A
    gateway given no key (`TANDEM_CACHE_KEY`) draws one for its life: its tenants stay apart, but
    another gateway before the same engines hits none of its cache entries."""
    if router.cache_isolation == "off":
        return None
    key = access.cache_key.get_secret_value().encode() or secrets.token_bytes(32)
    groups = {t.name: t.cache_group for t in router.tenants if t.cache_group is not None}
    return CacheScopes(key=key, mode=router.cache_isolation, groups=groups)


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
