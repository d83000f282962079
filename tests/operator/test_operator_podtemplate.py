"""Per-pool templates and engine settings, multi-node pools, disruption budgets and the KV-layout
label, as the pure builders render them.

Real: the spec models, `tandem.operator.resources` (merge, engine, router, Redis, Services,
NetworkPolicies, LeaderWorkerSets, PodDisruptionBudgets). Nothing is faked; no cluster.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from tests.operator.lws_schema import lws_errors, pod_templates
from tests.operator.specs import IMAGES, OWNER, gpu, sim

from tandem.core.spec import InferenceServiceSpec
from tandem.operator.diff import update_patch
from tandem.operator.resources import desired_children
from tandem.operator.resources.kvlayout import KV_LAYOUT_LABEL
from tandem.operator.resources.podtemplate import merge


def objects(spec: InferenceServiceSpec) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c.ref.kind, c.ref.name): c.manifest for c in desired_children(spec, owner=OWNER, images=IMAGES)}


def pod(spec: InferenceServiceSpec, pool: str) -> dict[str, Any]:
    template: dict[str, Any] = objects(spec)["Deployment", f"demo-{pool}"]["spec"]["template"]
    return template


def container(template: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in template["spec"]["containers"] if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize(
    ("base", "overlay", "merged"),
    [
        ({"a": {"x": 1, "y": 2}}, {"a": {"y": 3, "z": 4}}, {"a": {"x": 1, "y": 3, "z": 4}}),
        ({"args": ["a", "b"]}, {"args": ["c"]}, {"args": ["c"]}),
        (
            {"tolerations": [{"key": "a"}]},
            {"tolerations": [{"key": "b"}]},
            {"tolerations": [{"key": "b"}]},
        ),
        (
            {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
            {
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    {"name": "C", "value": "3"},
                ]
            },
            {
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    {"name": "B", "value": "2"},
                    {"name": "C", "value": "3"},
                ]
            },
        ),
        (
            {"containers": [{"name": "engine", "image": "v", "resources": {"limits": {"cpu": "1"}}}]},
            {
                "containers": [
                    {"name": "engine", "resources": {"limits": {"memory": "1Gi"}}},
                    {"name": "proxy", "image": "p"},
                ]
            },
            {
                "containers": [
                    {"name": "engine", "image": "v", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "proxy", "image": "p"},
                ]
            },
        ),
        (
            {"volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "a"}}]},
            {"volumes": [{"name": "model", "hostPath": {"path": "/m"}}]},
            {"volumes": [{"name": "model", "hostPath": {"path": "/m"}}]},
        ),
    ],
    ids=[
        "maps merge",
        "plain lists replace",
        "unnamed lists replace",
        "env by name, replaced whole",
        "containers by name, merged deep; sidecars appended",
        "volumes by name, replaced whole",
    ],
)
def test_merge_follows_the_documented_rules(base: Any, overlay: Any, merged: Any) -> None:
    before = repr(base)
    assert merge(base, overlay) == merged
    assert repr(base) == before  # the operator's manifest is not modified


PLACED: dict[str, Any] = {
    "metadata": {"labels": {"team": "search"}, "annotations": {"example.com/owner": "ml"}},
    "spec": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H20"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "priorityClassName": "inference",
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
                "resources": {"requests": {"memory": "100Gi"}},
            },
            {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "ports": [{"containerPort": 9901}]},
        ],
    },
}


def test_every_template_field_reaches_the_pool_pod_and_only_that_pools() -> None:
    template = pod(gpu(decode={"replicas": 2, "template": PLACED}), "decode")
    spec = template["spec"]
    for field in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
        "runtimeClassName",
        "schedulerName",
        "serviceAccountName",
    ):
        assert spec[field] == PLACED["spec"][field]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert {"name": "cache", "emptyDir": {}} in spec["volumes"] and {v["name"] for v in spec["volumes"]} >= {
        "model",
        "tmp",
    }
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"]["tandem.dev/role"] == "decode"
    assert template["metadata"]["annotations"]["example.com/owner"] == "ml"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    engine = container(template, "engine")
    assert env(engine)["NCCL_DEBUG"] == "INFO" and "VLLM_API_KEY" in env(engine)
    assert {"name": "cache", "mountPath": "/cache"} in engine["volumeMounts"]
    assert engine["resources"]["requests"]["memory"] == "100Gi"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"  # the operator's, kept
    assert engine["command"] == ["vllm", "serve"] and engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container(template, "proxy")["image"] == "envoyproxy/envoy:v1.31"
    assert "nodeSelector" not in pod(gpu(decode={"replicas": 2, "template": PLACED}), "prefill")["spec"]


def test_the_shared_template_comes_first_and_the_pools_wins() -> None:
    spec = gpu(
        engine={
            "kind": "vllm",
            "template": {
                "spec": {"nodeSelector": {"gpu": "any", "pool": "shared"}, "priorityClassName": "low"}
            },
        },
        prefill={"template": {"spec": {"nodeSelector": {"gpu": "h800"}}}},
    )
    prefill, decode = pod(spec, "prefill")["spec"], pod(spec, "decode")["spec"]
    assert (
        prefill["nodeSelector"] == {"gpu": "h800", "pool": "shared"} and prefill["priorityClassName"] == "low"
    )
    assert decode["nodeSelector"] == {"gpu": "any", "pool": "shared"}


def test_a_pools_engine_settings_follow_the_shared_ones() -> None:
    spec = gpu(
        engine={
            "kind": "vllm",
            "args": ["--max-model-len", "8192"],
            "env": [{"name": "A", "value": "shared"}],
        },
        prefill={
            "engine": {
                "args": ["--max-num-batched-tokens", "16384"],
                "env": [{"name": "A", "value": "prefill"}],
            }
        },
        decode={
            "replicas": 2,
            "engine": {"image": "vllm/vllm-openai:decode", "args": ["--max-num-seqs", "256"]},
        },
    )
    prefill, decode = container(pod(spec, "prefill"), "engine"), container(pod(spec, "decode"), "engine")
    assert prefill["args"][-4:] == ["--max-model-len", "8192", "--max-num-batched-tokens", "16384"]
    assert decode["args"][-4:] == ["--max-model-len", "8192", "--max-num-seqs", "256"]
    assert env(prefill)["A"] == "prefill" and env(decode)["A"] == "shared"
    assert decode["image"] == "vllm/vllm-openai:decode"
    assert prefill["image"] == "lmcache/vllm-openai:v0.3.9"
    checks = {c["name"]: c for c in pod(spec, "decode")["spec"]["initContainers"]}
    assert checks["lmcache-check"]["image"] == "vllm/vllm-openai:decode"


def test_the_gateway_and_redis_pods_take_their_templates() -> None:
    placed = {
        "spec": {
            "nodeSelector": {"role": "cpu"},
            "containers": [{"name": "router", "resources": {"limits": {"cpu": "4"}}}],
        }
    }
    redis = {
        "spec": {
            "nodeSelector": {"role": "memory"},
            "containers": [{"name": "redis", "env": [{"name": "X", "value": "1"}]}],
        }
    }
    built = objects(sim(router={"template": placed}, kvPool={"redis": {"memory": "1Gi", "template": redis}}))
    router = built["Deployment", "demo-router"]["spec"]["template"]["spec"]
    assert router["nodeSelector"] == {"role": "cpu"} and router["serviceAccountName"] == "demo-router"
    assert router["containers"][0]["resources"]["limits"] == {"memory": "1Gi", "cpu": "4"}
    kv = built["Deployment", "demo-kv"]["spec"]["template"]["spec"]
    assert kv["nodeSelector"] == {"role": "memory"}
    assert env(kv["containers"][0])["X"] == "1" and kv["containers"][0]["command"]


def layout(spec: InferenceServiceSpec, pool: str) -> str:
    label: str = pod(spec, pool)["metadata"]["labels"][KV_LAYOUT_LABEL]
    return label


def test_the_engines_keys_carry_the_layout_their_pods_are_labelled_with() -> None:
    """Tandem's connector (in `--kv-transfer-config`) and the simulator (`--kv-layout`) put the pods'
    KV-layout label in their pool keys' scope, and the gateway is told to compute keys with it;
    LMCache's keys carry no scope, so neither its engines nor the gateway use it."""
    for spec in (gpu(kvPool={"connector": "tandem"}), sim()):
        for pool in ("prefill", "decode"):
            args = container(pod(spec, pool), "engine")["args"]
            label = layout(spec, pool)
            if spec.engine.kind == "sim":
                assert args[args.index("--kv-layout") + 1] == label
            else:
                transfer = json.loads(args[args.index("--kv-transfer-config") + 1])
                assert transfer["kv_connector_extra_config"]["kv_layout"] == label
        assert router_document(spec)["kvLayoutInKeys"] is True
    lmcache = gpu()
    assert lmcache.kv_pool.connector == "lmcache"
    args = container(pod(lmcache, "decode"), "engine")["args"]
    assert layout(lmcache, "decode") not in " ".join(args)
    assert router_document(lmcache)["kvLayoutInKeys"] is False


