"""The Kubernetes actuator and the in-cluster loop against an emulated API server.

Real: the autoscaler's HTTP client code (`HttpCluster`, `Informer`), its controllers, reporter and
`run_in_cluster`, a fake engine that is a real HTTP server on 127.0.0.1 serving vLLM metric text, and
`/healthz` and `/metrics` over HTTP. Emulated: the Kubernetes API (kmock with the operator tests'
`StampingEmulator`), where a PATCH of `deployments/<name>/scale` lands on the Deployment itself (as the
real scale subresource changes `spec.replicas`) and nothing plays the Deployment controller, so the
EndpointSlices are the test's own, and so are the pool Deployments, owned by their InferenceService as
the operator's are (an owner reference by uid: the autoscaler scales nothing else,
tests/autoscaler/test_ownership.py); in the scaling story the emulator refuses (403) what the chart's
RBAC does not grant the autoscaler (cluster-wide, or Roles in the watched namespaces;
tests/operator/rbac.py). Waits poll with a generous deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import kmock as kmock_lib
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry
from tests.autoscaler.kube_objects import (
    ISVC_PATH,
    PATIENCE_S,
    create,
    deployment,
    endpoint_slice,
    owned_deployment,
    scale_patches,
    scale_reads,
    service,
    until,
)
from tests.operator.cluster_state import NAMESPACE, find, isvc, names, path_of
from tests.operator.emulator import StampingEmulator
from tests.operator.rbac import Access, Grants, accesses, chart_documents
from tests.servers import run_uvicorn

from tandem.autoscaler.cluster import ServiceRef
from tandem.autoscaler.control import PoolController, PoolOutcome
from tandem.autoscaler.decider import DeciderParams, Decision, DecodeObservation
from tandem.autoscaler.incluster import (
    SCALE_REREAD_S,
    ClusterSettings,
    KubePool,
    KubeReporter,
    run_in_cluster,
)
from tandem.autoscaler.kube import HttpCluster
from tandem.autoscaler.readings import EngineReading
from tandem.core.kubeaccess import KubeAccess


def controller(cluster: HttpCluster, ref: ServiceRef, util: float) -> PoolController:
    """A decode controller whose one engine reports `util` (the scrape is a stub; the target is real)."""

    async def scrape(urls: Any) -> dict[str, EngineReading | None]:
        return {"http://engine-0": EngineReading(kv_usage=util, running=1.0)}

    params = DeciderParams(min=1, max=4, target=0.5, panic_window_s=2.0, stable_window_s=4.0)
    target = KubePool(cluster=cluster, ref=ref, pool="decode")
    return PoolController(
        service=f"{NAMESPACE}/demo", pool="decode", params=params, target=target, scrape=scrape
    )


async def test_the_actuator_patches_the_scale_subresource_only_when_the_decision_differs(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    ref = await service(api)
    await owned_deployment(api, ref, "decode", 1)
    steady = await controller(cluster, ref, util=0.5).step(now=10.0)  # 1 × 0.5 / 0.5 = 1 replica: as is
    assert (steady.previous, steady.desired, steady.direction) == (1, 1, None)
    assert scale_patches(api) == []

    loaded = await controller(cluster, ref, util=1.0).step(now=10.0)  # 1 × 1.0 / 0.5 = 2: panic, up
    assert (loaded.previous, loaded.desired, loaded.direction) == (1, 2, "up")
    assert scale_patches(api) == [{"replicas": 2}]
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 2


async def test_the_scale_is_read_at_most_every_few_seconds_and_known_from_the_last_patch(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    ref = await service(api)
    await owned_deployment(api, ref, "decode", 1)
    now = [100.0]
    target = KubePool(cluster=cluster, ref=ref, pool="decode", clock=lambda: now[0])
    assert await target.requested() == 1 and scale_reads(api) == 1
    now[0] += 0.5  # the next round: from the last read
    assert await target.requested() == 1 and scale_reads(api) == 1
    await target.scale(3, reason="up")  # the patch is what is known now
    now[0] += 0.5
    assert await target.requested() == 3 and scale_reads(api) == 1
    # Someone else scales the Deployment: seen once the last patch is SCALE_REREAD_S old.
    response = await api.patch(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/demo-decode/scale", json={"spec": {"replicas": 2}}
    )
    assert response.status == 200, await response.text()
    now[0] += SCALE_REREAD_S - 0.6
    assert await target.requested() == 3 and scale_reads(api) == 1
    now[0] += 0.2
    assert await target.requested() == 2 and scale_reads(api) == 2


async def test_the_reporter_posts_an_event_and_patches_status_autoscaling(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    document = {"apiVersion": "tandem.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "demo"}}
    await create(api, ISVC_PATH, {**document, "spec": {"model": {"name": "m"}}})
    ref = ServiceRef(NAMESPACE, "demo", isvc(api, "demo")["metadata"]["uid"])
    reporter = KubeReporter(cluster=cluster, refs={ref.key: ref}.get)
    seen = DecodeObservation(timestamp=1.0, ready=2, mean_kv_utilization=0.9)
    outcome = PoolOutcome(
        service=ref.key, pool="decode", observed=seen, decision=Decision(desired=4, reason="panic: wants 4"),
        ready=2, desired=4, panic=True, previous=2, direction="up",
    )  # fmt: skip
    await reporter.report(ref.key, [outcome])

    (event_name,) = names(api, "Event")
    event = find(api, "Event", event_name) or {}
    assert event["reason"] == "ScaledUp" and event["type"] == "Normal"
    assert event["message"] == "decode 2 → 4: panic: wants 4"
    assert event["involvedObject"] == {"apiVersion": "tandem.dev/v1alpha1", "kind": "InferenceService",
                                       "name": "demo", "namespace": NAMESPACE, "uid": ref.uid}  # fmt: skip
    status = isvc(api, "demo")["status"]["autoscaling"]["decode"]
    assert {k: status[k] for k in ("desired", "ready", "reason", "panic")} == {
        "desired": 4, "ready": 2, "reason": "panic: wants 4", "panic": True,
    }  # fmt: skip
    assert status["lastScaleTime"].endswith("Z")

    writes = len([r for r in list(api) if str(r.url.path).endswith("/status")])
    quiet = PoolOutcome(
        service=ref.key, pool="decode", observed=seen, decision=Decision(desired=4, reason="panic: wants 4"),
        ready=2, desired=4, panic=True, previous=4,
    )  # fmt: skip
    await reporter.report(ref.key, [quiet])  # nothing changed: no Event, no status write
    assert len(names(api, "Event")) == 1
    assert len([r for r in list(api) if str(r.url.path).endswith("/status")]) == writes


async def test_giving_up_on_unready_replicas_is_one_warning_event_and_a_false_condition(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    document = {"apiVersion": "tandem.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "demo"}}
    await create(api, ISVC_PATH, {**document, "spec": {"model": {"name": "m"}}})
    ref = ServiceRef(NAMESPACE, "demo", isvc(api, "demo")["metadata"]["uid"])
    reporter = KubeReporter(cluster=cluster, refs={ref.key: ref}.get, status_every_s=0.0)
    seen = DecodeObservation(timestamp=1.0, ready=2, mean_kv_utilization=0.1)

    def outcome(*, unready_s: float | None, gave_up: bool, previous: int) -> PoolOutcome:
        return PoolOutcome(
            service=ref.key, pool="decode", observed=seen, decision=Decision(desired=previous, reason="r"),
            ready=2, desired=previous, panic=False, previous=previous, unready_s=unready_s, gave_up=gave_up,
        )  # fmt: skip

    def condition() -> dict[str, Any]:
        (found,) = isvc(api, "demo")["status"]["autoscaling"]["decode"]["conditions"]
        return dict(found)

    await reporter.report(ref.key, [outcome(unready_s=30.0, gave_up=False, previous=4)])
    assert condition()["status"] == "True" and not names(api, "Event")
    for _ in range(2):  # given up, reported twice: one Event
        await reporter.report(ref.key, [outcome(unready_s=600.0, gave_up=True, previous=4)])
    (event_name,) = names(api, "Event")
    event = find(api, "Event", event_name) or {}
    assert (event["type"], event["reason"]) == ("Warning", "ReplicasNotReady")
    assert event["message"].startswith("decode: 2 of 4 requested replicas not ready after 600 s")
    assert (condition()["status"], condition()["reason"]) == ("False", "ReplicasNotReady")
    await reporter.report(ref.key, [outcome(unready_s=None, gave_up=False, previous=2)])
    assert condition()["status"] == "True" and len(names(api, "Event")) == 1


VLLM_PAGE = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.95
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 12.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
"""


