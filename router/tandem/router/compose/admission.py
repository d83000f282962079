"""The admission side of one service in a gateway: each engine's dispatch limit, the gate with its
fair queue over the decode pool, the cold-start hold."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from tandem.kvpool.index import connect
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
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.pipeline.lead import HandoverLead
from tandem.router.settings import AdmissionSettings
from tandem.router.workers.bus import Bus
from tandem.router.workers.counters import SharedCounters
from tandem.router.workers.counters import register as register_counters
from tandem.router.workers.share import (
    SERVICE,
    SharedService,
    apply_service,
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
    ahead: Callable[[int], int] | None = None,
) -> tuple[AdmissionGate, SharedCounters | None]:
    """The admission gate over the decode pool, its fair queue and its metrics. Each worker and
    replica admits into its share of every engine (`EngineCapacity.share`); the fair queue's
    counters are shared: through the KV pool's Redis between replicas (`SharedCounters`, returned
    to be started, which then also serves the sibling workers), else over the workers' bus. `ahead`:
    how many requests the gate may take ahead at a capacity (`tandem.router.pd.ahead`)."""
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
        swap=settings.preemption_swap == "on",
        ahead=ahead,
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


def handover_lead(settings: AdmissionSettings, prometheus: CollectorRegistry) -> HandoverLead | None:
    """The learned lead of the handover (`tandem.router.pipeline.lead`; None with the handover or
    its lead off), read as `tandem_router_handover_lead_seconds`."""
    if settings.handover_tokens <= 0 or settings.handover_lead == "off":
        return None
    lead = HandoverLead()
    gauge = Gauge(
        "tandem_router_handover_lead_seconds",
        "How long a request admitted now takes to reach its decode engine (a prefill elsewhere "
        "first): a stream hands its slot over that much before its end (0 until learned).",
        registry=prometheus,
    )
    gauge.set_function(lambda: lead.seconds)
    return lead
