"""The scheduling side of one service in a gateway: its state, policy, metrics and, with
`prefix_source: precise`, the KV-event subscribers."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.kvevents import KVEventsAddresses
from tandem.router.config import EffectiveConfig
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.schedmetrics import SchedulingMetrics
from tandem.router.scheduling import Scheduler, SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.pinned import PinnedTraffic
from tandem.router.scheduling.prefix import ApproximatePrefixIndex
from tandem.router.scheduling.ttft import PrefillRates
from tandem.router.settings import KVEventsSettings
from tandem.router.workers.bus import Bus
from tandem.router.workers.share import (
    ROUTE,
    apply_routes,
    share_routes,
)

if TYPE_CHECKING:  # zmq is imported only when engines publish KV events
    from tandem.router.discovery.kvevents.subscriber import EventSource, KVEventSubscribers


#: Policies whose scorers read prefix matches.
PREFIX_POLICIES = frozenset({"tandem", "prefix"})


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
    tandem = config.spec.router.policy == "tandem"
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
        # The `tandem` policy's placement marks the picks that load an adapter; the state prices
        # them into the predicted TTFT (`adapterload`).
        adapter_loads=AdapterLoads() if config.lora and tandem else None,
        # The `tandem` policy's prefix scorer keeps each engine's pinned traffic (`pinned`).
        pinned=PinnedTraffic(threshold=tuning.cache_threshold) if tandem else None,
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
        adapters=config.lora,
        adapter_capacity=_cpu_loras(config),
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


def _cpu_loras(config: EffectiveConfig) -> int | None:
    """Adapters each engine keeps in CPU memory as the spec declares them (vLLM's `--max-cpu-loras`
    defaults to `--max-loras`); None without `spec.engine.lora` (engines started elsewhere: each
    engine's scraped `max_lora` sizes the record)."""
    lora = config.spec.engine.lora
    if lora is None:
        return None
    return lora.max_cpu_loras if lora.max_cpu_loras is not None else lora.max_loras


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