@contextlib.contextmanager
def fake_engine() -> Any:
    """A real HTTP server on 127.0.0.1 whose /metrics says the KV cache is 95% full."""
    app = FastAPI()

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return VLLM_PAGE

    with run_uvicorn(app) as url:
        yield url


SPEC = {
    "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
    "engine": {"kind": "sim"},
    "decode": {
        "replicas": 1,
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


def from_the_autoscaler(request: Any) -> bool:
    """The autoscaler's requests (httpx); the test's own go through kmock's aiohttp client."""
    agent = {k.lower(): v for k, v in request.headers.items()}.get("user-agent", "")
    return "httpx" in agent


def autoscaler_grants(namespaces: tuple[str, ...]) -> Grants:
    """The autoscaler's rights in the chart installed to watch `namespaces` (empty: every one)."""
    values = {
        "autoscaler": {"enabled": True},
        "operator": {"watchNamespaces": list(namespaces), "clusterWide": not namespaces},
    }
    return Grants(chart_documents(values), account="tandem-autoscaler")


@pytest.mark.parametrize("namespaces", [(), (NAMESPACE, "team-b")], ids=["cluster-wide", "namespaced"])
async def test_a_loaded_engine_behind_an_endpointslice_scales_its_deployment_up(
    api: kmock_lib.KubernetesEmulator, namespaces: tuple[str, ...]
) -> None:
    # The autoscaler runs under the chart's RBAC: the emulated API server refuses (403) the rest.
    grants = autoscaler_grants(namespaces)
    assert isinstance(api, StampingEmulator)
    api.authorize = grants.authorizer(made_by=from_the_autoscaler)
    try:
        await scale_up_story(api, namespaces)
    finally:  # a refusal explains a stalled story better than the timeout does
        made = accesses(api, made_by=from_the_autoscaler)
        denied = grants.refused(made)
        assert denied == [], f"the chart's autoscaler RBAC refuses: {denied}"
    assert {
        Access(NAMESPACE, "apps", "deployments/scale", "patch"),
        Access(NAMESPACE, "apps", "deployments", "get"),  # its ownerReferences, before the first patch
        Access(NAMESPACE, "", "events", "create"),
    } <= made
    # It watched InferenceServices and EndpointSlices where the chart says: everywhere, or in each
    # namespace the chart names.
    for plural in ("inferenceservices", "endpointslices"):
        watched = {a.namespace for a in made if a.resource == plural and a.verb == "watch"}
        assert watched == set(namespaces or [None]), plural


async def scale_up_story(api: kmock_lib.KubernetesEmulator, namespaces: tuple[str, ...]) -> None:
    """A loaded engine behind an EndpointSlice: its Deployment is scaled up, with an Event, the
    status and the metrics saying so."""
    with fake_engine() as engine_url:
        engine_port = int(engine_url.rsplit(":", 1)[1])
        ref = await service(api, "demo", SPEC)
        await owned_deployment(api, ref, "decode", 1)
        await endpoint_slice(api, "demo-decode", ["127.0.0.1"])
        settings = ClusterSettings(
            namespaces=namespaces,
            interval_s=0.2,
            metrics_host="127.0.0.1",
            metrics_port=0,
            engine_port=engine_port,
        )
        stop, ports = asyncio.Event(), list[int]()
        registry = CollectorRegistry()
        access = KubeAccess.plain(str(api.url))
        task = asyncio.create_task(
            run_in_cluster(settings, access=access, stop=stop, registry=registry, on_listening=ports.append)
        )
        try:
            await until(
                lambda: (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] >= 2, "scaled"
            )
            await until(lambda: "autoscaling" in isvc(api, "demo").get("status", {}), "status written")
            async with httpx.AsyncClient(trust_env=False) as client:
                health = await client.get(f"http://127.0.0.1:{ports[0]}/healthz")
                metrics = await client.get(f"http://127.0.0.1:{ports[0]}/metrics")
        finally:
            stop.set()
            await asyncio.wait_for(task, PATIENCE_S)
    # 1 ready at 0.95 against 0.5 → 1.9 (panic: ≥ 2 × 1); the requests there, 12 running and 3
    # waiting, at c* = 0.5 × 12 / 0.95 = 6.3 each → 2.4 → 3 (the occupancy demand); then 3 requested
    # but 1 ready: held there
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 3
    reasons = [(find(api, "Event", n) or {}).get("reason") for n in names(api, "Event")]
    assert reasons == ["ScaledUp"]
    decode = isvc(api, "demo")["status"]["autoscaling"]["decode"]
    assert decode["desired"] == 3 and decode["ready"] == 1 and "lastScaleTime" in decode
    assert health.status_code == 200 and health.text == "ok\n"
    assert 'tandem_autoscaler_desired_replicas{pool="decode",service="ns1/demo"} 3.0' in metrics.text
    assert path_of("Deployment", "demo-decode") + "/scale" in {str(r.url.path) for r in list(api)}


async def test_the_loop_leaves_a_deployment_it_does_not_own_alone_and_counts_the_refusals(
    api: kmock_lib.KubernetesEmulator,
) -> None:
    """A loaded engine behind an EndpointSlice, but `demo-decode` is someone else's Deployment (no
    owner reference to the InferenceService): the loop wants more replicas every round and never
    patches it; /metrics counts the refusals, and the Deployment is read whole once."""
    with fake_engine() as engine_url:
        await service(api, "demo", SPEC)
        await deployment(api, "demo-decode", 1)
        await endpoint_slice(api, "demo-decode", ["127.0.0.1"])
        settings = ClusterSettings(
            interval_s=0.2,
            metrics_host="127.0.0.1",
            metrics_port=0,
            engine_port=int(engine_url.rsplit(":", 1)[1]),
        )
        stop, ports, registry = asyncio.Event(), list[int](), CollectorRegistry()
        access = KubeAccess.plain(str(api.url))
        task = asyncio.create_task(
            run_in_cluster(settings, access=access, stop=stop, registry=registry, on_listening=ports.append)
        )
        refused = (
            "tandem_autoscaler_scale_refused_total",
            {"service": f"{NAMESPACE}/demo", "pool": "decode"},
        )
        try:
            await until(lambda: (registry.get_sample_value(*refused) or 0) >= 3, "three refusals")
            async with httpx.AsyncClient(trust_env=False) as client:
                metrics = await client.get(f"http://127.0.0.1:{ports[0]}/metrics")
        finally:
            stop.set()
            await asyncio.wait_for(task, PATIENCE_S)
    assert 'tandem_autoscaler_scale_refused_total{pool="decode",service="ns1/demo"}' in metrics.text
    assert scale_patches(api) == []
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 1
    assert names(api, "Event") == set()
    whole = path_of("Deployment", "demo-decode")
    assert sum(1 for r in list(api) if r.method.value == "GET" and str(r.url.path) == whole) == 1


@contextlib.contextmanager
def fake_gateway(held: int) -> Any:
    """A real HTTP server on 127.0.0.1 whose /metrics says the gateway holds `held` requests for want of
    a decode engine (the router's `tandem_router_held_requests`)."""
    app = FastAPI()

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return f"# TYPE tandem_router_held_requests gauge\ntandem_router_held_requests {held}\n"

    with run_uvicorn(app) as url:
        yield url


async def test_requests_held_by_the_gateway_scale_a_decode_pool_from_zero(
    api: kmock_lib.KubernetesEmulator,
) -> None:
    """Decode at 0 replicas (min 0), no decode engine anywhere, the gateway holding 3 requests behind
    its EndpointSlice: the loop asks the Deployment for its first replica, with an Event."""
    with fake_gateway(held=3) as gateway_url:
        scaling = {"enabled": True, "min": 0, "max": 4, "targetKvUtilization": 0.5}
        spec = {**SPEC, "decode": {"replicas": 0, "autoscaling": scaling}}
        ref = await service(api, "zero", spec)
        await owned_deployment(api, ref, "decode", 0)
        await endpoint_slice(api, "zero-router", ["127.0.0.1"])
        settings = ClusterSettings(
            interval_s=0.2,
            metrics_host="127.0.0.1",
            metrics_port=0,
            router_port=int(gateway_url.rsplit(":", 1)[1]),
        )
        stop = asyncio.Event()
        access = KubeAccess.plain(str(api.url))
        task = asyncio.create_task(
            run_in_cluster(settings, access=access, stop=stop, registry=CollectorRegistry())
        )
        try:
            await until(
                lambda: (find(api, "Deployment", "zero-decode") or {})["spec"]["replicas"] >= 1, "scaled"
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, PATIENCE_S)
    assert (find(api, "Deployment", "zero-decode") or {})["spec"]["replicas"] == 1
    events = [find(api, "Event", n) or {} for n in names(api, "Event")]
    assert [e.get("reason") for e in events] == ["ScaledUp"]
    assert "decode 0 → 1" in events[0].get("message", "")
