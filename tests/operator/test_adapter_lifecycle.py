"""An adapter's life in the cluster, against the emulated Kubernetes API: declared, fetched by the
engine pods' init container, failed with a reason, removed; the status, the count and the Events.

Real: the operator process as `tandem operator` runs it (kopf, handlers, reconcile, builders) over
HTTP on 127.0.0.1. Emulated: the API server (kmock + StampingEmulator); the kubelet is played by
writing engine pods with the fetch container's arguments and `initContainerStatuses` as it reports
them. Timeouts guard against hangs; nothing asserts on speed.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

LORA_DEMO: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"},
        "engine": {"kind": "sim", "lora": {"maxLoras": 2, "maxRank": 16}},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 1},
        "kvPool": {"redis": {"memory": "1Gi"}},
        "adapters": [
            {"name": "sql", "source": "hf://org/sql-lora@v2"},
            {"name": "chat", "source": "s3://loras/chat"},
        ],
    },
}
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def adapter_events(api: kmock_lib.KubernetesEmulator) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events posted about `demo` for its adapters."""
    found = []
    for request in list(api):
        body = request.data if isinstance(request.data, dict) else {}
        involved = body.get("involvedObject") or {}
        if str(body.get("reason", "")).startswith("Adapter") and involved.get("name") == "demo":
            found.append((body["type"], body["reason"], body["message"]))
    return found


def adapters(api: kmock_lib.KubernetesEmulator) -> dict[str, tuple[str, str]]:
    status = k8s.isvc(api, "demo").get("status", {})
    return {a["name"]: (a["state"], a.get("reason", "")) for a in status.get("adapters") or []}


async def engine_pod(api: kmock_lib.KubernetesEmulator, name: str, *, role: str, message: str) -> None:
    """A pod of the `role` pool as the kubelet reports it once its fetch container finished (exit 0,
    with `--keep-going`) and wrote `message` to its termination log."""
    deployment = k8s.find(api, "Deployment", f"demo-{role}")
    assert deployment is not None
    template = deployment["spec"]["template"]
    [fetch] = template["spec"]["initContainers"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": template["metadata"]["labels"]},
        "spec": {"initContainers": [fetch], "containers": template["spec"]["containers"]},
        "status": {
            "initContainerStatuses": [
                {
                    "name": "adapters-fetch",
                    "ready": True,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": message}},
                }
            ]
        },
    }
    response = await api.post(PODS, json=pod)
    assert response.status == 200, await response.text()


async def test_remote_adapters_go_from_pending_to_ready_or_failed_with_events_and_a_count(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await k8s.apply(api, copy.deepcopy(LORA_DEMO))
    await eventually(lambda: k8s.find(api, "Deployment", "demo-decode") is not None, "the decode pool")
    decode = k8s.find(api, "Deployment", "demo-decode")
    assert decode is not None
    [fetch] = decode["spec"]["template"]["spec"]["initContainers"]
    assert fetch["name"] == "adapters-fetch"
    assert fetch["args"] == ["sql=hf://org/sql-lora@v2", "chat=s3://loras/chat"]
    await eventually(lambda: k8s.isvc(api, "demo").get("status", {}).get("adapterSummary") == "0/2", "0/2")
    assert set(adapters(api).values()) == {
        ("Pending", "no engine pod has been given it yet (the engine pools roll out to fetch it)")
    }
    assert k8s.condition(api, "demo", "AdaptersReady")["reason"] == "AdaptersPending"

    report = (
        "failed chat: s3://loras/chat: NoSuchBucket: The specified bucket does not exist\nfetched sql 1a2b"
    )
    await engine_pod(api, "demo-decode-1", role="decode", message=report)
    await eventually(lambda: adapters(api).get("chat", ("",))[0] == "Failed", "chat Failed")
    assert adapters(api) == {
        "sql": ("Ready", "fetched; on 1/1 engine pods given it"),
        "chat": ("Failed", "s3://loras/chat: NoSuchBucket: The specified bucket does not exist"),
    }
    status = k8s.isvc(api, "demo")["status"]
    assert status["adapterSummary"] == "1/2"
    condition = k8s.condition(api, "demo", "AdaptersReady")
    assert (condition["status"], condition["reason"]) == ("False", "AdaptersFailed")
    await eventually(lambda: ("Warning", "AdapterFailed") in [e[:2] for e in adapter_events(api)], "event")
    assert (
        "Warning",
        "AdapterFailed",
        "adapter 'chat' (s3://loras/chat) is Failed: s3://loras/chat: NoSuchBucket: The specified bucket "
        "does not exist",
    ) in adapter_events(api)
    assert ("Normal", "AdapterReady") in [e[:2] for e in adapter_events(api)]

    spec = copy.deepcopy(LORA_DEMO["spec"])
    spec["adapters"] = [spec["adapters"][0]]  # chat removed
    await k8s.patch_spec(api, "demo", {"adapters": spec["adapters"]})
    await eventually(lambda: "chat" not in adapters(api), "chat gone from the status")
    assert adapters(api) == {"sql": ("Ready", "fetched; on 1/1 engine pods given it")}
    assert k8s.isvc(api, "demo")["status"]["adapterSummary"] == "1/1"
    await eventually(lambda: ("Normal", "AdapterRemoved") in [e[:2] for e in adapter_events(api)], "removed")
    decode = k8s.find(api, "Deployment", "demo-decode")
    assert decode is not None
    assert decode["spec"]["template"]["spec"]["initContainers"][0]["args"] == ["sql=hf://org/sql-lora@v2"]
    await eventually(lambda: k8s.condition(api, "demo", "AdaptersReady").get("status") == "True", "ready")
