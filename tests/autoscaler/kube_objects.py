"""Kubernetes objects for the autoscaler's tests, written into the emulated API server (kmock with the
operator tests' `StampingEmulator`, the `api` fixture) as the operator and the API server would make
them: InferenceServices with their server-given uid, pool Deployments owned by them (or not), and
EndpointSlices; and what the autoscaler asked of the server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import kmock as kmock_lib
from tests.operator.cluster_state import NAMESPACE, isvc

from tandem.autoscaler.cluster import ServiceRef

PATIENCE_S = 60.0
ISVC_PATH = f"/apis/tandem.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"


async def until(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while not check():
        assert loop.time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


async def create(api: kmock_lib.KubernetesEmulator, path: str, body: dict[str, Any]) -> None:
    """POST an object into the test namespace (`metadata.namespace` set, as an API server does)."""
    body = {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}}
    response = await api.post(path, json=body)
    assert response.status == 200, await response.text()


def owner_reference(uid: str, *, kind: str = "InferenceService", name: str = "demo") -> dict[str, Any]:
    """An owner reference as the operator sets on a pool's Deployment (`controller: true`)."""
    api_version = "tandem.dev/v1alpha1" if kind == "InferenceService" else "apps/v1"
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


async def deployment(
    api: kmock_lib.KubernetesEmulator, name: str, replicas: int, *, owners: list[dict[str, Any]] | None = None
) -> None:
    """A Deployment in the test namespace; `owners`: its ownerReferences (none when not given)."""
    metadata: dict[str, Any] = {"name": name}
    if owners:
        metadata["ownerReferences"] = owners
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"replicas": replicas},
    }
    await create(api, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", body)


async def service(api: kmock_lib.KubernetesEmulator, name: str = "demo", spec: Any = None) -> ServiceRef:
    """An InferenceService in the test namespace, as the autoscaler knows it (with the uid the
    emulated API server gave it)."""
    body = {"apiVersion": "tandem.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": name}}
    await create(api, ISVC_PATH, {**body, "spec": spec or {"model": {"name": "m"}}})
    return ServiceRef(NAMESPACE, name, isvc(api, name)["metadata"]["uid"])


async def owned_deployment(
    api: kmock_lib.KubernetesEmulator, ref: ServiceRef, pool: str, replicas: int
) -> None:
    """The pool's Deployment, owned by its InferenceService as the operator makes it."""
    await deployment(api, f"{ref.name}-{pool}", replicas, owners=[owner_reference(ref.uid, name=ref.name)])


async def endpoint_slice(api: kmock_lib.KubernetesEmulator, service: str, addresses: list[str]) -> None:
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-x1", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses],
    }
    await create(api, f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", body)


def scale_patches(api: kmock_lib.KubernetesEmulator) -> list[Any]:
    """The `spec` of every PATCH of a scale subresource (the emulator adds its own resourceVersion)."""
    return [
        r.data["spec"] for r in list(api) if r.method.value == "PATCH" and str(r.url.path).endswith("/scale")
    ]


def scale_reads(api: kmock_lib.KubernetesEmulator) -> int:
    """GETs of a scale subresource."""
    return sum(1 for r in list(api) if r.method.value == "GET" and str(r.url.path).endswith("/scale"))


LWS_RESOURCE = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NAMESPACE}/leaderworkersets"


def know_leader_worker_sets(api: kmock_lib.KubernetesEmulator) -> None:
    """What installing the LeaderWorkerSet CRD does for discovery: the resource, with its status and
    scale subresources (a PATCH of `.../scale` lands on the object, as for Deployments)."""
    api.resources[LWS_RESOURCE] = kmock_lib.ResourceInfo(
        kind="LeaderWorkerSet",
        singular="leaderworkerset",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status", "scale"},
    )


async def leader_worker_set(
    api: kmock_lib.KubernetesEmulator,
    name: str,
    replicas: int,
    *,
    ready: int,
    owners: list[dict[str, Any]] | None = None,
) -> None:
    """A LeaderWorkerSet of `replicas` groups of 2 pods, `ready` of them ready (its controller's
    `status.readyReplicas`, played by the test), owned by `owners`."""
    metadata: dict[str, Any] = {"name": name}
    if owners:
        metadata["ownerReferences"] = owners
    body = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 2}},
    }
    await create(api, LWS_PATH, body)
    await ready_groups(api, name, ready)


async def ready_groups(api: kmock_lib.KubernetesEmulator, name: str, ready: int) -> None:
    """Play the LeaderWorkerSet controller: `ready` groups have every pod ready."""
    response = await api.patch(f"{LWS_PATH}/{name}/status", json={"status": {"readyReplicas": ready}})
    assert response.status == 200, await response.text()


def workload_reads(api: kmock_lib.KubernetesEmulator, path: str) -> int:
    """GETs of one object by its path (not its subresources)."""
    return sum(1 for r in list(api) if r.method.value == "GET" and str(r.url.path) == path)