def router_document(spec: InferenceServiceSpec) -> dict[str, Any]:
    data: dict[str, Any] = objects(spec)["ConfigMap", "demo-router"]["data"]
    document: dict[str, Any] = yaml.safe_load(next(iter(data.values())))
    return document


def test_both_pools_carry_one_kv_layout_that_changes_with_what_makes_kv_incompatible() -> None:
    base = gpu()
    assert layout(base, "prefill") == layout(base, "decode")
    changed = [
        gpu(decode={"replicas": 2, "engine": {"image": "vllm/vllm-openai:next"}}),
        gpu(engine={"kind": "vllm", "args": ["--kv-cache-dtype", "fp8"]}),
        gpu(engine={"kind": "vllm", "args": ["--kv_cache_dtype=fp8"]}),
        gpu(engine={"kind": "vllm", "env": [{"name": "PYTHONHASHSEED", "value": "7"}]}),
        gpu(kvPool={"connector": "tandem"}),
        gpu(kvPool={"chunkSize": 512}),
        gpu(prefill={"replicas": 1, "tensorParallel": 2}, decode={"replicas": 2, "tensorParallel": 2}),
        gpu(model={"name": "Qwen/Qwen2.5-14B-Instruct"}),
    ]
    for spec in changed:
        assert layout(spec, "prefill") == layout(spec, "decode") != layout(base, "decode")
    unchanged = [
        gpu(decode={"replicas": 5, "engine": {"args": ["--max-num-seqs", "256"]}}),
        gpu(prefill={"template": PLACED}),
        gpu(engine={"kind": "vllm", "args": ["--max-model-len", "4096"]}),
    ]
    for spec in unchanged:
        assert layout(spec, "decode") == layout(base, "decode")


