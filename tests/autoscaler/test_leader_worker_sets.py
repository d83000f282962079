"""Multi-node pools: the autoscaler scales a LeaderWorkerSet through its scale subresource.

Pure tables: which workload a pool has (`workload_kind`), a LeaderWorkerSet's replicas and ready groups
(`group_scale`) and the engines counted from its leaders (`serving_leaders`). Against the emulated API
server (kmock with the operator tests' `StampingEmulator`, taught the LeaderWorkerSet resource with its
status and scale subresources as its CRD does): the real actuator (`KubePool`) and HTTP client
(`HttpCluster`), and the whole in-cluster loop (`run_in_cluster`) under the chart's RBAC (the emulator
answers 403 to what it does not grant), with a fake engine that is a real HTTP server on 127.0.0.1
behind the pool Service's EndpointSlice. Nothing plays the LeaderWorkerSet controller but the test,
which writes `status.readyReplicas` itself. Waits poll with a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kmock as kmock_lib
import pytest
from prometheus_client import CollectorRegistry
from tests.autoscaler.kube_objects import (
    LWS_PATH,
    PATIENCE_S,
    endpoint_slice,
    know_leader_worker_sets,
    leader_worker_set,
    owner_reference,
    ready_groups,
    scale_patches,
    service,
    until,
    workload_reads,
)
from tests.autoscaler.test_kube_actuator import (
    autoscaler_grants,
    fake_engine,
    from_the_autoscaler,
)
from tests.operator.cluster_state import NAMESPACE, find, isvc, names
from tests.operator.emulator import StampingEmulator
from tests.operator.rbac import Access, accesses

from tandem.autoscaler.cluster import (
    DEPLOYMENT,
    LEADER_WORKER_SET,
    ScaleRefused,
    ScaleView,
    ServiceRef,
    group_scale,
    serving_leaders,
    workload_kind,
)
from tandem.autoscaler.incluster import SCALE_REREAD_S, ClusterSettings, KubePool, run_in_cluster
from tandem.autoscaler.kube import HttpCluster, Informer, slices_path
from tandem.core.kubeaccess import KubeAccess
from tandem.core.spec import InferenceServiceSpec


@pytest.mark.parametrize(
    ("pool", "kind"),
    [({"nodesPerReplica": 1}, DEPLOYMENT), ({}, DEPLOYMENT), ({"nodesPerReplica": 2}, LEADER_WORKER_SET)],
)
def test_a_pool_spanning_nodes_is_a_leader_worker_set(pool: dict[str, Any], kind: object) -> None:
    spec = InferenceServiceSpec.model_validate({"model": {"name": "m"}, "decode": pool})
    assert workload_kind(spec.decode) == kind


@pytest.mark.parametrize(
    ("lws", "view"),
    [
        (
            {"metadata": {"uid": "u"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 2}},
            ScaleView(3, "u", ready=2),
        ),
        ({"metadata": {"uid": "u"}, "spec": {"replicas": 2}, "status": {}}, ScaleView(2, "u", ready=0)),
        ({"metadata": {}, "spec": {"replicas": 1}}, ScaleView(1, "", ready=0)),  # no status yet
    ],
)
def test_a_leader_worker_set_is_read_as_groups_asked_for_and_groups_ready(
    lws: dict[str, Any], view: ScaleView
) -> None:
    assert group_scale(lws) == view


@pytest.mark.parametrize(
    ("leaders", "ready", "engines"),
    [
        (["http://b", "http://a", "http://c"], 3, ["http://a", "http://b", "http://c"]),
        (["http://b", "http://a", "http://c"], 2, ["http://a", "http://b"]),  # one group not whole
        (["http://a"], 3, ["http://a"]),  # a scale-up's leaders not in the slices yet
        (["http://a"], 0, []),
        ([], 2, []),
    ],
)
def test_engines_are_ready_leaders_at_most_as_many_as_the_ready_groups(
    leaders: list[str], ready: int, engines: list[str]
) -> None:
    assert serving_leaders(leaders, ready) == engines


async def owned_lws(api: kmock_lib.KubernetesEmulator, name: str, replicas: int, *, ready: int) -> ServiceRef:
    ref = await service(api, name, MULTINODE)
    owners = [owner_reference(ref.uid, name=ref.name)]
    await leader_worker_set(api, f"{name}-decode", replicas, ready=ready, owners=owners)
    return ref


@contextlib.asynccontextmanager
async def listed(api: kmock_lib.KubernetesEmulator) -> AsyncIterator[HttpCluster]:
    """The autoscaler's client with the EndpointSlices the test wrote listed once (not watched)."""
    access = KubeAccess.plain(str(api.url))
    async with access.client() as client:
        slices = Informer(client=client, access=access, path=slices_path(NAMESPACE))
        await slices.list()
        yield HttpCluster(client=client, access=access, slices=[slices])


async def test_the_actuator_counts_ready_groups_and_patches_the_leader_worker_sets_scale(
    api: kmock_lib.KubernetesEmulator,
) -> None:
    know_leader_worker_sets(api)
    ref = await owned_lws(api, "demo", 2, ready=1)
    await endpoint_slice(api, "demo-decode", ["127.0.0.1", "127.0.0.2"])  # both leaders answer probes
    async with listed(api) as cluster:
        await actuator_story(api, cluster, ref)


