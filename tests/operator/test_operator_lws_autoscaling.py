"""An autoscaled multi-node pool: the operator renders its LeaderWorkerSet, the autoscaler scales it
through the scale subresource, and the operator's reconciles leave that count alone.

Real: the operator as `tandem operator` runs it (kopf, handlers, client, builders, reconcile) and the
in-cluster autoscaler loop (`run_in_cluster`), both over HTTP on 127.0.0.1, and a fake engine that is a
real HTTP server on 127.0.0.1 serving vLLM metric text (95% KV) behind the pool Service's
EndpointSlice. Emulated: the API server (kmock + StampingEmulator), taught the LeaderWorkerSet
resource with its status and scale subresources as the LWS CRD does; the test plays the
LeaderWorkerSet controller (`status.readyReplicas`) and the EndpointSlice controller. Timeouts guard
against hangs; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
from prometheus_client import CollectorRegistry
from tests.autoscaler.kube_objects import endpoint_slice, know_leader_worker_sets, ready_groups
from tests.autoscaler.test_kube_actuator import fake_engine
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, PATIENCE, eventually

from tandem.autoscaler.incluster import ClusterSettings, run_in_cluster
from tandem.core.kubeaccess import KubeAccess

SERVICE: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "big", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "deepseek-ai/DeepSeek-V3"},
        "engine": {"kind": "vllm", "args": ["--enable-expert-parallel"]},
        "prefill": {"replicas": 1},
        "decode": {
            "replicas": 1,
            "nodesPerReplica": 2,
            "autoscaling": {
                "enabled": True, "min": 1, "max": 4, "targetKvUtilization": 0.5,
                "stableWindowSeconds": 4, "panicWindowSeconds": 2, "scaleDownDelaySeconds": 10,
            },
        },
        "kvPool": {"redis": {"memory": "1Gi"}},
        "router": {"replicas": 1},
    },
}  # fmt: skip
LWS = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/ns1/leaderworkersets/big-decode"


def lws_replicas(api: kmock_lib.KubernetesEmulator) -> int:
    return int((k8s.find(api, "LeaderWorkerSet", "big-decode") or {}).get("spec", {}).get("replicas", 0))


def lws_writes(api: kmock_lib.KubernetesEmulator, *, since: int) -> list[str]:
    """Paths of the PATCHes of the LeaderWorkerSet or its scale from request `since` on (not its
    status: that is the test playing the LeaderWorkerSet controller)."""
    paths = [str(r.url.path) for r in list(api)[since:] if r.method.value == "PATCH"]
    return [path for path in paths if path.startswith(LWS) and not path.endswith("/status")]


async def test_the_autoscaler_scales_the_operators_leader_worker_set_and_reconciles_keep_its_count(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    know_leader_worker_sets(api)
    await k8s.apply(api, copy.deepcopy(SERVICE))
    await eventually(lambda: k8s.find(api, "LeaderWorkerSet", "big-decode") is not None, "the decode LWS")
    assert lws_replicas(api) == 1
    await ready_groups(api, "big-decode", 1)
    with fake_engine() as engine_url:
        await endpoint_slice(api, "big-decode", ["127.0.0.1"])  # the group's leader
        settings = ClusterSettings(
            namespaces=(NAMESPACE,),
            interval_s=0.2,
            metrics_host="127.0.0.1",
            metrics_port=0,
            engine_port=int(engine_url.rsplit(":", 1)[1]),
        )
        stop = asyncio.Event()
        access = KubeAccess.plain(str(api.url))
        task = asyncio.create_task(
            run_in_cluster(settings, access=access, stop=stop, registry=CollectorRegistry())
        )
        try:
            await eventually(lambda: lws_replicas(api) >= 2, "the autoscaler scaled the LWS")
        finally:
            stop.set()
            await asyncio.wait_for(task, PATIENCE)
    scaled = lws_replicas(api)
    assert lws_writes(api, since=0) == [f"{LWS}/scale"]  # the autoscaler's one patch, nothing else

    # The operator keeps reconciling (every resync, and on a spec change elsewhere): the count stays.
    since = k8s.mark(api)
    await k8s.patch_spec(api, "big", {"router": {"replicas": 2}})
    await eventually(
        lambda: (k8s.find(api, "Deployment", "big-router") or {})["spec"]["replicas"] == 2, "router at 2"
    )
    await eventually(lambda: k8s.reads(api, "Deployment", "big-router", since=since) >= 4, "reconciles")
    assert lws_replicas(api) == scaled and lws_writes(api, since=since) == []
    await ready_groups(api, "big-decode", scaled)
    await eventually(
        lambda: k8s.isvc(api, "big").get("status", {}).get("decode", {}).get("ready") == scaled,
        "status counts the ready groups",
    )
    assert k8s.isvc(api, "big")["status"]["decode"]["replicas"] == scaled
