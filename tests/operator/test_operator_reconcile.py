"""One reconcile pass against an in-memory cluster: what is created, patched, skipped, deleted,
and what status and events come out.

Real: tandem.operator.reconcile, the builders, the diff and the status derivation. Faked: the
Kubernetes API, by `MemoryCluster` (a dict implementing the `Cluster` protocol; no defaulting,
no controllers). The same behaviour over HTTP against an emulated API server is in
test_operator_lifecycle.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.operator.specs import IMAGES, OWNER, example

from tandem.operator.cluster import ClusterError
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Outcome, reconcile

NOW = "2026-11-22T03:00:00Z"


class MemoryCluster:
    """A `Cluster` over a dict; records every call; `fail_on` makes requests for a name fail."""

    def __init__(self, *, fail_on: str | None = None, status: int = 500) -> None:
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.status = status

    def _record(self, verb: str, ref: ObjectRef) -> None:
        self.calls.append((verb, f"{ref.kind}/{ref.name}"))
        if ref.name == self.fail_on and verb != "get":
            raise ClusterError(self.status, "injected failure")

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        self._record("get", ref)
        found = self.objects.get(ref)
        return copy.deepcopy(found) if found is not None else None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ref = ObjectRef.of(manifest)
        self._record("create", ref)
        self.objects[ref] = copy.deepcopy(manifest)
        return copy.deepcopy(manifest)

    def patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        self._record("patch", ref)
        self.objects[ref] = _merged(self.objects[ref], patch)
        return copy.deepcopy(self.objects[ref])

    def delete(self, ref: ObjectRef) -> None:
        self._record("delete", ref)
        self.objects.pop(ref, None)

    def writes(self) -> list[tuple[str, str]]:
        return [call for call in self.calls if call[0] != "get"]


def _merged(base: Any, patch: Any) -> Any:
    """RFC 7386: a `null` in the patch removes the field."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merged(result.get(key), value)
    return result


def body(spec: dict[str, Any] | None = None, *, status: dict[str, Any] | None = None) -> dict[str, Any]:
    document = example("local-sim.yaml")
    document["metadata"] = {
        "name": OWNER.name,
        "namespace": OWNER.namespace,
        "uid": OWNER.uid,
        "generation": 1,
    }
    document["spec"] |= spec or {}
    if status is not None:
        document["status"] = status
    return document


def run(cluster: MemoryCluster, document: dict[str, Any]) -> Outcome:
    return reconcile(document, cluster=cluster, images=IMAGES, now=NOW)


def status_dict(outcome: Outcome) -> dict[str, Any]:
    return outcome.status.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_the_first_pass_creates_every_child_and_the_second_changes_nothing() -> None:
    cluster = MemoryCluster()
    first = run(cluster, body())
    assert {a.verb for a in first.actions} == {"created"}
    # 12 workloads, configs and identities; 3 Secrets; 4 NetworkPolicies; 2 PodDisruptionBudgets
    assert len(cluster.objects) == 21
    assert first.error is None

    cluster.calls.clear()
    second = run(cluster, body(status=status_dict(first)))
    assert {a.verb for a in second.actions} == {"unchanged"}
    assert cluster.writes() == []
    assert second.events == []


def test_configuration_and_identity_are_created_before_the_workloads_that_use_them() -> None:
    cluster = MemoryCluster()
    run(cluster, body())
    created = [name for verb, name in cluster.writes() if verb == "create"]
    assert created.index("ConfigMap/demo-router") < created.index("Deployment/demo-router")
    assert created.index("RoleBinding/demo-router") < created.index("Deployment/demo-router")
    assert created.index("Deployment/demo-kv") < created.index("Deployment/demo-prefill")


def test_a_changed_spec_patches_only_what_changed() -> None:
    cluster = MemoryCluster()
    run(cluster, body())
    cluster.calls.clear()
    run(cluster, body({"decode": {"replicas": 4}}))
    assert cluster.writes() == [
        ("patch", "ConfigMap/demo-router"),  # the router's copy of the spec
        ("patch", "Deployment/demo-decode"),
        ("patch", "Deployment/demo-router"),  # its config hash
    ]


