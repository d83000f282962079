"""Wiring of the scheduling side of one gateway: state, policy, metrics, the metrics collector and,
with `prefix_source: precise`, the KV-event subscribers. Built by `runtime.build_runtime`; started
and stopped by the app's lifespan (`Routing.start` after discovery filled the registry).

The prefix source (`RouterSettings.scheduling.prefix_source`):
- `approximate` (default): the router's own routing history (`ApproximatePrefixIndex`); needs nothing
  from the engines.
- `precise`: the engines' KV events (`PrecisePrefixIndex`), one ZMQ subscriber per engine at
  `tcp://<engine host>:<kv_events.port>` or the address `kv_events.endpoints[<engine URL>]` names;
  subscribers follow discovery each collector round. The approximate index is still fed: it holds
  the routed-prefix state the prefix scorer uses to spread new prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.routerconfig import RouterConfig
from tandem.router.discovery.collector import MetricsCollector
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.schedmetrics import SchedulingMetrics
from tandem.router.scheduling import Scheduler, SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.filters import ImbalanceGuard
from tandem.router.scheduling.prefix import ApproximatePrefixIndex
from tandem.router.scheduling.tokens import tokenizer_for
from tandem.router.scheduling.ttft import PrefillRates
from tandem.router.settings import KVEventsSettings, RouterSettings

if TYPE_CHECKING:
    from tandem.router.discovery.kvevents.subscriber import EventSource, KVEventSubscribers


@dataclass(slots=True, kw_only=True)
class Routing:
    """`state` is the dispatcher's observer, the admission layer's TTFT predictor and, through
    `state.prefix`, the P/D decision's prefix source."""

    state: SchedulingState
    scheduler: Scheduler
    metrics: SchedulingMetrics
    collector: MetricsCollector
    kv_events: KVEventsSettings
    subscribers: KVEventSubscribers | None = None

    async def start(self) -> None:
        await self.collector.start()

    async def stop(self) -> None:
        await self.collector.stop()
        if self.subscribers is not None:
            await self.subscribers.aclose()

    async def follow(self, urls: Collection[str]) -> None:
        """The engines are now `urls`: forget the others; keep one KV-event subscriber per engine."""
        self.state.forget(urls)
        if self.subscribers is not None:
            await self.subscribers.sync(_event_sources(urls, self.kv_events))


def build_routing(
    *,
    config: RouterConfig,
    settings: RouterSettings,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    client: httpx.AsyncClient,
    clock: Callable[[], float],
    timer: Callable[[], float] = time.perf_counter,
) -> Routing:
    """Everything scheduling needs, for `config.spec.router.policy` (module docstring)."""
    spec, tuning = config.spec, settings.scheduling
    approximate = ApproximatePrefixIndex(
        default_block_size=tuning.default_block_size, default_capacity_blocks=tuning.default_index_blocks
    )
    prefix, subscribers = _prefix_source(tuning.prefix_source, approximate=approximate)
    state = SchedulingState(
        clock=clock,
        approximate=approximate,
        prefix=prefix,
        rates=PrefillRates(
            prior_tokens_per_second=tuning.prior_tokens_per_second, smoothing=tuning.rate_smoothing
        ),
        tokenize=tokenizer_for(spec.engine.kind),
        default_slo_ttft_s=spec.router.slo.ttft_seconds,
    )
    metrics = SchedulingMetrics(prometheus, endpoints=registry, state=state)
    state.events = metrics
    deps = SchedulerDeps(
        state=state,
        weights=spec.router.scoring,
        guard=ImbalanceGuard(
            abs_threshold=tuning.imbalance_abs_threshold, rel_threshold=tuning.imbalance_rel_threshold
        ),
        cache_threshold=tuning.cache_threshold,
        timer=timer,
        on_decision=metrics.decided,
    )
    routing = Routing(
        state=state,
        scheduler=scheduler_for(spec.router.policy, deps),
        metrics=metrics,
        collector=MetricsCollector(
            registry=registry, client=client, settings=settings.collector, on_scrape=metrics.scraped
        ),
        kv_events=tuning.kv_events,
        subscribers=subscribers,
    )
    routing.collector.on_members = routing.follow
    return routing


def _prefix_source(
    kind: str, *, approximate: ApproximatePrefixIndex
) -> tuple[PrefixSource, KVEventSubscribers | None]:
    if kind != "precise":
        return approximate, None
    # Imported here: zmq is needed only when engines publish KV events.
    from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
    from tandem.router.discovery.kvevents.subscriber import KVEventSubscribers

    index = PrecisePrefixIndex()
    return index, KVEventSubscribers(sink=index)


def _event_sources(urls: Collection[str], settings: KVEventsSettings) -> list[EventSource]:
    from tandem.router.discovery.kvevents.subscriber import EventSource

    sources = []
    for url in urls:
        address = settings.endpoints.get(url)
        host = urlsplit(url).hostname or "127.0.0.1"
        events = address.events if address else f"tcp://{host}:{settings.port}"
        replay = address.replay if address else None
        if address is None and settings.replay_port is not None:
            replay = f"tcp://{host}:{settings.replay_port}"
        sources.append(EventSource(endpoint=url, events_url=events, replay_url=replay, topic=settings.topic))
    return sources
