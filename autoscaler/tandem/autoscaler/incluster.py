"""`tandem autoscaler` in a cluster: every autoscaled InferenceService's pools, kept sized.

- **Services**: InferenceServices are listed and watched (in each given namespace, or in every one
  through one cluster-wide watch). Each one whose pools have `autoscaling.enabled` gets a controller
  per such pool (`tandem.autoscaler.runner`); an edit updates the parameters and keeps the decider's
  state; deletion, disabling or an invalid spec removes them. Services are keyed `namespace/name`
  (the metrics' `service` label).
- **Engines** are found as the router finds them: the ready endpoints of the EndpointSlices of the pool's
  headless Service `<name>-prefill` / `<name>-decode` (port 8000), from EndpointSlice informers (one per
  namespace, as for services); the gateway's replicas the same way from `<name>-router` (port 8080),
  whose queue depth counts in demand.
- **Actuator** (`KubePool`): the `scale` subresource of the pool's Deployment (same name as its
  Service), patched only when the decision differs from its `spec.replicas`. That count is read
  from the API server at most every `SCALE_REREAD_S` and known in between from the last read or
  patch: a round every half second would otherwise GET each pool's scale twice a second, and a
  change made by someone else is seen within those seconds. A Deployment is scaled only when an
  `ownerReferences` entry names the InferenceService by uid (`tandem.autoscaler.ownership`: read
  once per Deployment uid; refused, logged and counted otherwise).
- **Multi-node pools** (`nodesPerReplica` > 1): the workload is a LeaderWorkerSet of that name, one
  replica per group, scaled through `leaderworkersets/<name>/scale` (same patch, same uid
  precondition). It is read whole instead of its scale subresource (replicas, uid, owners and
  `status.readyReplicas` in one GET), at most every `SCALE_REREAD_S` and again whenever the number
  of ready leaders changes. The engines are the pool Service's ready endpoints, which are the
  leaders only (one per group: workers serve nothing), capped at the groups the status counts ready
  (`tandem.autoscaler.cluster.serving_leaders`). Example: 3 groups asked, 3 leaders ready, status
  says 2 ready groups (a worker still pulling its image) → 2 engines scraped, 2 ready.
- **Report** (`KubeReporter`): an Event (`ScaledUp` / `ScaledDown`) on the InferenceService per scale
  action, and `status.autoscaling.<pool>` = {desired, ready, reason, lastScaleTime, panic} merge-patched
  on the status subresource when desired, ready, panic or lastScaleTime change, and otherwise at most
  every `status_every_s` when only the reason text moved (so a steady pool costs no writes).

The EndpointSlice cache is filled before any service is added: a pool must never look empty (and be
scaled down) only because discovery has not listed yet.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from tandem.autoscaler.cluster import (
    DEPLOYMENT,
    LEADER_WORKER_SET,
    ClusterAPI,
    ClusterError,
    PoolAutoscalingView,
    ServiceRef,
    WorkloadKind,
    autoscaling_status,
    group_scale,
    not_ready_event,
    ready_condition,
    scale_event,
    serving_leaders,
    workload_kind,
)
from tandem.autoscaler.control import PoolName, PoolOutcome, PoolTarget
from tandem.autoscaler.health import HealthServer
from tandem.autoscaler.kube import HttpCluster, Informer, services_path, slices_path
from tandem.autoscaler.metrics import AutoscalerMetrics
from tandem.autoscaler.ownership import OwnerCheck
from tandem.autoscaler.readings import GatewayReading
from tandem.autoscaler.runner import ROUND_SECONDS, Autoscaler, controllers_for
from tandem.autoscaler.scraper import Scraper
from tandem.core.endpointslices import ENGINE_PORT, ROUTER_PORT, pool_workload_name, router_workload_name
from tandem.core.kubeaccess import KubeAccess
from tandem.core.spec import InferenceServiceSpec
from tandem.core.specrules import check_rules
from tandem.core.tasks import stop_tasks

log = logging.getLogger(__name__)
WallClock = Callable[[], datetime]


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: Seconds `KubePool.requested` answers from its last read or patch before it asks the API server again.
SCALE_REREAD_S = 5.0


@dataclass(kw_only=True)
class KubePool:
    """`tandem.autoscaler.control.PoolTarget` for one pool's workload (module docstring): its
    Deployment, or with `kind` LEADER_WORKER_SET its LeaderWorkerSet; `clock` is monotonic seconds;
    `owners` is the process's shared ownership check (a pool of its own when not given)."""

    cluster: ClusterAPI
    ref: ServiceRef
    pool: PoolName
    kind: WorkloadKind = DEPLOYMENT
    port: int = ENGINE_PORT
    clock: Callable[[], float] = time.monotonic
    reread_s: float = SCALE_REREAD_S
    owners: OwnerCheck | None = None
    #: (when, replicas) of the last read (a Deployment's scale subresource, a LeaderWorkerSet whole)
    #: or patch.
    _known: tuple[float, int] | None = field(default=None, init=False, repr=False)
    #: The workload's uid as the last read showed it ("": not read yet).
    _uid: str = field(default="", init=False, repr=False)
    #: A LeaderWorkerSet's ready groups at the last read, and how many leaders were ready then.
    _groups: tuple[int, int] | None = field(default=None, init=False, repr=False)
    _check: OwnerCheck = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._check = self.owners if self.owners is not None else OwnerCheck(cluster=self.cluster)

    @property
    def deployment(self) -> str:
        """The workload's name (a Deployment's or a LeaderWorkerSet's: the pool Service's)."""
        return pool_workload_name(self.ref.name, self.pool)

    async def endpoints(self) -> list[str]:
        """The ready engines; of a LeaderWorkerSet, its ready leaders capped at its ready groups
        (`serving_leaders`), the status read again when the ready leaders change in number."""
        urls = await self.cluster.ready_urls(self.ref.namespace, self.deployment, self.port)
        if self.kind != LEADER_WORKER_SET:
            return urls
        now = self.clock()
        if self._groups is None or self._groups[1] != len(urls) or self._stale(now):
            await self._read(now, leaders=len(urls))
        assert self._groups is not None  # set by _read
        return serving_leaders(urls, self._groups[0])

    async def requested(self) -> int:
        now = self.clock()
        if self._known is None or self._stale(now):
            await self._read(now, leaders=self._groups[1] if self._groups is not None else -1)
        assert self._known is not None  # set by _read
        return self._known[1]

    def _stale(self, now: float) -> bool:
        return self._known is None or now - self._known[0] >= self.reread_s

    async def _read(self, now: float, *, leaders: int) -> None:
        """A Deployment's scale subresource; a LeaderWorkerSet whole (replicas, uid, ready groups and
        owners in one GET: its scale subresource counts created groups, not ready ones)."""
        namespace, name = self.ref.namespace, self.deployment
        if self.kind == LEADER_WORKER_SET:
            lws = await self.cluster.get_workload(namespace, name, kind=self.kind)
            self._check.observe(namespace, name, lws)
            scale = group_scale(lws)
            self._groups = (scale.ready or 0, leaders)
        else:
            scale = await self.cluster.get_scale(namespace, name, kind=self.kind)
        self._known, self._uid = (now, scale.replicas), scale.uid

    async def scale(self, replicas: int, *, reason: str) -> None:
        """Patch the scale subresource once the workload is known to be the service's; raises
        `ScaleRefused` (nothing patched) when it is not."""
        namespace, name = self.ref.namespace, self.deployment
        check = self._check
        uid = await check.verify(self.ref, pool=self.pool, deployment=name, uid=self._uid, kind=self.kind)
        try:
            await self.cluster.patch_scale(namespace, name, replicas, uid=uid, kind=self.kind)
        except ClusterError:
            self._known = None  # read it again next round: it may have been replaced (409)
            raise
        self._known = (self.clock(), replicas)
        log.info(
            f"{self.kind.kind.lower()} scaled",
            extra={"service": self.ref.key, "deployment": name, "kind": self.kind.kind, "replicas": replicas},
        )


