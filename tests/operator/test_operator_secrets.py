"""The Secrets of a service: the Redis password, the engine API key and the cache keys are always there
(generated once when the spec names none, never rotated by a reconcile), only the gateway gets the
engine key and the salt key, engines and the gateway get the pool key, and a Secret the spec names is
used only when it is labelled usable.

Real: the reconcile, the builders and the spec model. Faked: the API server, an in-memory `Cluster`
(test_operator_reconcile.MemoryCluster) that records every call.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.operator.specs import IMAGES, OWNER, gpu, sim
from tests.operator.test_operator_reconcile import NOW, MemoryCluster, body, status_dict

from tandem.cli.main import cli
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Outcome, reconcile
from tandem.operator.resources import desired_children

KV_AUTH = ObjectRef("v1", "Secret", OWNER.namespace, "demo-kv-auth")
ENGINE_KEY = ObjectRef("v1", "Secret", OWNER.namespace, "demo-engine-key")
CACHE_KEYS = ObjectRef("v1", "Secret", OWNER.namespace, "demo-cache-keys")
POOL_KEY = {"secretKeyRef": {"name": "demo-cache-keys", "key": "pool-key"}}
SALT_KEY = {"secretKeyRef": {"name": "demo-cache-keys", "key": "salt-key"}}


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


def test_the_cache_keys_secret_holds_two_keys_drawn_apart_labelled_usable_and_owned() -> None:
    cluster = MemoryCluster()
    draws = iter(f"value-{n}" for n in range(100))
    reconcile(body(), cluster=cluster, images=IMAGES, now=NOW, new_value=lambda: next(draws))
    secret = cluster.objects[CACHE_KEYS]
    assert set(secret["data"]) == {"pool-key", "salt-key"}
    assert decoded(secret, "pool-key") != decoded(secret, "salt-key")
    assert secret["metadata"]["labels"]["tandem.dev/usable"] == "true"
    assert secret["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert secret["type"] == "Opaque"


def test_the_cache_keys_are_drawn_once_and_created_again_only_when_deleted() -> None:
    cluster = MemoryCluster()
    first = run(cluster, body(), "first-value")
    run(cluster, body(status=status_dict(first)), "second-value")
    assert decoded(cluster.objects[CACHE_KEYS], "pool-key") == "first-value"
    assert ("patch", "Secret/demo-cache-keys") not in cluster.calls
    del cluster.objects[CACHE_KEYS]
    run(cluster, body(status=status_dict(first)), "third-value")
    assert decoded(cluster.objects[CACHE_KEYS], "salt-key") == "third-value"


@pytest.mark.parametrize("spec", [gpu(), sim(), gpu(kvPool={"redis": {"url": "redis://cache.example:6379"}})])
def test_engines_and_the_gateway_get_the_pool_key_and_only_the_gateway_the_salt_key(
    spec: InferenceServiceSpec,
) -> None:
    manifests = {
        (c.ref.kind, c.ref.name): c.manifest for c in desired_children(spec, owner=OWNER, images=IMAGES)
    }
    router = env_of(manifests["Deployment", "demo-router"])
    assert (router["TANDEM_KV_POOL_KEY"], router["TANDEM_CACHE_KEY"]) == (POOL_KEY, SALT_KEY)
    for engine in ("demo-prefill", "demo-decode"):
        pod = manifests["Deployment", engine]["spec"]["template"]["spec"]
        assert env_of(manifests["Deployment", engine])["TANDEM_KV_POOL_KEY"] == POOL_KEY
        assert "TANDEM_CACHE_KEY" not in env_of(manifests["Deployment", engine])
        assert "salt-key" not in json.dumps(pod)  # not in args, init containers or volumes either
    if ("Deployment", "demo-kv") in manifests:
        assert "cache-keys" not in json.dumps(manifests["Deployment", "demo-kv"])
    for kind, name in manifests:
        if kind == "ConfigMap":
            assert "cache-keys" not in json.dumps(manifests[kind, name])


def test_tandem_render_shows_the_cache_keys_secret_and_its_references() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "local-sim.yaml"
    result = CliRunner().invoke(cli, ["render", "-f", str(example)])
    assert result.exit_code == 0, result.output
    manifests = [m for m in yaml.safe_load_all(result.output) if m]
    name = next(m for m in manifests if m["kind"] == "Deployment")["metadata"]["labels"][
        "app.kubernetes.io/instance"
    ]
    (secret,) = [
        m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"] == f"{name}-cache-keys"
    ]
    assert set(secret["data"]) == {"pool-key", "salt-key"}
    router = next(
        m for m in manifests if m["metadata"]["name"] == f"{name}-router" and m["kind"] == "Deployment"
    )
    assert env_of(router)["TANDEM_CACHE_KEY"] == {
        "secretKeyRef": {"name": f"{name}-cache-keys", "key": "salt-key"}
    }
