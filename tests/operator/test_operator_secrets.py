"""The Secrets of a service: the Redis password and the engine API key are always there (generated once
when the spec names none, never rotated by a reconcile), only the gateway gets the engine key, and a
Secret the spec names is used only when it is labelled usable.

Real: the reconcile, the builders and the spec model. Faked: the API server, an in-memory `Cluster`
(test_operator_reconcile.MemoryCluster) that records every call.
"""

from __future__ import annotations

import base64
from typing import Any

from tests.operator.specs import IMAGES, OWNER, gpu
from tests.operator.test_operator_reconcile import NOW, MemoryCluster, body, status_dict

from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Outcome, reconcile
from tandem.operator.resources import desired_children

KV_AUTH = ObjectRef("v1", "Secret", OWNER.namespace, "demo-kv-auth")
ENGINE_KEY = ObjectRef("v1", "Secret", OWNER.namespace, "demo-engine-key")


def run(cluster: MemoryCluster, document: dict[str, Any], value: str) -> Outcome:
    return reconcile(document, cluster=cluster, images=IMAGES, now=NOW, new_value=lambda: value)


def decoded(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def env_of(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in container.get("env", [])}


def test_generated_secrets_are_drawn_once_and_a_later_reconcile_never_rotates_them() -> None:
    cluster = MemoryCluster()
    first = run(cluster, body(), "first-value")
    assert decoded(cluster.objects[KV_AUTH], "password") == "first-value"
    assert decoded(cluster.objects[ENGINE_KEY], "api-key") == "first-value"
    run(cluster, body(status=status_dict(first)), "second-value")
    assert decoded(cluster.objects[KV_AUTH], "password") == "first-value"
    assert ("patch", "Secret/demo-kv-auth") not in cluster.calls


def test_a_deleted_generated_secret_is_created_again_with_a_new_value() -> None:
    cluster = MemoryCluster()
    first = run(cluster, body(), "first-value")
    del cluster.objects[KV_AUTH]
    run(cluster, body(status=status_dict(first)), "second-value")
    assert decoded(cluster.objects[KV_AUTH], "password") == "second-value"


def test_only_the_gateway_and_the_engines_get_the_engine_key_each_under_its_own_variable() -> None:
    manifests = {
        (c.ref.kind, c.ref.name): c.manifest for c in desired_children(gpu(), owner=OWNER, images=IMAGES)
    }
    key = {"secretKeyRef": {"name": "demo-engine-key", "key": "api-key"}}
    assert env_of(manifests["Deployment", "demo-router"])["TANDEM_ENGINE_API_KEY"] == key
    for engine in ("demo-prefill", "demo-decode"):
        assert env_of(manifests["Deployment", engine])["VLLM_API_KEY"] == key
        assert not any(
            "engine-key" in arg
            for arg in manifests["Deployment", engine]["spec"]["template"]["spec"]["containers"][0]["args"]
        )
    assert "VLLM_API_KEY" not in env_of(manifests["Deployment", "demo-kv"])
    assert "TANDEM_ENGINE_API_KEY" not in env_of(manifests["Deployment", "demo-kv"])


def test_a_spec_naming_an_unlabelled_secret_is_refused_with_a_condition_an_event_and_no_write() -> None:
    cluster = MemoryCluster()
    someone_elses = {
        "metadata": {"name": "db-root", "namespace": OWNER.namespace},
        "data": {"password": "cw=="},
    }
    cluster.objects[ObjectRef("v1", "Secret", OWNER.namespace, "db-root")] = someone_elses
    spec = {"kvPool": {"redis": {"passwordSecret": {"name": "db-root", "key": "password"}}}}
    outcome = run(cluster, body(spec), "x")
    ready = next(c for c in outcome.status.conditions if c.type == "Ready")
    assert (outcome.status.phase, ready.status, ready.reason) == ("Blocked", "False", "SecretRefused")
    assert (
        "spec.kvPool.redis.passwordSecret: Secret 'db-root' lacks the label tandem.dev/usable"
        in ready.message
    )
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "SecretRefused")]
    assert cluster.writes() == []


def test_a_missing_secret_is_refused_and_a_labelled_one_is_used() -> None:
    cluster = MemoryCluster()
    spec = {"engine": {"kind": "sim", "apiKeySecret": {"name": "engine-key", "key": "key"}}}
    outcome = run(cluster, body(spec), "x")
    assert (
        "spec.engine.apiKeySecret: Secret 'engine-key' does not exist" in outcome.status.conditions[0].message
    )
    labelled = {
        "metadata": {"name": "engine-key", "labels": {"tandem.dev/usable": "true"}},
        "data": {"key": "aw=="},
    }
    cluster.objects[ObjectRef("v1", "Secret", OWNER.namespace, "engine-key")] = labelled
    outcome = run(cluster, body(spec), "x")
    assert outcome.status.phase != "Blocked"
    assert ENGINE_KEY not in cluster.objects  # the spec's own key: none generated
    router = cluster.objects[ObjectRef("apps/v1", "Deployment", OWNER.namespace, "demo-router")]
    assert env_of(router)["TANDEM_ENGINE_API_KEY"] == {"secretKeyRef": {"name": "engine-key", "key": "key"}}