@dataclass(kw_only=True)
class GatewayQueues:
    """The demand signals (queue, held requests, arrivals, observed prefill throughputs) of every
    ready gateway replica of one InferenceService."""

    cluster: ClusterAPI
    ref: ServiceRef
    scraper: Scraper
    port: int = ROUTER_PORT

    async def __call__(self) -> Mapping[str, GatewayReading | None]:
        service = router_workload_name(self.ref.name)
        urls = await self.cluster.ready_urls(self.ref.namespace, service, self.port)
        return await self.scraper.gateways(urls)


def _stuck_message(outcome: PoolOutcome) -> str:
    missing = outcome.previous - outcome.ready
    waited = outcome.unready_s or 0.0
    return (
        f"{outcome.pool}: {missing} of {outcome.previous} requested replicas not ready after {waited:.0f} s "
        "(readyTimeoutSeconds); scaling on the ready ones"
    )


@dataclass(kw_only=True)
class KubeReporter:
    """Events and `status.autoscaling` (module docstring); `refs` resolves a service key."""

    cluster: ClusterAPI
    refs: Callable[[str], ServiceRef | None]
    wall: WallClock = lambda: datetime.now(UTC)
    clock: Callable[[], float] = time.monotonic
    status_every_s: float = 30.0
    last_scale: dict[tuple[str, str], str] = field(default_factory=dict)
    written: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    #: Per (service, pool): whether requested replicas are given up on, and since when (RFC 3339).
    readiness: dict[tuple[str, str], tuple[bool, str]] = field(default_factory=dict)

    async def report(self, service: str, outcomes: Sequence[PoolOutcome]) -> None:
        ref = self.refs(service)
        if ref is None or not outcomes:
            return
        for outcome in outcomes:
            if outcome.direction is None:
                continue
            now = rfc3339(self.wall())
            event = scale_event(
                ref,
                pool=outcome.pool,
                previous=outcome.previous,
                desired=outcome.desired,
                reason=outcome.decision.reason,
                now=now,
                suffix=uuid.uuid4().hex[:16],
            )
            self.last_scale[(service, outcome.pool)] = now
            await self.cluster.create_event(ref.namespace, event)
        for outcome in outcomes:
            await self._readiness(service, ref, outcome)
        views = {
            o.pool: PoolAutoscalingView(
                desired=o.desired,
                ready=o.ready,
                reason=o.decision.reason,
                panic=o.panic,
                last_scale_time=self.last_scale.get((service, o.pool)),
                condition=self._condition(service, o),
            )
            for o in outcomes
        }
        await self._write_status(service, ref, autoscaling_status(views))

    async def _readiness(self, service: str, ref: ServiceRef, outcome: PoolOutcome) -> None:
        """Track the `ReplicasReady` state; one Warning Event when the autoscaler gives up."""
        key = (service, outcome.pool)
        stuck = outcome.gave_up
        known = self.readiness.get(key)
        if known is not None and known[0] == stuck:
            return
        now = rfc3339(self.wall())
        self.readiness[key] = (stuck, now)
        if stuck:
            message = _stuck_message(outcome)
            suffix = uuid.uuid4().hex[:16]
            event = not_ready_event(ref, pool=outcome.pool, message=message, now=now, suffix=suffix)
            await self.cluster.create_event(ref.namespace, event)

    def _condition(self, service: str, outcome: PoolOutcome) -> dict[str, Any]:
        stuck, since = self.readiness[(service, outcome.pool)]
        message = _stuck_message(outcome) if stuck else "every requested replica became ready in time"
        return ready_condition(ready=not stuck, message=message, since=since)

    async def _write_status(self, service: str, ref: ServiceRef, patch: dict[str, Any]) -> None:
        previous, at = self.written.get(service, ({}, -float("inf")))
        if patch == previous:
            return
        if _without_reasons(patch) == _without_reasons(previous) and self.clock() - at < self.status_every_s:
            return
        await self.cluster.patch_status(ref, patch)
        self.written[service] = (patch, self.clock())

    def forget(self, service: str) -> None:
        self.written.pop(service, None)
        for key in [k for k in self.last_scale if k[0] == service]:
            del self.last_scale[key]


