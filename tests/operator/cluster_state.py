"""Reading and writing the emulated cluster from tests: objects by kind and name, the requests the
operator made, and the Deployment controller's part (reporting replicas ready)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import kmock as kmock_lib

from tandem.core.spec import GROUP, PLURAL, VERSION

NAMESPACE = "ns1"
ISVC = f"{GROUP}/{VERSION}/{PLURAL}"
ISVC_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
#: How often the operator's timer reconciles in these tests (seconds).
RESYNC_SECONDS = 0.3
#: Upper bound for anything to happen; a guard against hangs, not a speed assertion. On a busy 2-core
#: host one step of the gateway story (a relabelled service's own gateway back) took over 20 s.
PATIENCE = 60.0

RESOURCES = {
    "ConfigMap": "v1/configmaps",
    "Service": "v1/services",
    "ServiceAccount": "v1/serviceaccounts",
    "Deployment": "apps/v1/deployments",
    "Role": "rbac.authorization.k8s.io/v1/roles",
    "RoleBinding": "rbac.authorization.k8s.io/v1/rolebindings",
    "Event": "v1/events",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1/leaderworkersets",
    "InferenceService": ISVC,
}
CHILD_KINDS = ("ConfigMap", "Service", "ServiceAccount", "Deployment", "Role", "RoleBinding")


def find(api: kmock_lib.KubernetesEmulator, kind: str, name: str) -> dict[str, Any] | None:
    """The object as stored now, or None if it does not exist."""
    key = (kmock_lib.resource(RESOURCES[kind]), NAMESPACE, name)
    if key not in api.objects or api.objects[key].deleted:
        return None
    return dict(api.objects[key].raw)


def names(api: kmock_lib.KubernetesEmulator, kind: str) -> set[str]:
    """Names of the live objects of a kind in the test namespace."""
    resource = kmock_lib.resource(RESOURCES[kind])
    return {
        name
        for (res, ns, name), obj in api.objects.items()
        if res == resource and ns == NAMESPACE and not obj.deleted
    }


def children(api: kmock_lib.KubernetesEmulator) -> set[tuple[str, str]]:
    """(kind, name) of every object of a kind the operator manages."""
    return {(kind, name) for kind in CHILD_KINDS for name in names(api, kind)}


def writes(api: kmock_lib.KubernetesEmulator, *, since: int = 0) -> list[tuple[str, str, str]]:
    """(verb, kind, name) of every create/patch/delete of a child kind, from request `since` on."""
    kinds = {kmock_lib.resource(RESOURCES[k]): k for k in CHILD_KINDS}
    result = []
    for request in list(api)[since:]:
        kind = kinds.get(request.resource) if request.resource is not None else None
        if kind is None or request.method.value not in ("POST", "PATCH", "DELETE", "PUT"):
            continue
        name = request.name or (request.data or {}).get("metadata", {}).get("name", "")
        result.append((request.method.value, kind, name))
    return result


def mark(api: kmock_lib.KubernetesEmulator) -> int:
    """How many requests were served so far (a `since` for `writes` and `reads`)."""
    return len(list(api))


def reads(api: kmock_lib.KubernetesEmulator, kind: str, name: str, *, since: int = 0) -> int:
    """How many GETs of one object were served from request `since` on (each reconcile reads
    every child once)."""
    resource = kmock_lib.resource(RESOURCES[kind])
    return len(
        [
            r
            for r in list(api)[since:]
            if r.resource == resource and r.name == name and r.method.value == "GET"
        ]
    )


def isvc(api: kmock_lib.KubernetesEmulator, name: str) -> dict[str, Any]:
    """The InferenceService as stored now."""
    obj = find(api, "InferenceService", name)
    assert obj is not None, f"InferenceService {name} does not exist"
    return obj


def condition(api: kmock_lib.KubernetesEmulator, name: str, ctype: str) -> dict[str, Any]:
    """One status condition of the InferenceService (empty if absent)."""
    conditions = isvc(api, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c.get("type") == ctype), {})


async def apply(api: kmock_lib.KubernetesEmulator, document: dict[str, Any]) -> None:
    """`kubectl create` of an InferenceService."""
    response = await api.post(ISVC_PATH, json=document)
    assert response.status == 200, await response.text()


async def patch_spec(api: kmock_lib.KubernetesEmulator, name: str, spec: dict[str, Any]) -> None:
    """`kubectl patch --type merge` of an InferenceService's spec."""
    response = await api.patch(f"{ISVC_PATH}/{name}", json={"spec": spec})
    assert response.status == 200, await response.text()


async def delete(api: kmock_lib.KubernetesEmulator, name: str) -> None:
    """`kubectl delete` of an InferenceService."""
    response = await api.delete(f"{ISVC_PATH}/{name}")
    assert response.status == 200, await response.text()


def path_of(kind: str, name: str) -> str:
    group_version, plural = RESOURCES[kind].rsplit("/", 1)
    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{root}/namespaces/{NAMESPACE}/{plural}/{name}"


async def patch_object(
    api: kmock_lib.KubernetesEmulator, kind: str, name: str, patch: dict[str, Any]
) -> None:
    """Someone else (a user, the autoscaler) merge-patches a child."""
    response = await api.patch(path_of(kind, name), json=patch)
    assert response.status == 200, await response.text()


async def mark_ready(api: kmock_lib.KubernetesEmulator, name: str, kind: str = "Deployment") -> None:
    """Play the Deployment controller (or LeaderWorkerSet's, `kind`): every desired replica of `name`
    is updated and ready, and the newest generation is observed."""
    deployment = find(api, kind, name)
    assert deployment is not None, f"{kind} {name} does not exist"
    replicas = deployment["spec"].get("replicas", 1)
    status = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
    response = await api.patch(f"{path_of(kind, name)}/status", json={"status": status})
    assert response.status == 200, await response.text()


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait until `predicate()` holds (checked every 50 ms), failing after PATIENCE seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