async def actuator_story(api: kmock_lib.KubernetesEmulator, cluster: HttpCluster, ref: ServiceRef) -> None:
    now = [100.0]
    target = KubePool(cluster=cluster, ref=ref, pool="decode", kind=LEADER_WORKER_SET, clock=lambda: now[0])
    whole = f"{LWS_PATH}/demo-decode"

    # One group of two is whole: one engine, and the LeaderWorkerSet read once for replicas and status.
    assert await target.endpoints() == ["http://127.0.0.1:8000"]
    assert await target.requested() == 2 and workload_reads(api, whole) == 1
    await ready_groups(api, "demo-decode", 2)
    now[0] += 0.5  # the next round: the leaders did not change, the status is not read again yet
    assert len(await target.endpoints()) == 1 and workload_reads(api, whole) == 1
    now[0] += SCALE_REREAD_S
    assert len(await target.endpoints()) == 2 and workload_reads(api, whole) == 2

    await target.scale(4, reason="up")
    assert scale_patches(api) == [{"replicas": 4}]
    patched = [r for r in list(api) if r.method.value == "PATCH" and str(r.url.path).endswith("/scale")]
    assert [str(r.url.path) for r in patched] == [f"{whole}/scale"]
    assert (find_lws(api, "demo-decode") or {})["spec"]["replicas"] == 4
    assert await target.requested() == 4 and workload_reads(api, whole) == 2  # known from the patch: no read
    # Its owners came with the status read: no GET for the ownership check.
    assert not [r for r in list(api) if "/apis/apps/" in str(r.url.path)]


async def test_a_leader_worker_set_its_service_does_not_own_is_not_scaled(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    know_leader_worker_sets(api)
    ref = await service(api, "demo", MULTINODE)
    await leader_worker_set(api, "demo-decode", 1, ready=1)  # someone else's: no owner reference
    target = KubePool(cluster=cluster, ref=ref, pool="decode", kind=LEADER_WORKER_SET)
    assert await target.requested() == 1
    with pytest.raises(ScaleRefused, match="leaderworkerset ns1/demo-decode has no ownerReference"):
        await target.scale(2, reason="up")
    assert scale_patches(api) == []


def find_lws(api: kmock_lib.KubernetesEmulator, name: str) -> dict[str, Any] | None:
    return find(api, "LeaderWorkerSet", name)


MULTINODE: dict[str, Any] = {
    "model": {"name": "deepseek-ai/DeepSeek-V3"},
    "engine": {"kind": "vllm", "args": ["--enable-expert-parallel"]},
    "decode": {
        "replicas": 1,
        "nodesPerReplica": 2,
        "autoscaling": {
            "enabled": True,
            "min": 1,
            "max": 4,
            "targetKvUtilization": 0.5,
            "stableWindowSeconds": 4,
            "panicWindowSeconds": 2,
            "scaleDownDelaySeconds": 10,
        },
    },
}


@pytest.mark.parametrize("namespaces", [(), (NAMESPACE,)], ids=["cluster-wide", "namespaced"])
async def test_a_loaded_leader_scales_its_leader_worker_set_up_under_the_charts_rbac(
    api: kmock_lib.KubernetesEmulator, namespaces: tuple[str, ...]
) -> None:
    """A multi-node decode pool (one group of 2 pods, ready) whose leader reports a 95% full KV cache:
    the loop scales the LeaderWorkerSet through its scale subresource, with an Event and the status."""
    know_leader_worker_sets(api)
    grants = autoscaler_grants(namespaces)
    assert isinstance(api, StampingEmulator)
    api.authorize = grants.authorizer(made_by=from_the_autoscaler)
    with fake_engine() as engine_url:
        ref = await owned_lws(api, "big", 1, ready=1)
        await endpoint_slice(api, "big-decode", ["127.0.0.1"])  # the leader only: workers serve nothing
        settings = ClusterSettings(
            namespaces=namespaces,
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
            await until(lambda: (find_lws(api, "big-decode") or {})["spec"]["replicas"] >= 2, "scaled")
            await until(lambda: "autoscaling" in isvc(api, "big").get("status", {}), "status written")
        finally:
            stop.set()
            await asyncio.wait_for(task, PATIENCE_S)
    made = accesses(api, made_by=from_the_autoscaler)
    assert grants.refused(made) == [], "the chart's autoscaler RBAC refuses these"
    group = "leaderworkerset.x-k8s.io"
    assert {
        Access(NAMESPACE, group, "leaderworkersets/scale", "patch"),
        Access(NAMESPACE, group, "leaderworkersets", "get"),
    } <= made
    assert not {a for a in made if a.resource.startswith("deployments")}
    # 1 group ready at 0.95 against 0.5, 12 running and 3 waiting: 3 groups, as for a Deployment
    # (tests/autoscaler/test_kube_actuator.py); then 3 asked and 1 ready: held there.
    assert (find_lws(api, "big-decode") or {})["spec"]["replicas"] == 3
    events = [find(api, "Event", n) or {} for n in names(api, "Event")]
    assert [(e.get("reason"), e.get("message", "").split(":")[0]) for e in events] == [
        ("ScaledUp", "decode 1 → 3")
    ]
    decode = isvc(api, "big")["status"]["autoscaling"]["decode"]
    assert (decode["desired"], decode["ready"]) == (3, 1)
    assert ref.name == "big"


async def test_a_leader_whose_group_is_not_whole_is_no_engine(api: kmock_lib.KubernetesEmulator) -> None:
    """The leader's endpoint is ready but its group is not (a worker still starting): nothing to scrape."""
    know_leader_worker_sets(api)
    ref = await owned_lws(api, "demo", 1, ready=0)
    await endpoint_slice(api, "demo-decode", ["127.0.0.1"])
    async with listed(api) as cluster:
        target = KubePool(cluster=cluster, ref=ref, pool="decode", kind=LEADER_WORKER_SET)
        assert await target.endpoints() == []
        assert await target.requested() == 1