def test_leaving_lmcache_removes_the_engine_pods_init_check_and_coming_back_restores_it() -> None:
    cluster = MemoryCluster()
    vllm = {"engine": {"kind": "vllm", "image": "lmcache/vllm-openai:v0.3.9"}}

    def init_containers() -> dict[str, list[str]]:
        found = {}
        for ref, manifest in cluster.objects.items():
            if ref.kind == "Deployment" and ref.name in ("demo-prefill", "demo-decode"):
                pod = manifest["spec"]["template"]["spec"]
                found[ref.name] = [c["name"] for c in pod.get("initContainers", [])]
        return found

    run(cluster, body({**vllm, "kvPool": {"connector": "lmcache"}}))
    assert init_containers() == {"demo-prefill": ["lmcache-check"], "demo-decode": ["lmcache-check"]}
    run(cluster, body({**vllm, "kvPool": {"connector": "tandem"}}))
    assert init_containers() == {"demo-prefill": [], "demo-decode": []}
    cluster.calls.clear()
    run(cluster, body({**vllm, "kvPool": {"connector": "tandem"}}))
    assert cluster.writes() == []
    run(cluster, body({**vllm, "kvPool": {"connector": "lmcache"}}))
    assert init_containers() == {"demo-prefill": ["lmcache-check"], "demo-decode": ["lmcache-check"]}


def test_an_invalid_spec_reports_and_touches_nothing() -> None:
    cluster = MemoryCluster()
    outcome = run(cluster, body({"prefill": {"replicas": 0}, "disaggregation": {"mode": "always"}}))
    assert cluster.calls == []
    assert outcome.status.phase == "Invalid"
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "InvalidSpec")]
    assert "spec.prefill.replicas" in outcome.events[0].message

    again = run(
        cluster,
        body({"prefill": {"replicas": 0}, "disaggregation": {"mode": "always"}}, status=status_dict(outcome)),
    )
    assert again.events == []  # the same problem is reported once


def test_an_object_that_is_not_ours_is_left_alone_and_blocks_ready() -> None:
    cluster = MemoryCluster()
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "demo-router", "namespace": "ns1"},
    }
    cluster.objects[ObjectRef.of(foreign)] = foreign
    outcome = run(cluster, body())
    assert ("patch", "ConfigMap/demo-router") not in cluster.writes()
    assert cluster.objects[ObjectRef.of(foreign)] == foreign
    assert outcome.status.phase == "Blocked"
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "ApplyBlocked")]


def test_objects_no_longer_wanted_are_deleted_only_if_ours() -> None:
    cluster = MemoryCluster()
    run(cluster, body())
    redis_service = ObjectRef("v1", "Service", "ns1", "demo-kv")
    cluster.objects[redis_service]["metadata"]["ownerReferences"] = [{"uid": "other", "controller": True}]
    cluster.calls.clear()
    run(cluster, body({"kvPool": {"redis": {"url": "redis://cache.example:6379"}}}))
    assert ("delete", "Deployment/demo-kv") in cluster.writes()
    assert ("delete", "Service/demo-kv") not in cluster.writes()
    assert redis_service in cluster.objects


@pytest.mark.parametrize(("status", "transient"), [(500, True), (409, True), (403, False), (422, False)])
def test_an_api_error_stops_the_pass_and_is_reported(status: int, transient: bool) -> None:
    cluster = MemoryCluster(fail_on="demo-kv", status=status)
    outcome = run(cluster, body())
    assert outcome.error is not None
    assert outcome.error.transient is transient
    assert not any(name.startswith("Deployment/demo-prefill") for _, name in cluster.calls)
    ready = outcome.status.conditions[0]
    assert (ready.status, ready.reason) == ("False", "ApplyBlocked")
    assert "injected failure" in ready.message