def _without_reasons(patch: Mapping[str, Any]) -> dict[str, Any]:
    pools = patch.get("autoscaling") or {}
    return {pool: {k: v for k, v in fields.items() if k != "reason"} for pool, fields in pools.items()}


class ServiceSync:
    """Keeps `autoscaler`'s services in step with the InferenceServices seen (module docstring)."""

    def __init__(
        self,
        *,
        cluster: ClusterAPI,
        scraper: Scraper,
        autoscaler: Autoscaler,
        reporter: KubeReporter,
        ports: tuple[int, int] = (ENGINE_PORT, ROUTER_PORT),
        owners: OwnerCheck | None = None,
    ) -> None:
        self._ports = ports
        self._owners = owners if owners is not None else OwnerCheck(cluster=cluster)
        self._cluster = cluster
        self._scraper = scraper
        self._autoscaler = autoscaler
        self._reporter = reporter
        self.refs: dict[str, ServiceRef] = {}

    def on_change(self, kind: str, obj: Mapping[str, Any]) -> None:
        """An informer's callback for one InferenceService event."""
        meta = obj.get("metadata") or {}
        ref = ServiceRef(
            str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")
        )
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self._remove(ref.key)
            return
        try:
            spec = InferenceServiceSpec.model_validate(obj.get("spec") or {})
            problems = [str(error) for error in check_rules(spec)]
        except ValidationError as exc:
            problems = [str(exc.errors()[0]["msg"])]
        if problems:
            log.warning("invalid spec; not autoscaled", extra={"service": ref.key, "error": problems[0]})
            self._remove(ref.key)
            return
        targets: dict[PoolName, PoolTarget] = {
            pool: KubePool(
                cluster=self._cluster,
                ref=ref,
                pool=pool,
                kind=workload_kind(spec.prefill if pool == "prefill" else spec.decode),
                port=self._ports[0],
                owners=self._owners,
            )
            for pool in ("prefill", "decode")
        }
        gateways = GatewayQueues(cluster=self._cluster, ref=ref, scraper=self._scraper, port=self._ports[1])
        controllers = controllers_for(
            ref.key, spec, targets=targets, scrape=self._scraper.scrape, gateways=gateways
        )
        if not controllers:
            self._remove(ref.key)
            return
        if ref.key not in self.refs:
            log.info("autoscaling", extra={"service": ref.key, "pools": [c.pool for c in controllers]})
        self.refs[ref.key] = ref
        self._autoscaler.set_service(ref.key, controllers)

    def _remove(self, key: str) -> None:
        ref = self.refs.pop(key, None)
        if ref is not None:
            log.info("no longer autoscaled", extra={"service": key})
            self._owners.forget(ref)
        self._autoscaler.remove_service(key)
        self._reporter.forget(key)


