"""Everything one gateway process holds while it serves, built once by the app's lifespan."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry

from tandem.core.routerconfig import RouterConfig
from tandem.router.disagg import Prefiller
from tandem.router.dispatch import Dispatcher
from tandem.router.endpoints import EndpointRegistry
from tandem.router.gateway import Gateway
from tandem.router.metrics import RouterMetrics
from tandem.router.parsing import served_names
from tandem.router.proxy import Upstream
from tandem.router.scheduling import scheduler_for
from tandem.router.settings import RouterSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    config: RouterConfig
    settings: RouterSettings
    registry: EndpointRegistry
    prometheus: CollectorRegistry
    metrics: RouterMetrics
    upstream: Upstream
    gateway: Gateway
    accepted_models: frozenset[str]
    started_unix: int


def build_runtime(
    *,
    config: RouterConfig,
    settings: RouterSettings,
    client: httpx.AsyncClient,
    clock: Callable[[], float],
) -> Runtime:
    """Wire the components; pure construction (discovery is started by the caller)."""
    registry = EndpointRegistry(
        failure_threshold=settings.rotation.failure_threshold,
        cooldown_seconds=settings.rotation.cooldown_seconds,
        clock=clock,
    )
    prometheus = CollectorRegistry()
    metrics = RouterMetrics(prometheus, registry)
    upstream = Upstream(client, settings.proxy)
    dispatcher = Dispatcher(
        registry=registry,
        scheduler=scheduler_for(config.spec.router.policy),
        upstream=upstream,
        metrics=metrics,
        retries=settings.proxy.retries,
    )
    prefiller = Prefiller(
        dispatcher=dispatcher,
        timeout_s=settings.disaggregation.prefill_timeout_seconds,
        clock=clock,
    )
    gateway = Gateway(dispatcher=dispatcher, prefiller=prefiller, mode=config.spec.disaggregation.mode)
    return Runtime(
        config=config,
        settings=settings,
        registry=registry,
        prometheus=prometheus,
        metrics=metrics,
        upstream=upstream,
        gateway=gateway,
        accepted_models=served_names(config.spec.model),
        started_unix=int(time.time()),
    )
