"""What a pod template, a pool's engine settings and a multi-node pool may not say: each refusal
names its field path and a one-line reason (`tandem.core.podtemplate`, `specrules._pool_rules`).

Real: the spec models and rules, on documents as a user writes them. Nothing is faked.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tandem.core.specrules import SpecInvalid, parse_inference_service

BASE: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo"},
    "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}},
}


def errors_of(spec: dict[str, Any]) -> list[str]:
    document = copy.deepcopy(BASE)
    document["spec"] |= spec
    try:
        parse_inference_service(document)
    except SpecInvalid as exc:
        return [str(e) for e in exc.errors]
    return []


def engine_container(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "engine", **fields}]}}


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (
            {"decode": {"template": engine_container(command=["sh"])}},
            "spec.decode.template.spec.containers[0].command: the operator owns the engine container's "
            "command",
        ),
        (
            {"engine": {"template": engine_container(args=["--x"])}},
            "spec.engine.template.spec.containers[0].args: the operator owns the engine container's args "
            "(use spec.engine.args or spec.<pool>.engine.args)",
        ),
        (
            {"prefill": {"template": engine_container(readinessProbe={"tcpSocket": {"port": 1}})}},
            "spec.prefill.template.spec.containers[0].readinessProbe: the operator owns the engine "
            "container's readinessProbe",
        ),
        (
            {"decode": {"template": engine_container(ports=[{"containerPort": 9}])}},
            "spec.decode.template.spec.containers[0].ports: the operator owns the engine container's ports",
        ),
        (
            {"decode": {"template": engine_container(env=[{"name": "VLLM_API_KEY", "value": "x"}])}},
            "spec.decode.template.spec.containers[0].env[0].name: VLLM_API_KEY carries a credential from "
            "its Secret",
        ),
        (
            {"decode": {"template": engine_container(env=[{"name": "LMCACHE_CHUNK_SIZE", "value": "8"}])}},
            "spec.decode.template.spec.containers[0].env[0].name: LMCACHE_CHUNK_SIZE changes the KV "
            "layout: set it in spec.engine.env",
        ),
        (
            {"decode": {"template": {"metadata": {"labels": {"tandem.dev/role": "x"}}}}},
            "spec.decode.template.metadata.labels[tandem.dev/role]: the operator owns labels under "
            "tandem.dev/",
        ),
        (
            {"prefill": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}}}},
            "spec.prefill.template.metadata.labels[app.kubernetes.io/name]: the operator owns labels under "
            "app.kubernetes.io/",
        ),
        (
            {"router": {"template": {"metadata": {"annotations": {"tandem.dev/config-hash": "0"}}}}},
            "spec.router.template.metadata.annotations[tandem.dev/config-hash]: the operator owns "
            "annotations under tandem.dev/",
        ),
        (
            {"decode": {"template": engine_container(securityContext={"privileged": True})}},
            "spec.decode.template.spec.containers[0].securityContext.privileged: privileged: true weakens "
            "the pod's security",
        ),
        (
            {
                "decode": {
                    "template": {
                        "spec": {"containers": [{"name": "side", "securityContext": {"runAsUser": 0}}]}
                    }
                }
            },
            "spec.decode.template.spec.containers[0].securityContext.runAsUser: runAsUser: 0 weakens the "
            "pod's security",
        ),
        (
            {"engine": {"template": {"spec": {"securityContext": {"runAsNonRoot": False}}}}},
            "spec.engine.template.spec.securityContext.runAsNonRoot: runAsNonRoot: false weakens the pod's "
            "security",
        ),
        (
            {
                "decode": {
                    "template": engine_container(
                        securityContext={"capabilities": {"add": ["IPC_LOCK", "SYS_ADMIN"]}}
                    )
                }
            },
            "spec.decode.template.spec.containers[0].securityContext.capabilities.add: adds SYS_ADMIN: only "
            "IPC_LOCK may be added",
        ),
        (
            {
                "decode": {
                    "template": engine_container(securityContext={"seccompProfile": {"type": "Unconfined"}})
                }
            },
            "spec.decode.template.spec.containers[0].securityContext.seccompProfile.type: an Unconfined "
            "seccomp profile weakens the pod's security",
        ),
        (
            {"decode": {"template": {"spec": {"initContainers": [{"name": "lmcache-check", "image": "x"}]}}}},
            "spec.decode.template.spec.initContainers[0].name: 'lmcache-check' is the operator's init "
            "container",
        ),
        (
            {"router": {"template": {"spec": {"serviceAccountName": "mine"}}}},
            "spec.router.template.spec.serviceAccountName: the gateway runs as its own account "
            "(EndpointSlice reader)",
        ),
        (
            {"router": {"template": {"spec": {"containers": [{"name": "router", "image": "mine"}]}}}},
            "spec.router.template.spec.containers[0].image: the operator owns the router container's image",
        ),
        (
            {
                "kvPool": {
                    "redis": {"template": {"spec": {"containers": [{"name": "redis", "command": ["x"]}]}}}
                }
            },
            "spec.kvPool.redis.template.spec.containers[0].command: the operator owns the redis "
            "container's command",
        ),
        (
            {
                "kvPool": {
                    "redis": {"url": "redis://r:6379", "template": {"spec": {"nodeSelector": {"a": "b"}}}}
                }
            },
            "spec.kvPool.redis.template: no Redis is deployed when kvPool.redis.url is set",
        ),
        (
            {"engine": {"args": ["--kv-transfer-config", "{}"]}},
            "spec.engine.args[0]: --kv-transfer-config: the operator configures the KV connector "
            "(spec.kvPool)",
        ),
        (
            {"decode": {"engine": {"args": ["--port=9000"]}}},
            "spec.decode.engine.args[0]: --port: the engine listens on the operator's port 8000",
        ),
        (
            {"prefill": {"engine": {"args": ["--kv_transfer_config={}"]}}},
            "spec.prefill.engine.args[0]: --kv-transfer-config: the operator configures the KV connector "
            "(spec.kvPool)",
        ),
        (
            {"decode": {"engine": {"args": ["-tp", "2"]}}},
            "spec.decode.engine.args[0]: -tp: use spec.<pool>.tensorParallel",
        ),
        (
            {"decode": {"engine": {"args": ["--kv-cache-dtype", "fp8"]}}},
            "spec.decode.engine.args[0]: --kv-cache-dtype changes the KV layout: set it in spec.engine.args "
            "so both pools agree",
        ),
        (
            {"prefill": {"engine": {"env": [{"name": "PYTHONHASHSEED", "value": "1"}]}}},
            "spec.prefill.engine.env[0].name: PYTHONHASHSEED changes the KV layout: set it in "
            "spec.engine.env so both pools agree",
        ),
        (
            {"decode": {"nodesPerReplica": 2, "engine": {"args": ["--headless"]}}},
            "spec.decode.engine.args[0]: --headless: the operator sets vLLM's data-parallel flags on "
            "multi-node pools",
        ),
        (
            {"engine": {"kind": "sim"}, "decode": {"nodesPerReplica": 2}},
            "spec.decode.nodesPerReplica: more than 1 needs engine.kind vllm (the simulator runs on one pod)",
        ),
        (
            {
                "decode": {
                    "nodesPerReplica": 2,
                    "tensorParallel": 4,
                    "resources": {"limits": {"nvidia.com/gpu": 6}},
                }
            },
            "spec.decode.resources: nvidia.com/gpu (6) must be a whole multiple of tensorParallel (4) on a "
            "multi-node pool: each pod runs GPUs / tensorParallel data-parallel ranks",
        ),
        (
            {"decode": {"template": {"spec": {"hostNetwork": True}}}},
            "spec.decode.template.spec.hostNetwork: unknown field",
        ),
    ],
)
def test_a_field_the_operator_owns_is_refused_with_its_path_and_reason(
    spec: dict[str, Any], error: str
) -> None:
    assert error in errors_of(spec)


def test_a_template_using_every_documented_field_and_pool_settings_is_accepted() -> None:
    template = {
        "metadata": {"labels": {"team": "a"}, "annotations": {"example.com/x": "1"}},
        "spec": {
            "nodeSelector": {"gpu": "h20"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"podAntiAffinity": {}},
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "priorityClassName": "high",
            "runtimeClassName": "nvidia",
            "schedulerName": "volcano",
            "serviceAccountName": "engines",
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [{"name": "cache", "emptyDir": {}}],
            "containers": [
                {
                    "name": "engine",
                    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    "resources": {"limits": {"memory": "64Gi"}},
                    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                },
                {"name": "proxy", "image": "envoy", "ports": [{"containerPort": 9901}]},
            ],
        },
    }
    spec = {
        "engine": {"template": template},
        "prefill": {"engine": {"args": ["--max-num-batched-tokens", "16384"]}, "template": template},
        "decode": {
            "engine": {"image": "vllm:b", "args": ["--max-num-seqs", "256"]},
            "nodesPerReplica": 2,
            "autoscaling": {"enabled": True},  # the autoscaler scales the LeaderWorkerSet
        },
    }
    assert errors_of(spec) == []
