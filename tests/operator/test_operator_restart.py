"""Operator faults and bad input: restarts that must not rewrite children, and InferenceServices the
operator must refuse with a condition and an Event naming the field.

Real: the operator as `tandem operator` runs it (kopf, handlers, Tandem's Kubernetes client, builders,
reconcile) over HTTP on 127.0.0.1; a restart stops that operator (thread and event loop) and starts
a fresh one against the same stored objects. Emulated: the API server (kmock + StampingEmulator),
which, unlike a real one, validates nothing: that is what lets the structural cases below reach the
operator, as they would through a CRD older than the operator (Helm never upgrades CRDs). The
Deployment controller is played by `mark_ready`. Timeouts guard against hangs; nothing asserts on
speed.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kmock as kmock_lib
import pytest
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually

from tandem.operator.crd import crd_manifest

Restart = Callable[[], Awaitable[None]]
DEMO: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"},
        "engine": {"kind": "sim"},
        "prefill": {"replicas": 1},
        "decode": {"replicas": 2, "autoscaling": {"enabled": True, "min": 1, "max": 8}},
        "router": {"replicas": 1},
    },
}
DEPLOYMENTS = ("demo-prefill", "demo-decode", "demo-kv", "demo-router")


async def ready_demo(api: kmock_lib.KubernetesEmulator) -> None:
    """Create `demo`, play the Deployment controller, wait until Ready."""
    await k8s.apply(api, copy.deepcopy(DEMO))
    await eventually(
        lambda: {n for k, n in k8s.children(api) if k == "Deployment"} >= set(DEPLOYMENTS), "children"
    )
    for name in DEPLOYMENTS:
        await k8s.mark_ready(api, name)
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("status") == "True", "Ready")


def versions(api: kmock_lib.KubernetesEmulator) -> dict[tuple[str, str], str]:
    """resourceVersion of every child: any write to a child changes its version."""
    result = {}
    for kind, name in k8s.children(api):
        child = k8s.find(api, kind, name)
        assert child is not None
        result[(kind, name)] = child["metadata"]["resourceVersion"]
    return result


async def reconciles(api: kmock_lib.KubernetesEmulator, *, count: int, since: int) -> None:
    """Wait until the router Deployment was read `count` times after request `since` (every
    reconcile reads it at least once)."""
    await eventually(
        lambda: k8s.reads(api, "Deployment", "demo-router", since=since) >= count, f"{count} reconciles"
    )


def isvc_writes(api: kmock_lib.KubernetesEmulator, *, since: int) -> list[Any]:
    """Writes to the InferenceService itself (kopf's bookkeeping and the status) since `since`."""
    resource = kmock_lib.resource(k8s.ISVC)
    return [
        r
        for r in list(api)[since:]
        if r.resource == resource and r.method.value in ("POST", "PATCH", "PUT", "DELETE")
    ]


async def test_a_restarted_operator_writes_no_child_and_leaves_the_spec_and_status_alone(
    api: kmock_lib.KubernetesEmulator, operator: Restart
) -> None:
    await ready_demo(api)
    await reconciles(api, count=1, since=k8s.mark(api))  # settled: the last write is behind us
    before, generation = versions(api), k8s.isvc(api, "demo")["metadata"]["generation"]
    status = copy.deepcopy(k8s.isvc(api, "demo")["status"])
    since = k8s.mark(api)  # counted from before the stop: the new operator's first pass included

    await operator()
    await reconciles(api, count=6, since=since)

    assert k8s.writes(api, since=since) == []
    assert versions(api) == before
    assert k8s.isvc(api, "demo")["metadata"]["generation"] == generation
    assert k8s.isvc(api, "demo")["status"] == status  # not even lastTransitionTime moved
    for request in isvc_writes(api, since=since):  # at most kopf's own bookkeeping, never spec
        assert "spec" not in (request.data or {}), request.data


async def test_a_replica_count_the_autoscaler_set_survives_an_operator_restart(
    api: kmock_lib.KubernetesEmulator, operator: Restart
) -> None:
    await ready_demo(api)
    await k8s.patch_object(api, "Deployment", "demo-decode", {"spec": {"replicas": 6}})
    since = k8s.mark(api)

    await operator()
    await reconciles(api, count=6, since=since)

    assert (k8s.find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 6
    assert k8s.writes(api, since=since) == []


async def test_a_child_deleted_while_the_operator_was_down_is_the_only_thing_recreated(
    api: kmock_lib.KubernetesEmulator, operator: Restart
) -> None:
    await ready_demo(api)
    await reconciles(api, count=1, since=k8s.mark(api))
    response = await api.delete(k8s.path_of("Service", "demo-prefill"))
    assert response.status == 200
    since = k8s.mark(api)

    await operator()
    await eventually(lambda: k8s.find(api, "Service", "demo-prefill") is not None, "Service recreated")
    await reconciles(api, count=6, since=since)

    assert k8s.writes(api, since=since) == [("POST", "Service", "demo-prefill")]


async def test_a_spec_changed_while_the_operator_was_down_patches_only_what_it_affects(
    api: kmock_lib.KubernetesEmulator, operator: Restart
) -> None:
    await ready_demo(api)
    await reconciles(api, count=1, since=k8s.mark(api))
    since = k8s.mark(api)
    await k8s.patch_spec(api, "demo", {"prefill": {"replicas": 3}})

    await operator()
    await eventually(
        lambda: (k8s.find(api, "Deployment", "demo-prefill") or {})["spec"]["replicas"] == 3, "prefill at 3"
    )
    await reconciles(api, count=6, since=since)

    written = k8s.writes(api, since=since)
    assert ("PATCH", "Deployment", "demo-prefill") in written
    assert {verb for verb, _, _ in written} == {"PATCH"}
    untouched = {("Deployment", "demo-decode"), ("Deployment", "demo-kv"), ("Service", "demo-prefill")}
    assert not untouched & {(kind, name) for _, kind, name in written}


# ------------------------------------------------------------------------------------------ bad input


def _events(api: kmock_lib.KubernetesEmulator, name: str) -> list[dict[str, Any]]:
    found = [obj for n in k8s.names(api, "Event") if (obj := k8s.find(api, "Event", n))]
    return [
        e
        for e in found
        if e.get("involvedObject", {}).get("name") == name
        and (e.get("type"), e.get("reason")) == ("Warning", "InvalidSpec")
    ]


async def assert_refused(api: kmock_lib.KubernetesEmulator, name: str, field: str) -> None:
    """Ready=False/InvalidSpec and one Warning Event, both naming `field`; no child made."""
    await eventually(lambda: k8s.condition(api, name, "Ready").get("reason") == "InvalidSpec", "InvalidSpec")
    ready = k8s.condition(api, name, "Ready")
    assert ready["status"] == "False"
    assert field in ready["message"], ready["message"]
    assert k8s.isvc(api, name)["status"]["phase"] == "Invalid"
    await eventually(lambda: bool(_events(api, name)), "a Warning Event")
    (event,) = _events(api, name)
    assert field in event["message"], event["message"]
    assert k8s.children(api) == set()


def crd_schema_errors(document: dict[str, Any]) -> list[str]:
    """What the current CRD's openAPIV3Schema says about `document` (the API server's check;
    `nullable` and the `x-kubernetes-*` keys are not understood here and not needed)."""
    (version,) = crd_manifest()["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(schema)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(document)]


CROSS_FIELD = {
    "auth without a key table": ({"router": {"auth": {"enabled": True}}}, "spec.router.auth.apiKeysSecret"),
    "always disaggregate with no prefill": (
        {"disaggregation": {"mode": "always"}, "prefill": {"replicas": 0}},
        "spec.prefill.replicas",
    ),
    "duplicate tenants": (
        {"router": {"tenants": [{"name": "gold"}, {"name": "gold"}]}},
        "spec.router.tenants[1].name",
    ),
}


@pytest.mark.parametrize("case", sorted(CROSS_FIELD))
async def test_a_new_service_breaking_a_cross_field_rule_is_refused_naming_the_field(
    api: kmock_lib.KubernetesEmulator, operator: Restart, case: str
) -> None:
    overrides, field = CROSS_FIELD[case]
    document = copy.deepcopy(DEMO)
    document["spec"] |= overrides
    assert crd_schema_errors(document) == []  # the API server lets it through: only the operator can say no
    await k8s.apply(api, document)
    await assert_refused(api, "demo", field)


STRUCTURAL = {
    "a policy the CRD's enum does not list": ({"router": {"policy": "random"}}, "spec.router.policy"),
    "replicas as a string": ({"decode": {"replicas": "two"}}, "spec.decode.replicas"),
    "a negative chunk size": ({"kvPool": {"chunkSize": -256}}, "spec.kvPool.chunkSize"),
}


@pytest.mark.parametrize("case", sorted(STRUCTURAL))
async def test_a_structurally_invalid_service_that_reaches_the_operator_is_refused_naming_the_field(
    api: kmock_lib.KubernetesEmulator, operator: Restart, case: str
) -> None:
    overrides, field = STRUCTURAL[case]
    document = copy.deepcopy(DEMO)
    document["spec"] |= overrides
    # The current CRD rejects it at the API server; an older CRD (or none, as in this emulator) may not.
    assert any(e.startswith(f"{field}: ") for e in crd_schema_errors(document)), crd_schema_errors(document)
    await k8s.apply(api, document)
    await assert_refused(api, "demo", field)


async def test_fixing_a_refused_service_creates_its_children(
    api: kmock_lib.KubernetesEmulator, operator: Restart
) -> None:
    document = copy.deepcopy(DEMO)
    document["spec"]["router"] = {"replicas": 1, "auth": {"enabled": True}}
    await k8s.apply(api, document)
    await assert_refused(api, "demo", "spec.router.auth.apiKeysSecret")
    await k8s.patch_spec(api, "demo", {"router": {"auth": {"enabled": False}}})
    await eventually(lambda: k8s.find(api, "Deployment", "demo-router") is not None, "children created")
    await eventually(
        lambda: k8s.condition(api, "demo", "Ready").get("reason") != "InvalidSpec", "InvalidSpec cleared"
    )
