"""A service with per-pool templates and a multi-node decode pool, applied to the emulated API server.

Real: the operator as `tandem operator` runs it (kopf, handlers, client, builders, reconcile) over
HTTP on 127.0.0.1. Emulated: the API server (kmock + StampingEmulator), which is taught the
LeaderWorkerSet resource as the LWS CRD would; the LeaderWorkerSet and Deployment controllers are
played by `mark_ready`. Timeouts guard against hangs; nothing asserts on speed.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

H20 = {"nvidia.com/gpu.product": "NVIDIA-H20"}
SERVICE: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "big", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "deepseek-ai/DeepSeek-V3"},
        "engine": {
            "kind": "vllm",
            "args": ["--enable-expert-parallel"],
            "template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}},
        },
        "prefill": {
            "replicas": 1,
            "engine": {"args": ["--max-num-batched-tokens", "16384"]},
            "template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H800"}}},
        },
        "decode": {
            "replicas": 2,
            "nodesPerReplica": 2,
            "maxUnavailable": 2,
            "resources": {"limits": {"nvidia.com/gpu": 8}},
            "engine": {"args": ["--max-num-seqs", "256"]},
            "template": {
                "metadata": {"labels": {"gpu": "h20"}},
                "spec": {"nodeSelector": H20, "containers": [{"name": "metrics-agent", "image": "agent:1"}]},
            },
        },
        "kvPool": {"redis": {"memory": "1Gi"}},
        "router": {"replicas": 1},
    },
}


def know_leader_worker_sets(api: kmock_lib.KubernetesEmulator) -> None:
    """What installing the LWS CRD does for discovery: the resource with status and scale."""
    api.resources["leaderworkerset.x-k8s.io/v1/leaderworkersets"] = kmock_lib.ResourceInfo(
        kind="LeaderWorkerSet",
        singular="leaderworkerset",
        namespaced=True,
        verbs={"list", "watch", "get", "patch", "create", "delete"},
        subresources={"status", "scale"},
    )


def engine(template: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == "engine")


async def test_a_multi_node_pool_with_templates_becomes_a_leader_worker_set_and_back(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    know_leader_worker_sets(api)
    await k8s.apply(api, copy.deepcopy(SERVICE))
    await eventually(lambda: k8s.find(api, "LeaderWorkerSet", "big-decode") is not None, "the decode LWS")
    await eventually(lambda: k8s.find(api, "PodDisruptionBudget", "big-decode") is not None, "the budgets")
    uid = k8s.isvc(api, "big")["metadata"]["uid"]

    lws = k8s.find(api, "LeaderWorkerSet", "big-decode")
    assert lws is not None and lws["metadata"]["ownerReferences"][0]["uid"] == uid
    assert lws["spec"]["replicas"] == 2
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        assert template["spec"]["nodeSelector"] == H20
        assert template["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        assert template["metadata"]["labels"]["gpu"] == "h20"
        assert [c["name"] for c in template["spec"]["containers"]] == ["engine", "metrics-agent"]
        assert engine(template)["args"][-3:] == ["--enable-expert-parallel", "--max-num-seqs", "256"]
    assert "--headless" in str(engine(group["workerTemplate"])["env"])
    assert k8s.find(api, "Deployment", "big-decode") is None

    prefill = k8s.find(api, "Deployment", "big-prefill")
    assert prefill is not None
    pod = prefill["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert engine(pod)["args"][-3:] == ["--enable-expert-parallel", "--max-num-batched-tokens", "16384"]
    layout = "tandem.dev/kv-layout"
    assert pod["metadata"]["labels"][layout] == group["leaderTemplate"]["metadata"]["labels"][layout]

    service = k8s.find(api, "Service", "big-decode")
    assert service is not None
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    budgets = {name: k8s.find(api, "PodDisruptionBudget", name) for name in ("big-prefill", "big-decode")}
    assert {name: b["spec"]["maxUnavailable"] for name, b in budgets.items() if b} == {
        "big-prefill": 1,
        "big-decode": 2,
    }

    await eventually(lambda: k8s.find(api, "Deployment", "big-router") is not None, "the gateway")
    for name in ("big-prefill", "big-kv", "big-router"):
        await k8s.mark_ready(api, name)
    await k8s.mark_ready(api, "big-decode", kind="LeaderWorkerSet")
    await eventually(lambda: k8s.condition(api, "big", "Ready").get("status") == "True", "Ready")
    assert k8s.isvc(api, "big")["status"]["decode"] == {"replicas": 2, "ready": 2, "summary": "2/2"}

    # Back to one node per engine: the Deployment returns, the LeaderWorkerSet goes, the Service
    # selects every decode pod again.
    await k8s.patch_spec(api, "big", {"decode": {"nodesPerReplica": 1}})
    await eventually(lambda: k8s.find(api, "Deployment", "big-decode") is not None, "the decode Deployment")
    await eventually(lambda: k8s.find(api, "LeaderWorkerSet", "big-decode") is None, "the LWS pruned")
    service = k8s.find(api, "Service", "big-decode")
    assert service is not None
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in service["spec"]["selector"]
