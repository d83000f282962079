"""What the in-cluster autoscaler needs from Kubernetes, as a Protocol, and the objects it writes.

Pure: no I/O. `ClusterAPI` is implemented over HTTP by `tandem.autoscaler.kube.HttpCluster`; tests can
give the loop any other implementation. The builders below make the request bodies:

- `scale_patch(n, uid=...)`: a merge patch of a pool workload's `scale` subresource,
  `{"metadata": {"uid": uid}, "spec": {"replicas": n}}`; nothing else of the workload is touched
  (the operator owns the rest, and leaves `replicas` alone while autoscaling is on). The uid is a
  precondition: the API server refuses the patch (409) when the workload of that name is another one.
- `owners_of(workload)`: the workload's uid and the uids of the InferenceServices among its
  `ownerReferences`: the autoscaler scales a workload only when its own service is one of them.

A pool's workload is a Deployment, or a LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`) when the pool
has `nodesPerReplica` > 1 (`workload_kind`): one replica is then one group of pods whose leader alone
serves, and both kinds are scaled through their `scale` subresource. `group_scale(lws)` reads a
LeaderWorkerSet's replicas, uid and ready groups (`status.readyReplicas`: groups whose every pod is
ready) from the object itself, whose scale subresource reports created groups, not ready ones.
- `scale_event(...)`: a core/v1 Event on the InferenceService, reason `ScaledUp` / `ScaledDown`, message
  `decode 2 → 4: panic: 6s window wants 4, ...` (the pool, the numbers and the decider's reason).
- `autoscaling_status(...)`: the `status.autoscaling.<pool>` block, `{desired, ready, reason,
  lastScaleTime, panic}`, sent as a merge patch on the status subresource, so it changes only the
  pools it names (the operator's own status patches name only its own keys).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tandem.core.kubeerror import KubeError
from tandem.core.spec import API_VERSION, KIND, PoolSpec

COMPONENT = "tandem-autoscaler"


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """A kind of pool workload: its API group/version, its plural (the URL) and its kind."""

    group_version: str
    plural: str
    kind: str


DEPLOYMENT = WorkloadKind("apps/v1", "deployments", "Deployment")
LEADER_WORKER_SET = WorkloadKind("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet")


def workload_kind(pool: PoolSpec) -> WorkloadKind:
    """What the operator renders for a pool (a LeaderWorkerSet when one engine spans several pods)."""
    return LEADER_WORKER_SET if pool.multinode else DEPLOYMENT


#: Longest Event message (the API server's own limit is 1 KiB for `note`, events.k8s.io/v1).
MAX_EVENT_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ServiceRef:
    """One InferenceService: where it is and its uid (for Events); `key` is the metrics label."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ScaleView:
    """A workload's scale subresource: `spec.replicas`, and the workload's uid (the subresource
    carries the workload's name, namespace and uid, but not its ownerReferences); `ready`: the
    ready groups of a LeaderWorkerSet read whole (`group_scale`), None from a scale subresource."""

    replicas: int
    uid: str = ""
    ready: int | None = None


def group_scale(lws: Mapping[str, Any]) -> ScaleView:
    """A LeaderWorkerSet's `spec.replicas` (groups asked for), uid and `status.readyReplicas`
    (groups whose every pod is ready; absent means 0, as the API omits zero counts).
    Example: spec.replicas 3, status {replicas: 3, readyReplicas: 2} → ScaleView(3, uid, ready=2)."""
    spec, status = lws.get("spec") or {}, lws.get("status") or {}
    uid = str((lws.get("metadata") or {}).get("uid") or "")
    ready = int(status.get("readyReplicas") or 0)
    return ScaleView(replicas=int(spec.get("replicas") or 0), uid=uid, ready=ready)


def serving_leaders(urls: Sequence[str], ready_groups: int) -> list[str]:
    """The engines of a LeaderWorkerSet pool: its ready leaders (the pool's Service selects leaders
    only, so each URL is one group), at most as many as the groups its status counts ready (a
    leader whose workers are not all ready is not an engine yet). Which leader's group is the unready
    one is not in the status; the extra ones are dropped from the end in URL order.
    Example: leaders [a, b, c], 2 groups ready → [a, b]; [a], 3 ready (a scale-up's leaders not in the
    slices yet) → [a]."""
    return sorted(urls)[: max(ready_groups, 0)]


@dataclass(frozen=True, slots=True)
class Owners:
    """A workload (by uid) and the uids of the InferenceServices among its `ownerReferences`."""

    workload_uid: str
    services: frozenset[str]

    def include(self, ref: ServiceRef) -> bool:
        """Whether `ref` owns the workload (an unknown service uid owns nothing)."""
        return bool(ref.uid) and ref.uid in self.services


class ScaleRefused(Exception):
    """The workload named like a pool is not owned by that pool's InferenceService: not scaled."""


