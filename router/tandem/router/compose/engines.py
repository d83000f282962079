"""The engine side of one service in a gateway (`build_engine_side`): each engine's dispatch limit,
the scheduler (`routing`), the dispatcher, the KV pool, P/D with its late-binding prefill hold, and
the copier of hot adapters (`adapterparts`), built in this order for `compose_service` (`service`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry

from tandem.kvpool.index import KVPoolIndex, connect
from tandem.router.compose.adapterparts import adapter_copier, decode_loads
from tandem.router.compose.admission import engine_capacity
from tandem.router.compose.routing import Routing, build_routing
from tandem.router.config import EffectiveConfig
from tandem.router.discovery.capacity import EngineCapacity
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import PoolKeysCollector, RouterMetrics
from tandem.router.pd.disagg import Disaggregator, Prefiller
from tandem.router.pd.hold import PrefillHold
from tandem.router.pd.keycheck import STATES, PoolKeysCheck
from tandem.router.types import Pool
from tandem.router.upstream.adaptercopy import AdapterCopier
from tandem.router.upstream.adapters import AdapterNamesCollector
from tandem.router.upstream.client import HTTPUpstream
from tandem.router.upstream.dispatch import Dispatcher
from tandem.router.upstream.recall import Recalls
from tandem.router.workers.bus import Bus


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSide:
    """A service's way to its engines: their registry and connections, each one's dispatch limit,
    the scheduler, the dispatcher, the KV pool (None without one), P/D, and the hot adapters'
    copier (None without `adapterLoadDir`)."""

    registry: EndpointRegistry
    upstream: HTTPUpstream
    capacity: EngineCapacity
    routing: Routing
    dispatcher: Dispatcher
    copier: AdapterCopier | None
    kv_pool: KVPoolIndex | None
    disaggregator: Disaggregator


def build_engine_side(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    metrics: RouterMetrics,
    upstream: HTTPUpstream,
    scrapes: httpx.AsyncClient,
    clock: Callable[[], float],
    bus: Bus,
    loop_lag: LoopLagMonitor,
    prefix: PrefixSource | None,
    names_metrics: AdapterNamesCollector,
) -> EngineSide:
    """The way to the service's engines (`EngineSide`); the copier joins `names_metrics`. `prefix`:
    P/D's prefix source (default: the scheduler's)."""
    capacity = engine_capacity(config)
    routing = build_routing(
        config, registry=registry, prometheus=prometheus, scrapes=scrapes, clock=clock, bus=bus
    )
    dispatcher = _dispatcher(
        config,
        registry=registry,
        routing=routing,
        upstream=upstream,
        metrics=metrics,
        loop_lag=loop_lag,
        capacity=capacity,
    )
    copier = adapter_copier(config, upstream, routing.state.adapter_loads)
    names_metrics.copier = copier
    kv_pool = _kv_pool(config, clock)
    disaggregator = _disaggregator(
        config,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        clock=clock,
        routing=routing,
        dispatcher=dispatcher,
        kv_pool=kv_pool,
        prefix=prefix,
        copier=copier,
    )
    return EngineSide(
        registry=registry,
        upstream=upstream,
        capacity=capacity,
        routing=routing,
        dispatcher=dispatcher,
        copier=copier,
        kv_pool=kv_pool,
        disaggregator=disaggregator,
    )


def _dispatcher(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    routing: Routing,
    upstream: HTTPUpstream,
    metrics: RouterMetrics,
    loop_lag: LoopLagMonitor,
    capacity: EngineCapacity,
) -> Dispatcher:
    """The dispatcher to the engines `routing`'s scheduler picks, with its retries, its recalls
    (`admission.recall`) and each engine's dispatch limit (`capacity`)."""
    settings = config.settings
    return Dispatcher(
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


def _kv_pool(config: EffectiveConfig, clock: Callable[[], float]) -> KVPoolIndex | None:
    """The index of the KV pool the service shares (`config.kv_pool`); None without one."""
    access = config.kv_pool
    if access is None:
        return None
    client = connect(access.url, timeout_s=access.timeout_s, password=access.password)
    return KVPoolIndex(client, keys=access.keys, alternatives=access.alternatives, clock=clock)


def _disaggregator(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    metrics: RouterMetrics,
    clock: Callable[[], float],
    routing: Routing,
    dispatcher: Dispatcher,
    kv_pool: KVPoolIndex | None,
    prefix: PrefixSource | None,
    copier: AdapterCopier | None,
) -> Disaggregator:
    """P/D (`spec.disaggregation`): the prefill through `dispatcher`, with the pool's keys check
    (its metric registered with a KV pool) and the late-binding prefill hold (`_prefill_hold`)."""
    settings = config.settings
    keys = PoolKeysCheck()
    if kv_pool is not None:
        prometheus.register(PoolKeysCollector(lambda: keys.state, STATES))
    hold = _prefill_hold(config, registry=registry, routing=routing, metrics=metrics, clock=clock)
    return Disaggregator(
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


def _prefill_hold(
    config: EffectiveConfig,
    *,
    registry: EndpointRegistry,
    routing: Routing,
    metrics: RouterMetrics,
    clock: Callable[[], float],
) -> PrefillHold | None:
    """With late prefill binding, the hold where a request waits for a prefill engine, woken when
    the prefill pool changes; None without."""
    if not config.spec.disaggregation.late_prefill_binding:
        return None
    hold = PrefillHold(
        ahead=routing.state.ahead,
        candidates=lambda: [s.endpoint.url for s in registry.candidates("prefill")],
        clock=clock,
        held_gauge=metrics.pd_prefill_held,
        hold_seconds=metrics.pd_prefill_hold,
    )
    registry.on_members(_waking(hold))
    return hold


def _waking(hold: PrefillHold) -> Callable[[Pool], None]:
    """A membership listener that wakes the prefill hold when the prefill pool changes."""

    def changed(pool: Pool) -> None:
        if pool == "prefill":
            hold.wake()

    return changed
