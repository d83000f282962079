"""The operator's stories against an emulated Kubernetes API.

Real: the operator process as `tandem operator` runs it (kopf, our registry and handlers, the
`kubernetes` client, builders and reconcile) over HTTP on 127.0.0.1. Emulated: the API server
(kmock + StampingEmulator, including the garbage collector); the Deployment controller is played
by `mark_ready`. Timeouts guard against hangs; nothing asserts on speed.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

DEMO: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"},
        "engine": {"kind": "sim"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2},
        "kvPool": {"redis": {"memory": "1Gi"}},
        "router": {"replicas": 1},
    },
}
DEPLOYMENTS = ("demo-prefill", "demo-decode", "demo-kv", "demo-router")
EXPECTED_CHILDREN = {
    ("ConfigMap", "demo-router"),
    ("ServiceAccount", "demo-router"),
    ("Role", "demo-router"),
    ("RoleBinding", "demo-router"),
    *(("Deployment", name) for name in DEPLOYMENTS),
    *(("Service", name) for name in DEPLOYMENTS),
}


async def test_creating_a_service_creates_owned_children_and_reports_ready_once_deployments_are(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, copy.deepcopy(DEMO))
    await eventually(lambda: k8s.children(api) == EXPECTED_CHILDREN, "every child")
    uid = k8s.isvc(api, "demo")["metadata"]["uid"]
    for kind, name in EXPECTED_CHILDREN:
        child = k8s.find(api, kind, name)
        assert child is not None
        assert [r["uid"] for r in child["metadata"]["ownerReferences"]] == [uid]
        assert child["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    await eventually(
        lambda: k8s.condition(api, "demo", "Ready").get("reason") == "ComponentsNotReady", "not ready"
    )

    for name in DEPLOYMENTS:
        await k8s.mark_ready(api, name)
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("status") == "True", "Ready")
    status = k8s.isvc(api, "demo")["status"]
    assert status["phase"] == "Ready"
    assert status["prefill"] == {"replicas": 1, "ready": 1, "summary": "1/1"}
    assert status["decode"] == {"replicas": 2, "ready": 2, "summary": "2/2"}
    assert status["endpoint"] == f"http://demo-router.{NAMESPACE}.svc:8080/v1"
    assert status["observedGeneration"] == 1