class ClusterAPI(Protocol):
    """The Kubernetes calls of the in-cluster autoscaler. Every method raises `ClusterError` on failure."""

    async def ready_urls(self, namespace: str, service: str, port: int) -> list[str]:
        """URLs of the ready endpoints of a Service (its EndpointSlices), sorted."""
        ...

    async def get_scale(self, namespace: str, name: str, *, kind: WorkloadKind = DEPLOYMENT) -> ScaleView:
        """`spec.replicas` of a workload's scale subresource, and the workload's uid."""
        ...

    async def get_workload(
        self, namespace: str, name: str, *, kind: WorkloadKind = DEPLOYMENT
    ) -> Mapping[str, Any]:
        """The workload itself (its ownerReferences; a LeaderWorkerSet's status)."""
        ...

    async def patch_scale(
        self, namespace: str, name: str, replicas: int, *, uid: str, kind: WorkloadKind = DEPLOYMENT
    ) -> None:
        """Merge-patch the scale subresource to `replicas`, on condition that the workload's uid
        is `uid` (409 otherwise)."""
        ...

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create a core/v1 Event."""
        ...

    async def patch_status(self, ref: ServiceRef, patch: Mapping[str, Any]) -> None:
        """Merge-patch the InferenceService's status subresource with `{"status": patch}`."""
        ...


#: A Kubernetes API call failed: Tandem's one Kubernetes error (`status`: the HTTP status, 0: no answer).
ClusterError = KubeError


def scale_patch(replicas: int, *, uid: str = "") -> dict[str, Any]:
    """The scale subresource merge patch, with the Deployment's uid as a precondition when given.
    Example: (4, uid="d1") → {"metadata": {"uid": "d1"}, "spec": {"replicas": 4}}."""
    patch: dict[str, Any] = {"spec": {"replicas": replicas}}
    if uid:
        patch["metadata"] = {"uid": uid}
    return patch


def owners_of(workload: Mapping[str, Any]) -> Owners:
    """The workload's uid and its InferenceService owners' uids (`kind: InferenceService`
    references; the operator sets one, `controller: true`, on every pool workload).
    Example: ownerReferences [{kind: InferenceService, uid: s1}, {kind: ReplicaSet, uid: r1}] →
    services {s1}."""
    meta = workload.get("metadata") or {}
    references = meta.get("ownerReferences") or []
    services = frozenset(
        str(r["uid"]) for r in references if isinstance(r, Mapping) and r.get("kind") == KIND and r.get("uid")
    )
    return Owners(workload_uid=str(meta.get("uid") or ""), services=services)


def scale_event(
    ref: ServiceRef,
    *,
    pool: Literal["prefill", "decode"],
    previous: int,
    desired: int,
    reason: str,
    now: str,
    suffix: str,
) -> dict[str, Any]:
    """A Normal Event on the InferenceService saying why a pool was resized. `now` is RFC 3339;
    `suffix` makes the name unique (`<service>.<suffix>`, as kubectl's recorder names events)."""
    message = f"{pool} {previous} → {desired}: {reason}"[:MAX_EVENT_MESSAGE]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref.name}.{suffix}", "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        },
        "type": "Normal",
        "reason": "ScaledUp" if desired > previous else "ScaledDown",
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolAutoscalingView:
    """One pool's `status.autoscaling.<pool>` (camelCase in the API)."""

    desired: int
    ready: int
    reason: str
    panic: bool
    last_scale_time: str | None = None
    #: The `ReplicasReady` condition (`ready_condition`), if the reporter tracks one.
    condition: Mapping[str, Any] | None = None

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "desired": self.desired,
            "ready": self.ready,
            "reason": self.reason[:MAX_EVENT_MESSAGE],
            "panic": self.panic,
        }
        if self.last_scale_time is not None:
            status["lastScaleTime"] = self.last_scale_time
        if self.condition is not None:
            status["conditions"] = [dict(self.condition)]
        return status


def ready_condition(*, ready: bool, message: str, since: str) -> dict[str, Any]:
    """`ReplicasReady`: False once the autoscaler gave up waiting for requested replicas, True
    otherwise; `since` is the RFC 3339 time of the last change."""
    return {
        "type": "ReplicasReady",
        "status": "True" if ready else "False",
        "reason": "ReplicasReady" if ready else "ReplicasNotReady",
        "message": message[:MAX_EVENT_MESSAGE],
        "lastTransitionTime": since,
    }


def not_ready_event(
    ref: ServiceRef, *, pool: Literal["prefill", "decode"], message: str, now: str, suffix: str
) -> dict[str, Any]:
    """A Warning Event: requested replicas of `pool` never became ready and the autoscaler stopped
    waiting for them (`ReplicasNotReady`)."""
    event = scale_event(ref, pool=pool, previous=0, desired=0, reason="", now=now, suffix=suffix)
    return event | {"type": "Warning", "reason": "ReplicasNotReady", "message": message[:MAX_EVENT_MESSAGE]}


def autoscaling_status(pools: Mapping[Literal["prefill", "decode"], PoolAutoscalingView]) -> dict[str, Any]:
    """The status merge patch body for the given pools: {"autoscaling": {"decode": {...}}}."""
    return {"autoscaling": {pool: view.as_status() for pool, view in sorted(pools.items())}}
