"""What the in-cluster autoscaler needs from Kubernetes, as a Protocol, and the objects it writes.

Pure: no I/O. `ClusterAPI` is implemented over HTTP by `tandem.autoscaler.kube.HttpCluster`; tests can
give the loop any other implementation. The builders below make the request bodies:

- `scale_patch(n, uid=...)`: a merge patch of a Deployment's `scale` subresource,
  `{"metadata": {"uid": uid}, "spec": {"replicas": n}}`; nothing else of the Deployment is touched
  (the operator owns the rest, and leaves `replicas` alone while autoscaling is on). The uid is a
  precondition: the API server refuses the patch (409) when the Deployment of that name is another one.
- `owners_of(deployment)`: the Deployment's uid and the uids of the InferenceServices among its
  `ownerReferences`: the autoscaler scales a Deployment only when its own service is one of them.
- `scale_event(...)`: a core/v1 Event on the InferenceService, reason `ScaledUp` / `ScaledDown`, message
  `decode 2 → 4: panic: 6s window wants 4, ...` (the pool, the numbers and the decider's reason).
- `autoscaling_status(...)`: the `status.autoscaling.<pool>` block, `{desired, ready, reason,
  lastScaleTime, panic}`, sent as a merge patch on the status subresource, so it changes only the
  pools it names (the operator's own status patches name only its own keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tandem.core.kubeerror import KubeError
from tandem.core.spec import API_VERSION, KIND

COMPONENT = "tandem-autoscaler"
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
    """A Deployment's scale subresource: `spec.replicas`, and the Deployment's uid (the subresource
    carries the Deployment's name, namespace and uid, but not its ownerReferences)."""

    replicas: int
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Owners:
    """A Deployment (by uid) and the uids of the InferenceServices among its `ownerReferences`."""

    deployment_uid: str
    services: frozenset[str]

    def include(self, ref: ServiceRef) -> bool:
        """Whether `ref` owns the Deployment (an unknown service uid owns nothing)."""
        return bool(ref.uid) and ref.uid in self.services


class ScaleRefused(Exception):
    """The Deployment named like a pool is not owned by that pool's InferenceService: not scaled."""


class ClusterAPI(Protocol):
    """The Kubernetes calls of the in-cluster autoscaler. Every method raises `ClusterError` on failure."""

    async def ready_urls(self, namespace: str, service: str, port: int) -> list[str]:
        """URLs of the ready endpoints of a Service (its EndpointSlices), sorted."""
        ...

    async def get_scale(self, namespace: str, deployment: str) -> ScaleView:
        """`spec.replicas` of a Deployment's scale subresource, and the Deployment's uid."""
        ...

    async def get_deployment(self, namespace: str, deployment: str) -> Mapping[str, Any]:
        """The Deployment itself (for its ownerReferences)."""
        ...

    async def patch_scale(self, namespace: str, deployment: str, replicas: int, *, uid: str) -> None:
        """Merge-patch the scale subresource to `replicas`, on condition that the Deployment's uid
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


def owners_of(deployment: Mapping[str, Any]) -> Owners:
    """The Deployment's uid and its InferenceService owners' uids (`kind: InferenceService`
    references; the operator sets one, `controller: true`, on every pool Deployment).
    Example: ownerReferences [{kind: InferenceService, uid: s1}, {kind: ReplicaSet, uid: r1}] →
    services {s1}."""
    meta = deployment.get("metadata") or {}
    references = meta.get("ownerReferences") or []
    services = frozenset(
        str(r["uid"]) for r in references if isinstance(r, Mapping) and r.get("kind") == KIND and r.get("uid")
    )
    return Owners(deployment_uid=str(meta.get("uid") or ""), services=services)


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
