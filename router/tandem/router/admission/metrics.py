"""Admission and fairness metrics, with bounded tenant labels.

- `tandem_router_tenant_served_tokens_total{tenant,kind}` (counter): tokens served; `kind` is
  `prompt` (counted at dispatch, raised when the engine reports more) or `completion` (as they stream).
- `tandem_router_tenant_vtc_counter{tenant}` (gauge): the tenant's virtual token counter.
- `tandem_router_queue_depth{priority}` (gauge): requests waiting per priority band.
- `tandem_router_queue_wait_seconds{outcome}` (histogram): time in the queue; `outcome` is
  `dispatched`, `rejected` or `cancelled` (the client left).
- `tandem_router_admission_rejections_total{reason}` (counter): 429s; `queue_full`, `pushed_out`,
  `deadline`, `slo`.
- `tandem_router_preemptions_total{tenant}` (counter): running streams of `tenant` stopped to give
  their slot to a tenant with nothing running (`tandem.router.admission.preemption`), each continued
  later.
- `tandem_router_admitted_requests` (gauge): requests holding decode capacity now.
- `tandem_router_admission_capacity` (gauge): how many the decode pool may hold now (0: none in rotation).
- `tandem_router_queue_drain_per_second{reading}` (gauge): `measured` (dispatches per second of
  backlog), `pool` (capacity ÷ the mean time a grant held its slot) and `priced` (what early refusals
  and Retry-After use: `tandem.router.admission.policy`); a reading not known yet has no sample.
- `tandem_router_engine_capacity{pool,endpoint}` (gauge): the engine's concurrency C as this process
  knows it (`tandem.router.discovery.capacity`): learned, or declared.
- `tandem_router_engine_capacity_confirmed{pool,endpoint}` (gauge): 1 once the engine was seen holding
  requests back at C (its limit, held), 0 while C is a start value or still growing.
- `tandem_router_engine_dispatch_limit{pool,endpoint}` (gauge): requests this process may have open
  to the engine (C, its lookahead, this process's share).
- `tandem_router_held_requests` (gauge): requests held now because the decode pool has no engine at
  all (`tandem.router.admission.coldstart`); the autoscaler counts them as decode demand.
- `tandem_router_held_total{outcome}` (counter): held requests by how the hold ended (`released`,
  `expired`, `cancelled`) and requests refused because `maxHeldRequests` were held (`rejected`).
- `tandem_router_hold_seconds` (histogram): how long released requests were held.

Tenant labels: the first `max_tenants` distinct tenants keep their name; later ones are counted under
`other` (and have no `tenant_vtc_counter` series). Prometheus series cannot be renamed later, so "first
seen" is the only stable rule; size `max_tenants` for the tenants you want to see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.router.observe.hotmetrics import LabeledCounter, LabeledHistogram

if TYPE_CHECKING:
    from tandem.router.admission.gate import AdmissionGate
    from tandem.router.discovery.capacity import EngineCapacity
    from tandem.router.types import EndpointSnapshot

PREFIX = "tandem_router"
OTHER_TENANTS = "other"
#: Seconds in the queue: from no wait to the longest TTFT objectives.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
#: Seconds held while the decode pool starts from zero: from an engine already on its way to a slow
#: model load (`holdSeconds` is at most 3600).
HOLD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1800, 3600)
#: How a hold ends (`tandem_router_held_total`'s `outcome`).
HOLD_OUTCOMES = ("released", "expired", "rejected", "cancelled")


class TenantLabels:
    """Tenant → label value, bounded to `limit` names plus `other` (module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._named: set[str] = set()

    def label(self, tenant: str) -> str:
        if tenant in self._named:
            return tenant
        if len(self._named) < self.limit:
            self._named.add(tenant)
            return tenant
        return OTHER_TENANTS

    def named(self, tenant: str) -> bool:
        return tenant in self._named


class AdmissionMetrics:
    """Instruments updated by the gate; gauges are read from the gate at scrape time (`watch`)."""

    def __init__(self, registry: CollectorRegistry, *, max_tenants: int) -> None:
        self._registry = registry
        self.tenants = TenantLabels(max_tenants)
        # Recorded per request or per streamed chunk: the request path's cheap families (`hotmetrics`).
        self.served_tokens = LabeledCounter(
            f"{PREFIX}_tenant_served_tokens",
            "Tokens served per tenant: prompt (at dispatch) and completion (as generated).",
            ["tenant", "kind"],
            registry=registry,
        )
        self.queue_wait = LabeledHistogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time requests spent in the router's queue, by outcome.",
            ["outcome"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.rejections = LabeledCounter(
            f"{PREFIX}_admission_rejections",
            "Requests turned away with 429, by reason (queue_full, pushed_out, deadline, slo).",
            ["reason"],
            registry=registry,
        )
        self.preemptions = LabeledCounter(
            f"{PREFIX}_preemptions",
            "Running streams stopped to give their slot to a tenant with nothing running, by the "
            "stopped stream's tenant (each is continued later).",
            ["tenant"],
            registry=registry,
        )

    def watch(self, gate: AdmissionGate) -> None:
        """Register the scrape-time gauges of `gate`."""
        self._registry.register(_GateCollector(gate, self.tenants))

    def seen(self, tenant: str) -> None:
        self.tenants.label(tenant)

    def served(self, tenant: str, *, prompt: int = 0, completion: int = 0) -> None:
        """Count served tokens; negative corrections are dropped (counters only grow)."""
        label = self.tenants.label(tenant)
        if prompt > 0:  # at most `max_tenants` + 1 tenants × 2 kinds of series
            self.served_tokens.labels(label, "prompt").inc(prompt)
        if completion > 0:
            self.served_tokens.labels(label, "completion").inc(completion)

    def waited(self, seconds: float, *, outcome: str) -> None:
        self.queue_wait.labels(outcome).observe(max(0.0, seconds))

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def preempted(self, tenant: str) -> None:
        self.preemptions.labels(self.tenants.label(tenant)).inc()


class HoldMetrics:
    """The cold-start hold's instruments (module docstring). The gauge reads the hold's count at
    scrape time (`watch`); every outcome's series exists from the start (at 0), so rates over it
    need no first event."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.held = Gauge(
            f"{PREFIX}_held_requests",
            "Requests held now because the decode pool has no engine (starting from zero).",
            registry=registry,
        )
        outcomes = Counter(
            f"{PREFIX}_held",
            "Requests held while the decode pool had no engine, by outcome (released, expired, "
            "cancelled), and those refused because the hold was full (rejected).",
            ["outcome"],
            registry=registry,
        )
        self._outcomes = {outcome: outcomes.labels(outcome=outcome) for outcome in HOLD_OUTCOMES}
        self.hold_seconds = Histogram(
            f"{PREFIX}_hold_seconds",
            "How long released requests were held while the decode pool had no engine.",
            buckets=HOLD_BUCKETS,
            registry=registry,
        )

    def watch(self, held: Callable[[], int]) -> None:
        """The gauge reads `held()` at scrape time."""
        self.held.set_function(held)

    def ended(self, outcome: str, *, held_s: float | None = None) -> None:
        """One hold ended (`HOLD_OUTCOMES`); a released one's `held_s` goes to the histogram."""
        self._outcomes[outcome].inc()
        if outcome == "released" and held_s is not None:
            self.hold_seconds.observe(max(0.0, held_s))


class _GateCollector(Collector):
    def __init__(self, gate: AdmissionGate, tenants: TenantLabels) -> None:
        self._gate = gate
        self._tenants = tenants

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth", "Requests waiting in the router's queue.", labels=["priority"]
        )
        for priority, n in sorted({0: 0, **self._gate.queue.depths()}.items()):
            depth.add_metric([str(priority)], n)
        counters = GaugeMetricFamily(
            f"{PREFIX}_tenant_vtc_counter", "Virtual token counter per tenant.", labels=["tenant"]
        )
        for tenant, value in sorted(self._gate.queue.counters().items()):
            if self._tenants.named(tenant):
                counters.add_metric([tenant], value)
        admitted = GaugeMetricFamily(f"{PREFIX}_admitted_requests", "Requests holding decode capacity now.")
        admitted.add_metric([], self._gate.admitted)
        ready = GaugeMetricFamily(
            f"{PREFIX}_admission_ahead_requests",
            "Requests taken out of the queue ahead of capacity (prefill ahead), waiting for a slot.",
        )
        ready.add_metric([], self._gate.ready)
        capacity = GaugeMetricFamily(
            f"{PREFIX}_admission_capacity", "Admitted requests the decode pool may hold now."
        )
        capacity.add_metric([], self._gate.capacity() or 0)
        drain = GaugeMetricFamily(
            f"{PREFIX}_queue_drain_per_second",
            "The queue's drain rate: measured while requests waited, the pool's own (capacity over "
            "the mean time a grant holds its slot), and the one early refusals are priced at.",
            labels=["reading"],
        )
        for reading, rate in self._gate.drain_readings().items():
            if rate is not None:  # no sample until there is a reading
                drain.add_metric([reading], rate)
        yield from (depth, counters, admitted, ready, capacity, drain)

    def describe(self) -> Iterator[Metric]:
        return iter(())


class EngineCapacityCollector(Collector):
    """The per-engine capacity gauges (module docstring), read at scrape time from `snapshots()`."""

    def __init__(self, capacity: EngineCapacity, snapshots: Callable[[], Iterator[EndpointSnapshot]]) -> None:
        self._capacity = capacity
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        labels = ["pool", "endpoint"]
        c = GaugeMetricFamily(
            f"{PREFIX}_engine_capacity", "The engine's concurrency C as this process knows it.", labels=labels
        )
        confirmed = GaugeMetricFamily(
            f"{PREFIX}_engine_capacity_confirmed",
            "1 once the engine was seen holding requests back at C (its limit), else 0.",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            f"{PREFIX}_engine_dispatch_limit",
            "Requests this gateway process may have open to the engine.",
            labels=labels,
        )
        for snap in self._snapshots():
            names = [snap.endpoint.pool, snap.endpoint.name]
            c.add_metric(names, self._capacity.concurrency(snap))
            known = self._capacity.known(snap.endpoint.url)
            confirmed.add_metric(names, 1.0 if known is not None and known.confirmed else 0.0)
            limit.add_metric(names, self._capacity.limit(snap))
        yield from (c, confirmed, limit)

    def describe(self) -> Iterator[Metric]:
        return iter(())