async def wait_synced(events: Sequence[asyncio.Event], stop: asyncio.Event) -> bool:
    """Wait until every event is set (True) or `stop` is (False)."""
    for event in events:
        waiter, stopper = asyncio.create_task(event.wait()), asyncio.create_task(stop.wait())
        _, pending = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        await stop_tasks(pending)
        if stop.is_set():
            return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSettings:
    """`tandem autoscaler`'s settings: the namespaces to watch (empty: all), the round period, where
    `/metrics` and `/healthz` are served, the status refresh period for reason-only changes, and the
    ports of engine and gateway pods (the operator's; tests point them elsewhere)."""

    namespaces: tuple[str, ...] = ()
    interval_s: float = ROUND_SECONDS
    metrics_host: str = "0.0.0.0"  # a pod's metrics are scraped from other pods
    metrics_port: int = 9090
    status_every_s: float = 30.0
    engine_port: int = ENGINE_PORT
    router_port: int = ROUTER_PORT


async def run_in_cluster(
    settings: ClusterSettings,
    *,
    access: KubeAccess,
    stop: asyncio.Event,
    registry: CollectorRegistry | None = None,
    on_listening: Callable[[int], None] = lambda port: None,
) -> None:
    """Run until `stop` is set (module docstring). Raises OSError when the metrics port is taken."""
    registry = registry or CollectorRegistry()
    async with access.client() as api, httpx.AsyncClient(trust_env=False) as engines:
        # One list and watch per namespace: a namespaced install grants the autoscaler nothing
        # cluster-wide (docs/security.md); None is the cluster-wide collection.
        scopes: tuple[str | None, ...] = settings.namespaces or (None,)
        slices = [Informer(client=api, access=access, path=slices_path(ns)) for ns in scopes]
        cluster = HttpCluster(client=api, access=access, slices=slices)
        scraper = Scraper(engines)
        metrics = AutoscalerMetrics(registry)
        autoscaler = Autoscaler(metrics=metrics, interval_s=settings.interval_s)
        owners = OwnerCheck(cluster=cluster, refused=lambda ref, pool: metrics.refused(ref.key, pool))
        sync_holder: list[ServiceSync] = []
        reporter = KubeReporter(
            cluster=cluster,
            refs=lambda key: sync_holder[0].refs.get(key),
            status_every_s=settings.status_every_s,
        )
        autoscaler.report = reporter.report
        sync = ServiceSync(
            cluster=cluster,
            scraper=scraper,
            autoscaler=autoscaler,
            reporter=reporter,
            ports=(settings.engine_port, settings.router_port),
            owners=owners,
        )
        sync_holder.append(sync)
        services = [
            Informer(client=api, access=access, path=services_path(ns), on_change=sync.on_change)
            for ns in scopes
        ]
        health = HealthServer(
            host=settings.metrics_host,
            port=settings.metrics_port,
            registry=registry,
            healthy=lambda: autoscaler.alive(max(10.0, 10 * settings.interval_s)),
        )
        await health.start()
        on_listening(health.port)
        tasks = [asyncio.create_task(s.run(), name=f"watch {s.path}") for s in slices]
        try:
            if await wait_synced([s.synced for s in slices], stop):
                tasks += [asyncio.create_task(s.run(), name=f"watch {s.path}") for s in services]
            log.info("autoscaler started", extra={"namespaces": list(settings.namespaces) or "*"})
            await autoscaler.run(stop)
        finally:
            await stop_tasks(tasks)
            await health.stop()
