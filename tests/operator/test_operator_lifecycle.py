"""The operator's stories against an emulated Kubernetes API.

Real: the operator process as `tandem operator` runs it (kopf, our registry and handlers, the
`kubernetes` client, builders and reconcile) over HTTP on 127.0.0.1. Emulated: the API server
(kmock + StampingEmulator, including the garbage collector); the Deployment controller is played
by `mark_ready`. Timeouts guard against hangs; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

import kmock as kmock_lib
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, RESYNC_SECONDS, eventually

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


async def ready_demo(api: kmock_lib.KubernetesEmulator, spec: dict[str, Any] | None = None) -> None:
    """Create `demo` (optionally with spec overrides), play the controllers, wait until Ready."""
    document = copy.deepcopy(DEMO)
    document["spec"] |= spec or {}
    await k8s.apply(api, document)
    await eventually(lambda: k8s.children(api) >= EXPECTED_CHILDREN, "every child")
    for name in DEPLOYMENTS:
        await k8s.mark_ready(api, name)
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("status") == "True", "Ready")


async def reconciles(api: kmock_lib.KubernetesEmulator, *, count: int, since: int) -> None:
    """Wait until the operator has reconciled at least `count` more times (each reconcile reads
    every child once; the router Deployment is read last)."""
    await eventually(
        lambda: k8s.reads(api, "Deployment", "demo-router", since=since) >= count,
        f"{count} reconciles",
    )


async def test_changing_args_replicas_and_router_weights_patches_only_the_affected_children(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    since = k8s.mark(api)
    await k8s.patch_spec(
        api,
        "demo",
        {
            "engine": {"kind": "sim", "args": ["--max-num-seqs", "64"]},
            "decode": {"replicas": 3},
            "router": {"replicas": 1, "scoring": {"prefix": 5}},
        },
    )
    await eventually(
        lambda: (k8s.find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 3,
        "decode scaled to 3",
    )
    await reconciles(api, count=2, since=since)

    patched = {(kind, name) for verb, kind, name in k8s.writes(api, since=since)}
    assert patched == {
        ("Deployment", "demo-prefill"),  # args
        ("Deployment", "demo-decode"),  # args and replicas
        ("ConfigMap", "demo-router"),  # the spec it carries: scoring weights, args, replicas
        ("Deployment", "demo-router"),  # config hash: the router pods roll
    }  # untouched: the Services, Redis, the router's identity
    assert {verb for verb, _, _ in k8s.writes(api, since=since)} == {"PATCH"}
    decode = k8s.find(api, "Deployment", "demo-decode")
    assert decode is not None
    assert decode["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == [
        "--max-num-seqs",
        "64",
    ]
    router_config = (k8s.find(api, "ConfigMap", "demo-router") or {})["data"]["router.yaml"]
    assert "prefix: 5.0" in router_config
    await eventually(lambda: k8s.isvc(api, "demo")["status"].get("observedGeneration") == 2, "generation 2")
    assert k8s.isvc(api, "demo")["status"]["decode"]["replicas"] == 3


async def test_with_autoscaling_on_a_replica_count_set_by_someone_else_survives_reconciles(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    autoscaled = {"decode": {"replicas": 2, "autoscaling": {"enabled": True, "min": 1, "max": 8}}}
    await ready_demo(api, autoscaled)
    assert (k8s.find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 2

    await k8s.patch_object(api, "Deployment", "demo-decode", {"spec": {"replicas": 5}})
    since = k8s.mark(api)
    await reconciles(api, count=3, since=since)

    assert (k8s.find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 5
    assert ("PATCH", "Deployment", "demo-decode") not in k8s.writes(api, since=since)
    await eventually(lambda: k8s.isvc(api, "demo")["status"]["decode"]["summary"] == "2/5", "status 2/5")


async def test_without_autoscaling_the_operator_restores_a_replica_count_changed_by_hand(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    await k8s.patch_object(api, "Deployment", "demo-decode", {"spec": {"replicas": 5}})
    await eventually(
        lambda: (k8s.find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 2,
        "decode back to 2",
    )


async def test_an_invalid_cross_field_spec_sets_a_condition_and_an_event_and_changes_no_child(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    since = k8s.mark(api)
    await k8s.patch_spec(api, "demo", {"decode": {"autoscaling": {"min": 9, "max": 4}}})
    await eventually(
        lambda: k8s.condition(api, "demo", "Ready").get("reason") == "InvalidSpec", "InvalidSpec"
    )
    ready = k8s.condition(api, "demo", "Ready")
    assert ready["status"] == "False"
    assert "spec.decode.autoscaling.min" in ready["message"]
    assert k8s.isvc(api, "demo")["status"]["phase"] == "Invalid"
    await eventually(lambda: any(_is_invalid_spec_event(e) for e in _events(api)), "Event")

    await reconciles_while_invalid(api, since=since)
    assert k8s.writes(api, since=since) == []
    assert len([e for e in _events(api) if _is_invalid_spec_event(e)]) == 1


async def reconciles_while_invalid(api: kmock_lib.KubernetesEmulator, *, since: int) -> None:
    """Let several resync periods pass. A reconcile of an invalid spec sends no request at all
    (that is the point), so there is nothing to count; the sleep only gives it the chance."""
    await asyncio.sleep(RESYNC_SECONDS * 5)


def _events(api: kmock_lib.KubernetesEmulator) -> list[dict[str, Any]]:
    return [obj for name in k8s.names(api, "Event") if (obj := k8s.find(api, "Event", name))]


def _is_invalid_spec_event(event: dict[str, Any]) -> bool:
    return (
        event.get("type") == "Warning"
        and event.get("reason") == "InvalidSpec"
        and event.get("involvedObject", {}).get("name") == "demo"
    )


async def test_deleting_the_service_lets_the_garbage_collector_remove_every_child(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    await k8s.delete(api, "demo")
    await eventually(lambda: k8s.find(api, "InferenceService", "demo") is None, "service gone")
    await eventually(lambda: k8s.children(api) == set(), "children gone")


async def test_a_restarted_operator_rewrites_no_child(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    await operator()  # restart
    since = k8s.mark(api)
    await reconciles(api, count=3, since=since)
    assert k8s.writes(api, since=since) == []
    assert k8s.condition(api, "demo", "Ready").get("status") == "True"


async def test_switching_to_an_external_redis_removes_the_managed_one(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    await ready_demo(api)
    await k8s.patch_spec(api, "demo", {"kvPool": {"redis": {"url": "redis://cache.example:6379"}}})
    await eventually(lambda: k8s.find(api, "Deployment", "demo-kv") is None, "Redis deleted")
    assert k8s.find(api, "Service", "demo-kv") is None
    decode = k8s.find(api, "Deployment", "demo-decode") or {}
    assert "redis://cache.example:6379" in decode["spec"]["template"]["spec"]["containers"][0]["args"]
    await eventually(
        lambda: k8s.condition(api, "demo", "KVPoolReady").get("reason") == "ExternalRedis",
        "KVPoolReady from the external URL",
    )


async def test_leaving_lmcache_removes_the_engine_pods_init_check_over_http(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    """The merge patch's `null` reaches the API server and removes the LMCache check's init container,
    and later reconciles leave it removed (no patch on every pass)."""

    def init_containers(name: str) -> list[str] | None:
        found = k8s.find(api, "Deployment", name)
        if found is None:
            return None
        return [c["name"] for c in found["spec"]["template"]["spec"].get("initContainers", [])]

    vllm = {"engine": {"kind": "vllm", "image": "lmcache/vllm-openai:v0.3.9"}}
    await ready_demo(api, {**vllm, "kvPool": {"redis": {"memory": "1Gi"}, "connector": "lmcache"}})
    assert init_containers("demo-decode") == init_containers("demo-prefill") == ["lmcache-check"]
    await k8s.patch_spec(api, "demo", {"kvPool": {"connector": "tandem"}})
    await eventually(
        lambda: init_containers("demo-decode") == [] and init_containers("demo-prefill") == [],
        "the check is gone",
    )
    await eventually(lambda: k8s.find(api, "ConfigMap", "demo-lmcache") is None, "LMCache's config gone")
    settled = k8s.mark(api)
    await reconciles(api, count=1, since=settled)  # the pass that made those changes ends
    since = k8s.mark(api)
    await reconciles(api, count=3, since=since)
    assert k8s.writes(api, since=since) == []


async def test_an_object_in_the_way_that_the_service_does_not_own_is_left_untouched(
    api: kmock_lib.KubernetesEmulator, operator: Callable[[], Awaitable[None]]
) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-router", "namespace": NAMESPACE},
        "data": {"owner": "someone else"},
    }
    response = await api.post(f"/api/v1/namespaces/{NAMESPACE}/configmaps", json=foreign)
    assert response.status == 200
    await k8s.apply(api, copy.deepcopy(DEMO))
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("reason") == "ApplyBlocked", "blocked")
    assert "ConfigMap ns1/demo-router" in k8s.condition(api, "demo", "Ready")["message"]
    assert (k8s.find(api, "ConfigMap", "demo-router") or {})["data"] == {"owner": "someone else"}
    assert k8s.isvc(api, "demo")["status"]["phase"] == "Blocked"
