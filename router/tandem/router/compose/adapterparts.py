"""One service's LoRA adapter workers in a gateway, as `compose_service` (`service`) builds them: the
copier that loads a hot adapter onto another engine, the decode engines' reads during a prefill, the
warmer that loads the declared adapters ahead of their first requests, the janitor that unloads
adapters the service no longer serves, and what an engine's restart does to them. Each is None when
the service's configuration leaves it out."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tandem.core.adapters import AdapterError, PvcSource, parse_source
from tandem.router.config import EffectiveConfig
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.pd.prefetch import DecodeAdapterLoad
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.adapterwarm import warm_room
from tandem.router.types import Pool
from tandem.router.upstream.adaptercopy import AdapterCopier, AdapterWarmer
from tandem.router.upstream.adapters import AdapterJanitor
from tandem.router.upstream.client import HTTPUpstream

# The logger these lines had before they left `tandem.router.compose.service`: logs name it.
log = logging.getLogger("tandem.router.compose.service")


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
