"""LoRA on the engine pods: what the operator's builders render for `spec.engine.lora`,
`spec.adapters`, `spec.adapterCatalog` and `spec.adapterCache`, and what it refuses.

Real: the pure builders (`desired_children`), one reconcile pass, kubernetes-validate's strict
schemas. Faked: the Kubernetes API of that pass (test_operator_reconcile's `MemoryCluster`).
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from tests.operator.specs import IMAGES, OWNER, VARIANTS, gpu, sim
from tests.operator.test_operator_reconcile import MemoryCluster, body, run

from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources import desired_children

LORA_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_PLUGINS": "lora_filesystem_resolver",
    "VLLM_LORA_RESOLVER_CACHE_DIR": "/adapters",
}


def engine_pods(spec: InferenceServiceSpec) -> dict[str, dict[str, Any]]:
    """role → the pod spec of its Deployment."""
    return {
        c.manifest["metadata"]["name"].rsplit("-", 1)[1]: c.manifest["spec"]["template"]["spec"]
        for c in desired_children(spec, owner=OWNER, images=IMAGES)
        if c.manifest["kind"] == "Deployment"
        and c.manifest["metadata"]["name"] in ("demo-prefill", "demo-decode")
    }


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_both_pools_of_vllm_get_the_lora_flags_env_and_adapter_mounts() -> None:
    spec = VARIANTS["lora: pvc adapters, a catalog, a shared cache"]
    pods = engine_pods(spec)
    assert set(pods) == {"prefill", "decode"}
    for pod in pods.values():
        [engine] = pod["containers"]
        args = engine["args"]
        at = args.index("--enable-lora")
        assert args[at : at + 7] == [
            "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8",
        ]  # fmt: skip
        assert env_of(engine).items() >= LORA_ENV.items()
        adapters = [m for m in engine["volumeMounts"] if m["mountPath"].startswith("/adapter")]
        assert adapters == [
            {"name": "adapters", "mountPath": "/adapters"},
            {"name": "adapter-pvc-0", "mountPath": "/adapters/sql", "readOnly": True, "subPath": "sql/v2"},
            {
                "name": "adapter-pvc-0",
                "mountPath": "/adapters/chat-fr",
                "readOnly": True,
                "subPath": "chat-fr",
            },
            {"name": "adapter-pvc-1", "mountPath": "/adapters/legal", "readOnly": True},
            {
                "name": "adapter-catalog",
                "mountPath": "/adapter-catalog",
                "readOnly": True,
                "subPath": "adapters",
            },
        ]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["adapters"] == {
            "name": "adapters",
            "persistentVolumeClaim": {"claimName": "adapter-cache"},
        }
        assert volumes["adapter-pvc-0"]["persistentVolumeClaim"] == {"claimName": "loras", "readOnly": True}
        assert volumes["adapter-pvc-1"]["persistentVolumeClaim"] == {
            "claimName": "legal-loras",
            "readOnly": True,
        }
        assert volumes["adapter-catalog"]["persistentVolumeClaim"] == {
            "claimName": "catalog",
            "readOnly": True,
        }
        assert volumes["adapter-list"] == {"name": "adapter-list", "configMap": {"name": "demo-adapters"}}
        sync = pod["initContainers"][-1]
        assert (sync["name"], sync["restartPolicy"]) == ("adapters-sync", "Always")  # a native sidecar
        assert sync["image"] == IMAGES.tandem
        assert sync["command"] == [
            "tandem", "adapters", "sync", "--list", "/etc/tandem/adapters/adapters.json", "--dest",
            "/adapters", "--max-rank", "64", "--port", "8095", "--catalog", "/adapter-catalog",
        ]  # fmt: skip
        assert "args" not in sync, "no adapter is named in the pod template"
        assert sync["ports"] == [{"name": "adapter-sync", "containerPort": 8095, "protocol": "TCP"}]
        assert sync["startupProbe"]["httpGet"] == {"path": "/ready", "port": "adapter-sync"}
        list_mount = {"name": "adapter-list", "mountPath": "/etc/tandem/adapters", "readOnly": True}
        assert sync["volumeMounts"] == [*adapters, list_mount]  # declared adapters: left alone


def adapter_list(spec: InferenceServiceSpec) -> dict[str, Any]:
    [found] = [
        c.manifest
        for c in desired_children(spec, owner=OWNER, images=IMAGES)
        if c.manifest["kind"] == "ConfigMap" and c.manifest["metadata"]["name"] == "demo-adapters"
    ]
    return dict(json.loads(found["data"]["adapters.json"]))


def test_the_remote_adapters_are_listed_in_a_configmap_and_the_pools_do_not_change_with_them() -> None:
    lora = {"kind": "sim", "lora": {"maxLoras": 2}}
    none = sim(engine=lora)
    one = sim(engine=lora, adapters=[{"name": "sql", "source": "hf://org/sql-lora@v2"}])
    two = sim(
        engine=lora,
        adapters=[
            {"name": "sql", "source": "hf://org/sql-lora@v2"},
            {"name": "chat", "source": "s3://loras/chat"},
        ],
    )
    assert adapter_list(none) == {"adapters": []}
    assert adapter_list(two) == {
        "adapters": [
            {"name": "sql", "source": "hf://org/sql-lora@v2"},
            {"name": "chat", "source": "s3://loras/chat"},
        ]
    }
    assert engine_pods(none) == engine_pods(one) == engine_pods(two)


def test_a_catalog_without_remote_adapters_is_linked_by_the_sidecar() -> None:
    spec = sim(
        engine={"kind": "sim", "lora": {}},
        adapters=[{"name": "sql", "source": "pvc://loras/sql"}],
        adapterCatalog={"source": "pvc://catalog/adapters"},
    )
    [sync] = engine_pods(spec)["decode"]["initContainers"]
    assert sync["name"] == "adapters-sync"
    assert sync["command"][-2:] == ["--catalog", "/adapter-catalog"]
    assert adapter_list(spec) == {"adapters": []}


def test_hf_adapters_get_no_mount_of_their_own() -> None:
    pods = engine_pods(VARIANTS["lora: pvc adapters, a catalog, a shared cache"])
    mounts = [m["mountPath"] for m in pods["decode"]["containers"][0]["volumeMounts"]]
    assert "/adapters/hub" not in mounts


def test_simulated_engines_get_the_same_flags_env_and_sidecar_with_an_emptydir() -> None:
    pods = engine_pods(VARIANTS["lora on simulated engines"])
    for pod in pods.values():
        [engine] = pod["containers"]
        assert engine["command"] == ["tandem"]
        assert engine["args"][engine["args"].index("--enable-lora") :][:5] == [
            "--enable-lora", "--max-loras", "1", "--max-lora-rank", "16",
        ]  # fmt: skip
        assert "--max-cpu-loras" not in engine["args"]
        assert env_of(engine).items() >= LORA_ENV.items()
        assert {"name": "adapters", "emptyDir": {}} in pod["volumes"]
        assert [c["name"] for c in pod["initContainers"]] == ["adapters-sync"]


def test_engine_args_and_env_still_override_lora_ones() -> None:
    spec = sim(
        engine={
            "kind": "sim",
            "lora": {"maxLoras": 2},
            "args": ["--max-loras", "3"],
            "env": [{"name": "VLLM_PLUGINS", "value": "lora_filesystem_resolver,mine"}],
        }
    )
    engine = engine_pods(spec)["decode"]["containers"][0]
    assert engine["args"][-2:] == ["--max-loras", "3"]  # argparse keeps the last
    assert env_of(engine)["VLLM_PLUGINS"] == "lora_filesystem_resolver,mine"


def test_without_lora_nothing_of_it_is_rendered() -> None:
    for pod in engine_pods(gpu()).values():
        [engine] = pod["containers"]
        assert "--enable-lora" not in engine["args"]
        assert not set(env_of(engine)) & set(LORA_ENV)
        assert all(not v["name"].startswith("adapter") for v in pod["volumes"])
        assert all(c["name"] != "adapters-sync" for c in pod.get("initContainers", []))


@pytest.mark.parametrize(
    "variant", ["lora: pvc adapters, a catalog, a shared cache", "lora on simulated engines"]
)
def test_the_lora_pods_pass_strict_validation(variant: str) -> None:
    for child in desired_children(VARIANTS[variant], owner=OWNER, images=IMAGES):
        kubernetes_validate.validate(child.manifest, "1.30", strict=True)


def test_a_local_adapter_path_is_an_invalid_spec_in_a_cluster_and_nothing_is_applied() -> None:
    cluster = MemoryCluster()
    lora = {"engine": {"kind": "sim", "lora": {}}, "adapters": [{"name": "sql", "source": "./adapters/sql"}]}
    outcome = run(cluster, body(lora))
    assert cluster.calls == []
    assert outcome.status.phase == "Invalid"
    assert [(e.type, e.reason) for e in outcome.events] == [("Warning", "InvalidSpec")]
    assert (
        "spec.adapters[0].source: a local path works with tandem up only; in a cluster use pvc://, hf:// "
        "or s3://" in outcome.events[0].message
    )
