"""Everything one gateway process holds while it serves, built once by the app's lifespan."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.routerconfig import RouterConfig
from tandem.kvpool.client import password_from_env
from tandem.kvpool.index import KVPoolIndex, connect
from tandem.router.admission.access import Access, build_access
from tandem.router.admission.fairness.fcfs import FCFSQueue
from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.admission.gate import AdmissionGate, Waiter
from tandem.router.admission.metrics import AdmissionMetrics
from tandem.router.admission.policy import (
    SaturationLimits,
    TTFTPredictor,
    load_from_snapshot,
    pool_capacity,
)
from tandem.router.discovery.kvevents import PrefixSource
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.headers import TenantResolver
from tandem.router.observe.looplag import LoopLagMonitor
from tandem.router.observe.metrics import RouterMetrics
from tandem.router.pd.disagg import Disaggregator, Prefiller
from tandem.router.pipeline.gateway import Gateway
from tandem.router.request.parse import served_names
from tandem.router.routing import Routing, build_routing
from tandem.router.settings import AdmissionSettings, RouterSettings
from tandem.router.types import SLO
from tandem.router.upstream.client import Upstream
from tandem.router.upstream.dispatch import Dispatcher


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    config: RouterConfig
    settings: RouterSettings
    registry: EndpointRegistry
    prometheus: CollectorRegistry
    metrics: RouterMetrics
    upstream: Upstream
    gateway: Gateway
    admission: AdmissionGate
    tenants: TenantResolver
    access: Access
    log_prompts: bool
    default_slo: SLO
    kv_pool: KVPoolIndex | None
    routing: Routing
    accepted_models: frozenset[str]
    started_unix: int
    #: Started and stopped by the app's lifespan.
    loop_lag: LoopLagMonitor


def build_runtime(
    *,
    config: RouterConfig,
    settings: RouterSettings,
    client: httpx.AsyncClient,
    clock: Callable[[], float],
    predictor: TTFTPredictor | None = None,
    prefix: PrefixSource | None = None,
    key_file: KeyFile | None = None,
    scrape_client: httpx.AsyncClient | None = None,
) -> Runtime:
    """Wire the components; pure construction (discovery is started by the caller, the KV pool's
    client connects on first use). `predictor`: TTFT predictions for early rejection (default: none);
    `prefix`: the decode endpoints' prefix caches for the P/D decision (default: unknown, 0).
    `key_file`: the API key table (auth on); None: tenants come from the tenant header.
    `scrape_client`: reads the engines' `/metrics` (default: `client`)."""
    spec = config.spec
    registry = EndpointRegistry(
        failure_threshold=settings.rotation.failure_threshold,
        cooldown_seconds=settings.rotation.cooldown_seconds,
        clock=clock,
    )
    prometheus = CollectorRegistry()
    metrics = RouterMetrics(prometheus, registry)
    upstream = Upstream(client, settings.proxy)
    loop_lag = LoopLagMonitor(prometheus)
    routing = build_routing(
        config=config,
        settings=settings,
        registry=registry,
        prometheus=prometheus,
        client=scrape_client or client,
        clock=clock,
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
    )
    prefiller = Prefiller(
        dispatcher=dispatcher,
        timeout_s=settings.disaggregation.prefill_timeout_seconds,
        clock=clock,
    )
    kv_pool = None
    # Only the simulator's chunk keys can be computed here (our tokenizer, our chunk hash); LMCache in
    # real vLLM hashes the engine's own token ids with Python's seeded hash, so with `vllm` engines a
    # pool look-up or a barrier would never find anything: both are off and P/D relies on the
    # connector's own handoff.
    if config.kv_pool_url is not None and spec.engine.kind == "sim":
        kv_pool = KVPoolIndex(
            connect(
                config.kv_pool_url,
                timeout_s=settings.disaggregation.kv_pool_timeout_seconds,
                password=password_from_env(os.environ),  # TANDEM_KVPOOL_PASSWORD, from a Secret
            ),
            model=spec.model.name,
            chunk_size=spec.kv_pool.chunk_size,
            clock=clock,
        )
    disaggregator = Disaggregator(
        prefiller=prefiller,
        mode=spec.disaggregation.mode,
        min_uncached_tokens=spec.disaggregation.min_uncached_tokens,
        barrier_timeout_s=settings.disaggregation.kv_barrier_timeout_seconds,
        pool=kv_pool,
        prefix=prefix or routing.state.prefix,
    )
    default_slo = SLO(ttft_s=spec.router.slo.ttft_seconds, tpot_s=spec.router.slo.tpot_seconds)
    admission = build_gate(
        config=config,
        settings=settings.admission,
        registry=registry,
        prometheus=prometheus,
        predictor=predictor or routing.state,
        clock=clock,
    )
    access = build_access(
        config=config, settings=settings, key_file=key_file, prometheus=prometheus, clock=clock
    )
    log_prompts = spec.router.log_prompts or settings.access.log_prompts
    gateway = Gateway(
        dispatcher=dispatcher,
        disaggregator=disaggregator,
        admission=admission,
        rate_limiter=access.limiter,
        log_prompts=log_prompts,
    )
    return Runtime(
        config=config,
        settings=settings,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        gateway=gateway,
        admission=admission,
        tenants=access.tenants,
        access=access,
        log_prompts=log_prompts,
        default_slo=default_slo,
        kv_pool=kv_pool,
        routing=routing,
        accepted_models=served_names(spec.model),
        started_unix=int(time.time()),
        loop_lag=loop_lag,
    )


def build_gate(
    *,
    config: RouterConfig,
    settings: AdmissionSettings,
    registry: EndpointRegistry,
    prometheus: CollectorRegistry,
    predictor: TTFTPredictor,
    clock: Callable[[], float],
) -> AdmissionGate:
    """The admission gate over the decode pool, its fair queue and its metrics."""
    spec = config.spec
    queue_type: type[VTCQueue[Waiter]] = FCFSQueue if settings.fairness == "fcfs" else VTCQueue
    queue = queue_type(
        input_weight=spec.router.fairness.input_weight,
        output_weight=spec.router.fairness.output_weight,
        # spec.router.tenants[].weight, overridden by --tenant-weight
        tenant_weights={**{t.name: t.weight for t in spec.router.tenants}, **settings.tenant_weights},
        max_size=spec.router.max_queue + 1,  # the gate bounds *waiting* requests at maxQueue
    )
    limits = SaturationLimits(
        max_in_flight=settings.max_in_flight_per_endpoint,
        max_waiting=settings.max_waiting_per_endpoint,
        max_kv_usage=settings.max_kv_usage,
    )

    def capacity() -> int | None:
        candidates = registry.candidates("decode")
        if not candidates:
            return None
        return pool_capacity((load_from_snapshot(s) for s in candidates), limits)

    metrics = AdmissionMetrics(prometheus, max_tenants=settings.max_tenant_labels)
    gate: AdmissionGate = AdmissionGate(
        queue=queue,
        max_queue=spec.router.max_queue,
        capacity=capacity,
        candidates=lambda: registry.candidates("decode"),
        predictor=predictor,
        metrics=metrics,
        clock=clock,
        default_slo=SLO(ttft_s=spec.router.slo.ttft_seconds, tpot_s=spec.router.slo.tpot_seconds),
        max_queue_wait_s=settings.max_queue_wait_seconds,
        poll_s=settings.poll_seconds,
    )
    metrics.watch(gate)
    return gate