def test_every_pool_has_a_disruption_budget() -> None:
    built = objects(gpu(decode={"replicas": 2, "maxUnavailable": 0}))
    prefill, decode = (
        built["PodDisruptionBudget", "demo-prefill"],
        built["PodDisruptionBudget", "demo-decode"],
    )
    assert prefill["spec"]["maxUnavailable"] == 1 and decode["spec"]["maxUnavailable"] == 0
    assert decode["spec"]["selector"] == built["Deployment", "demo-decode"]["spec"]["selector"]
    assert decode["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


MULTINODE = {"replicas": 3, "nodesPerReplica": 4, "resources": {"limits": {"nvidia.com/gpu": 8}}}


def test_a_multi_node_pool_is_a_leader_worker_set_whose_leaders_serve() -> None:
    built = objects(
        gpu(decode=MULTINODE | {"template": PLACED, "engine": {"args": ["--max-num-seqs", "64"]}})
    )
    assert ("Deployment", "demo-decode") not in built and ("Deployment", "demo-prefill") in built
    lws = built["LeaderWorkerSet", "demo-decode"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 3
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    for template, headless in ((leader, ""), (worker, "--headless")):
        engine = container(template, "engine")
        assert engine["command"][:2] == ["/bin/sh", "-c"] and "LWS_LEADER_ADDRESS" in engine["command"][2]
        assert env(engine)["TANDEM_DP_LOCAL"] == "8" and env(engine)["TANDEM_DP_HEADLESS"] == headless
        args = engine["args"]
        assert args[args.index("--data-parallel-size") + 1] == "32"
        assert args[args.index("--data-parallel-size-local") + 1] == "8"
        assert args[-2:] == ["--max-num-seqs", "64"]
        assert template["spec"]["nodeSelector"] == PLACED["spec"]["nodeSelector"]
        assert container(template, "proxy")["image"] == "envoyproxy/envoy:v1.31"
        assert template["metadata"]["labels"]["tandem.dev/role"] == "decode"
    assert container(leader, "engine")["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"ports", "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"}.isdisjoint(
        container(worker, "engine")
    )
    assert leader["metadata"]["labels"][KV_LAYOUT_LABEL] == worker["metadata"]["labels"][KV_LAYOUT_LABEL]
    service = built["Service", "demo-decode"]["spec"]
    assert service["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert (
        "leaderworkerset.sigs.k8s.io/worker-index" not in built["Service", "demo-prefill"]["spec"]["selector"]
    )
    # The group's pods reach each other on every port (no `ports`); the single-node pool's do not.
    decode_pods = {
        "app.kubernetes.io/name": "tandem",
        "app.kubernetes.io/instance": "demo",
        "tandem.dev/role": "decode",
    }
    assert built["NetworkPolicy", "demo-decode"]["spec"]["ingress"][-1] == {
        "from": [{"podSelector": {"matchLabels": decode_pods}}]
    }
    assert all("ports" in rule for rule in built["NetworkPolicy", "demo-prefill"]["spec"]["ingress"])


def test_what_a_template_took_back_is_removed_from_the_live_workload() -> None:
    before = gpu(decode={"replicas": 2, "template": PLACED})
    after = gpu(decode={"replicas": 2})
    live = {c.ref: c.manifest for c in desired_children(before, owner=OWNER, images=IMAGES)}
    child = next(
        c
        for c in desired_children(after, owner=OWNER, images=IMAGES)
        if c.ref.name == "demo-decode" and c.ref.kind == "Deployment"
    )
    pod_patch = update_patch(live[child.ref], child.manifest, owned=child.owned)["spec"]["template"]
    for field in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
        "runtimeClassName",
        "imagePullSecrets",
    ):
        assert pod_patch["spec"][field] is None
    assert pod_patch["metadata"]["labels"] == {"team": None}
    assert [c["name"] for c in pod_patch["spec"]["containers"]] == ["engine"]  # the sidecar is gone


EVERY_FIELD: dict[str, Any] = {
    "metadata": PLACED["metadata"],
    "spec": {
        **PLACED["spec"],
        "terminationGracePeriodSeconds": 300,
        "securityContext": {"supplementalGroups": [2000]},
        "initContainers": [{"name": "warm-cache", "image": "busybox:1.36", "command": ["true"]}],
    },
}


@pytest.mark.parametrize("version", ["1.30", "1.34"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_every_template_field_renders_valid_objects(version: str, nodes: int) -> None:
    spec = gpu(
        engine={"kind": "vllm", "template": {"spec": {"runtimeClassName": "nvidia"}}},
        prefill={"template": EVERY_FIELD, "engine": {"args": ["--max-num-batched-tokens", "16384"]}},
        decode={"replicas": 2, "nodesPerReplica": nodes, "template": EVERY_FIELD, "maxUnavailable": nodes},
        router={"template": {"spec": {"nodeSelector": {"role": "cpu"}, "imagePullSecrets": [{"name": "r"}]}}},
        kvPool={"redis": {"template": {"spec": {"tolerations": [{"key": "memory", "operator": "Exists"}]}}}},
    )
    built = objects(spec)
    for (kind, _), manifest in built.items():
        if kind == "LeaderWorkerSet":
            assert lws_errors(manifest) == []
            for template in pod_templates(manifest):
                kubernetes_validate.validate(template, version, strict=True)
        else:
            kubernetes_validate.validate(manifest, version, strict=True)
    workload = built["LeaderWorkerSet" if nodes > 1 else "Deployment", "demo-decode"]
    pods = (
        [workload["spec"]["template"]]
        if nodes == 1
        else [workload["spec"]["leaderWorkerTemplate"][t] for t in ("leaderTemplate", "workerTemplate")]
    )
    for template in pods:
        assert template["spec"]["terminationGracePeriodSeconds"] == 300
        assert template["spec"]["securityContext"]["supplementalGroups"] == [2000]
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        assert [c["name"] for c in template["spec"]["initContainers"]] == ["lmcache-check", "warm-cache"]
