"""The pure builders: an InferenceService spec in, the fields of each child that matter out.

Real: the builders and the spec model. Faked: nothing (no I/O involved). Manifests are checked
field by field here and against the Kubernetes schemas in test_operator_manifests.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.operator.specs import IMAGES, OWNER, VARIANTS, gpu, sim

from tandem.core.routerconfig import EngineKVKeys, RouterConfig
from tandem.core.spec import InferenceServiceSpec
from tandem.operator.resources import Role, desired_children, managed_refs
from tandem.operator.resources.engine import (
    LMCACHE_CHECK_SCRIPT,
    build_engine_deployment,
    kv_transfer_config,
    model_argument,
)
from tandem.operator.resources.kvpool import build_lmcache_configmap, build_redis_deployment
from tandem.operator.resources.router import build_router_configmap, build_router_deployment
from tandem.operator.resources.services import build_service


def engine(spec: InferenceServiceSpec, role: Role) -> dict[str, Any]:
    return build_engine_deployment(spec, owner=OWNER, role=role, images=IMAGES)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def env(deployment: dict[str, Any]) -> dict[str, str]:
    """Plain-valued variables of the (first) container, by name."""
    return {e["name"]: e["value"] for e in container(deployment)["env"] if "value" in e}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(
    ("role", "kv_role"),
    [(Role.PREFILL, "kv_producer"), (Role.DECODE, "kv_consumer")],
    ids=["prefill", "decode"],
)
def test_vllm_pools_run_vllm_with_lmcache_as_producer_on_prefill_and_consumer_on_decode(
    role: Role, kv_role: str
) -> None:
    deployment = engine(gpu(), role)
    c = container(deployment)
    assert c["image"] == "lmcache/vllm-openai:v0.3.9"
    assert c["command"] == ["vllm", "serve"]
    assert json.loads(flag(c["args"], "--kv-transfer-config")) == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": kv_role,
        "kv_load_failure_policy": "recompute",
    }
    served = c["args"].index("--served-model-name")
    assert c["args"][served + 1 : served + 3] == ["qwen", "Qwen/Qwen2.5-7B-Instruct"]
    assert flag(c["args"], "--port") == "8000"
    assert c["args"][-4:] == ["--max-model-len", "16384", "--gpu-memory-utilization", "0.90"]
    variables = env(deployment)
    assert variables["LMCACHE_CONFIG_FILE"] == "/etc/lmcache/lmcache.yaml"
    assert variables["LMCACHE_REMOTE_URL"] == "redis://demo-kv:6379"
    assert variables["LMCACHE_CHUNK_SIZE"] == "256"
    assert variables["LMCACHE_REMOTE_SERDE"] == "naive"


@pytest.mark.parametrize(
    ("overrides", "prefill_tp", "gpus"),
    [
        ({}, "1", "1"),
        ({"prefill": {"tensorParallel": 4}, "decode": {"tensorParallel": 4}}, "4", "4"),  # one GPU per rank
        (
            {
                "prefill": {"tensorParallel": 2, "resources": {"limits": {"nvidia.com/gpu": 8}}},
                "decode": {"tensorParallel": 2},
            },
            "2",
            "8",
        ),
    ],
    ids=["example", "gpus default to the TP size", "explicit gpu limit wins"],
)
def test_vllm_pools_get_the_tensor_parallel_size_and_gpu_limits(
    overrides: dict[str, Any], prefill_tp: str, gpus: str
) -> None:
    c = container(engine(gpu(**overrides), Role.PREFILL))
    assert flag(c["args"], "--tensor-parallel-size") == prefill_tp
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus


def test_every_engine_pod_gets_the_same_python_hash_seed() -> None:
    seeds = {
        env(engine(spec, role))["PYTHONHASHSEED"]
        for spec in VARIANTS.values()
        for role in (Role.PREFILL, Role.DECODE)
    }
    assert seeds == {"0"}


def test_a_user_env_var_overrides_the_operator_default_of_the_same_name() -> None:
    spec = gpu(
        engine={
            "kind": "vllm",
            "env": [{"name": "PYTHONHASHSEED", "value": "7"}, {"name": "X", "value": "1"}],
        }
    )
    variables = env(engine(spec, Role.DECODE))
    assert variables["PYTHONHASHSEED"] == "7"
    assert variables["X"] == "1"
    assert list(variables).count("PYTHONHASHSEED") == 1


@pytest.mark.parametrize(
    ("model", "argument"),
    [
        ({"name": "Qwen/Qwen2.5-7B-Instruct"}, "Qwen/Qwen2.5-7B-Instruct"),
        (
            {"name": "q", "source": {"pvc": "models", "path": "Qwen2.5-7B-Instruct"}},
            "/models/Qwen2.5-7B-Instruct",
        ),
        ({"name": "q", "source": {"pvc": "models", "path": "/qwen/"}}, "/models/qwen"),
        ({"name": "q", "source": {"pvc": "models"}}, "/models"),
        ({"name": "q", "source": {"uri": "hf://Qwen/Qwen2.5-0.5B"}}, "Qwen/Qwen2.5-0.5B"),
        ({"name": "q", "source": {"uri": "s3://bucket/qwen"}}, "s3://bucket/qwen"),
    ],
    ids=["hub name", "pvc path", "pvc path slashes", "pvc root", "hf uri", "other uri"],
)
def test_the_model_argument_comes_from_the_pvc_the_uri_or_the_name(
    model: dict[str, Any], argument: str
) -> None:
    assert model_argument(gpu(model=model)) == argument


def test_a_model_pvc_is_mounted_read_only_at_models() -> None:
    deployment = engine(gpu(), Role.DECODE)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert volumes["lmcache-config"]["configMap"]["name"] == "demo-lmcache"


def test_engine_pods_probe_health_and_drain_before_stopping() -> None:
    deployment = engine(gpu(), Role.DECODE)
    c = container(deployment)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    drain = c["lifecycle"]["preStop"]["exec"]["command"]
    assert drain[:2] == ["python3", "-c"]
    assert "vllm:num_requests_running" in drain[2]
    compile(drain[2], "<preStop>", "exec")  # the drain script is valid Python
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 120


@pytest.mark.parametrize(("role", "kv_role"), [(Role.PREFILL, "producer"), (Role.DECODE, "consumer")])
def test_sim_pools_run_tandem_sim_in_the_tandem_image_with_the_matching_role(
    role: Role, kv_role: str
) -> None:
    spec = sim(engine={"kind": "sim", "sim": {"profile": "qwen2.5-7b-h100", "timeScale": 10}})
    c = container(engine(spec, role))
    assert c["image"] == IMAGES.tandem
    assert c["command"] == ["tandem"]
    args = c["args"]
    assert args[0] == "sim"
    assert flag(args, "--kv-role") == kv_role
    assert flag(args, "--kv-pool") == "redis://demo-kv:6379"
    assert flag(args, "--kv-chunk-size") == "256"
    assert flag(args, "--time-scale") == "10"
    assert flag(args, "--served-model-name") == "qwen"
    assert flag(args, "--port") == "8000"
    assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})
    assert "LMCACHE_CONFIG_FILE" not in env(engine(spec, role))


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_lmcache_engine_pods_first_check_the_images_vllm_and_lmcache(role: Role) -> None:
    spec = gpu(
        engine={"kind": "vllm", "image": "lmcache/vllm-openai:v0.5.4", "env": [{"name": "A", "value": "1"}]},
        kvPool={"redis": {"passwordSecret": {"name": "kv", "key": "pw"}}},
    )
    pod = engine(spec, role)["spec"]["template"]["spec"]
    (check,) = pod["initContainers"]
    assert check["name"] == "lmcache-check"
    assert check["image"] == "lmcache/vllm-openai:v0.5.4"  # the engine's own image, its own python3
    assert check["command"] == ["python3", "-c", LMCACHE_CHECK_SCRIPT]
    assert LMCACHE_CHECK_SCRIPT.startswith('"""Refuse an engine image')
    assert check["env"] == [{"name": "A", "value": "1"}]  # spec.engine.env only: no pool password
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert check["securityContext"] == container(engine(spec, role))["securityContext"]


@pytest.mark.parametrize(
    "spec",
    [gpu(kvPool={"connector": "tandem"}), sim()],
    ids=["tandem connector", "simulated engines"],
)
def test_other_engine_pods_have_no_init_container(spec: InferenceServiceSpec) -> None:
    for role in (Role.PREFILL, Role.DECODE):
        assert "initContainers" not in engine(spec, role)["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("spec", "remote_url"),
    [
        (gpu(), "redis://demo-kv:6379"),
        (
            gpu(kvPool={"redis": {"url": "redis://cache.example:6379"}, "chunkSize": 512}),
            "redis://cache.example:6379",
        ),
    ],
    ids=["managed redis", "external redis"],
)
def test_the_lmcache_config_points_at_the_pool(spec: InferenceServiceSpec, remote_url: str) -> None:
    config = yaml.safe_load(build_lmcache_configmap(spec, owner=OWNER)["data"]["lmcache.yaml"])
    assert config["remote_url"] == remote_url
    assert config["chunk_size"] == spec.kv_pool.chunk_size
    assert config["remote_serde"] == "naive"


def test_a_change_of_the_pool_config_changes_the_engine_pod_template() -> None:
    before = engine(gpu(), Role.DECODE)["spec"]["template"]["metadata"]["annotations"]
    after = engine(gpu(kvPool={"chunkSize": 512}), Role.DECODE)["spec"]["template"]["metadata"]["annotations"]
    assert before["tandem.dev/config-hash"] != after["tandem.dev/config-hash"]


@pytest.mark.parametrize(
    ("redis", "maxmemory", "limit"),
    [
        ({"memory": "32Gi", "evictionPolicy": "allkeys-lru"}, str(32 * 2**30), "40960Mi"),
        ({"memory": "1Gi", "evictionPolicy": "volatile-ttl"}, str(2**30), "1280Mi"),
        ({"memory": "1500M", "evictionPolicy": "noeviction"}, "1500000000", "1789Mi"),
    ],
    ids=["32Gi lru", "1Gi ttl", "decimal units"],
)
def test_the_managed_redis_gets_maxmemory_and_eviction_policy_from_the_spec(
    redis: dict[str, str], maxmemory: str, limit: str
) -> None:
    deployment = build_redis_deployment(gpu(kvPool={"redis": redis}), owner=OWNER, images=IMAGES)
    c = container(deployment)
    assert flag(c["args"], "--maxmemory") == maxmemory
    assert flag(c["args"], "--maxmemory-policy") == redis["evictionPolicy"]
    assert c["resources"]["limits"]["memory"] == limit
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("role", "headless", "port"),
    [
        (Role.PREFILL, True, 8000),
        (Role.DECODE, True, 8000),
        (Role.KV_POOL, False, 6379),
        (Role.ROUTER, False, 8080),
    ],
)
def test_engine_pools_get_headless_services_and_redis_and_router_get_cluster_ips(
    role: Role, headless: bool, port: int
) -> None:
    service = build_service(OWNER, role=role)
    assert (service["spec"].get("clusterIP") == "None") is headless
    assert service["spec"]["ports"][0]["port"] == port
    assert service["spec"]["selector"]["tandem.dev/role"] == role.value


def test_the_router_config_is_a_valid_router_config_discovering_both_pool_services() -> None:
    data = build_router_configmap(gpu(), owner=OWNER)["data"]["router.yaml"]
    config = RouterConfig.model_validate(yaml.safe_load(data))
    assert config.discovery.kind == "kubernetes"
    assert config.discovery.model_dump() == {
        "kind": "kubernetes",
        "namespace": "ns1",
        "prefill_service": "demo-prefill",
        "decode_service": "demo-decode",
        "port": 8000,
    }
    assert config.kv_pool_url == "redis://demo-kv:6379"
    assert config.spec == gpu()


def test_the_router_config_carries_the_spec_verbatim_so_the_router_sees_what_engines_run() -> None:
    spec = sim(engine={"kind": "sim", "args": ["--max-num-seqs", "64"]}, decode={"replicas": 5})
    data = build_router_configmap(spec, owner=OWNER)["data"]["router.yaml"]
    assert RouterConfig.model_validate(yaml.safe_load(data)).spec == spec


def test_every_child_is_owned_labelled_and_named_after_the_service() -> None:
    for spec in VARIANTS.values():
        for child in desired_children(spec, owner=OWNER, images=IMAGES):
            meta = child.manifest["metadata"]
            assert meta["name"].startswith("demo-")
            assert meta["namespace"] == "ns1"
            assert meta["ownerReferences"] == [OWNER.reference()]
            assert meta["labels"]["app.kubernetes.io/managed-by"] == "tandem-operator"
            assert meta["labels"]["tandem.dev/role"] in {r.value for r in Role}
            assert child.ref in managed_refs(OWNER)


#: The diagnostics port's token Secret, made only with `router.metricsToken`.
TOKEN = ("Secret", "demo-metrics-token")
#: The LeaderWorkerSets, made only for multi-node pools (in place of their Deployments).
GROUPS = {("LeaderWorkerSet", "demo-prefill"), ("LeaderWorkerSet", "demo-decode")}
#: The adapter list the engines' sidecars read and the names the gateway reads, made only with
#: `engine.lora`.
ADAPTERS = {("ConfigMap", "demo-adapters"), ("ConfigMap", "demo-adapter-names")}


@pytest.mark.parametrize(
    ("spec", "absent"),
    [
        (gpu(router={"metricsToken": True}), {*ADAPTERS, *GROUPS}),
        (gpu(), {TOKEN, *ADAPTERS, *GROUPS}),
        (sim(), {("ConfigMap", "demo-lmcache"), TOKEN, *ADAPTERS, *GROUPS}),
        (
            sim(engine={"kind": "sim", "lora": {"maxLoras": 2}}),
            {("ConfigMap", "demo-lmcache"), TOKEN, *GROUPS},
        ),
        (
            gpu(kvPool={"redis": {"url": "redis://cache.example:6379"}}),
            {
                ("Deployment", "demo-kv"),
                ("Service", "demo-kv"),
                ("NetworkPolicy", "demo-kv"),
                ("Secret", "demo-kv-auth"),
                TOKEN,
                *ADAPTERS,
                *GROUPS,
            },
        ),
        (
            gpu(decode={"replicas": 2, "nodesPerReplica": 2}),
            {TOKEN, *ADAPTERS, ("Deployment", "demo-decode"), ("LeaderWorkerSet", "demo-prefill")},
        ),
    ],
    ids=[
        "vllm with a metrics token",
        "vllm with managed redis",
        "sim: no LMCache config",
        "sim with LoRA: the adapter list and the adapter names",
        "external redis: no Redis",
        "multi-node decode: a LeaderWorkerSet instead of its Deployment",
    ],
)
def test_the_children_are_every_managed_object_but_those_the_spec_does_not_need(
    spec: InferenceServiceSpec, absent: set[tuple[str, str]]
) -> None:
    built = {(c.ref.kind, c.ref.name) for c in desired_children(spec, owner=OWNER, images=IMAGES)}
    everything = {(r.kind, r.name) for r in managed_refs(OWNER)}
    assert built == everything - absent


@pytest.mark.parametrize(
    ("pool", "autoscaling", "create_only"),
    [
        ("decode", False, ()),
        ("decode", True, (("spec", "replicas"),)),
        ("prefill", True, (("spec", "replicas"),)),
    ],
)
def test_replicas_are_create_only_exactly_when_the_pool_autoscales(
    pool: str, autoscaling: bool, create_only: tuple[tuple[str, ...], ...]
) -> None:
    spec = gpu(**{pool: {"replicas": 2, "autoscaling": {"enabled": autoscaling, "min": 1, "max": 4}}})
    children = {c.ref.name: c for c in desired_children(spec, owner=OWNER, images=IMAGES)}
    assert children[f"demo-{pool}"].create_only == create_only
    assert children[f"demo-{pool}"].manifest["spec"]["replicas"] == 2


def test_the_kv_transfer_config_is_the_one_place_the_connector_is_named() -> None:
    assert kv_transfer_config(gpu(), Role.PREFILL, owner=OWNER)["kv_connector"] == "LMCacheConnectorV1"
    tandem = gpu(kvPool={"connector": "tandem"})
    assert kv_transfer_config(tandem, Role.DECODE, owner=OWNER)["kv_connector"] == "TandemConnector"
    with pytest.raises(KeyError):
        kv_transfer_config(gpu(), Role.ROUTER, owner=OWNER)


def test_builders_are_deterministic_but_for_the_value_of_a_generated_secret() -> None:
    def fixed() -> str:
        return "same-value"

    for spec in VARIANTS.values():
        first = [c.manifest for c in desired_children(spec, owner=OWNER, images=IMAGES, new_value=fixed)]
        second = [c.manifest for c in desired_children(spec, owner=OWNER, images=IMAGES, new_value=fixed)]
        assert first == second


def _router(spec: InferenceServiceSpec) -> tuple[RouterConfig, dict[str, Any]]:
    config = RouterConfig.model_validate(
        yaml.safe_load(build_router_configmap(spec, owner=OWNER)["data"]["router.yaml"])
    )
    return config, build_router_deployment(
        spec, owner=OWNER, config=build_router_configmap(spec, owner=OWNER), images=IMAGES
    )


def test_with_real_vllm_the_router_reads_the_tokenizer_from_the_weights_pvc_read_only() -> None:
    config, deployment = _router(gpu())
    assert config.tokenizer_path == model_argument(gpu())  # /models/<path>, where vLLM reads it
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "volumes"
    ]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in container(deployment)[
        "volumeMounts"
    ]


def test_a_tokenizer_configmap_is_mounted_instead_of_the_weights() -> None:
    spec = gpu(model={"name": "Qwen/Qwen2.5-7B-Instruct", "tokenizer": {"configMap": "qwen-tokenizer"}})
    config, deployment = _router(spec)
    assert config.tokenizer_path == "/etc/tandem/tokenizer"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tokenizer", "configMap": {"name": "qwen-tokenizer"}} in volumes
    assert not [v for v in volumes if "persistentVolumeClaim" in v]


def test_the_simulator_needs_no_tokenizer_files() -> None:
    config, deployment = _router(sim())
    assert config.tokenizer_path is None
    assert not [m for m in container(deployment)["volumeMounts"] if m["name"] in ("model", "tokenizer")]


def test_the_router_config_says_how_the_engines_name_their_pool_chunks() -> None:
    """LMCache keys by vLLM's model argument and hashes from the engines' PYTHONHASHSEED."""
    config, _ = _router(gpu())
    assert config.engine_kv_keys == EngineKVKeys(
        connector="lmcache", model=model_argument(gpu()), python_hash_seed="0"
    )
    seeded = gpu(engine={"env": [{"name": "PYTHONHASHSEED", "value": "7"}]})
    keys = _router(seeded)[0].engine_kv_keys
    assert (
        keys is not None
        and keys.python_hash_seed == env(engine(seeded, Role.PREFILL))["PYTHONHASHSEED"] == "7"
    )
    tandem = _router(gpu(kvPool={"connector": "tandem"}))[0].engine_kv_keys
    assert tandem is not None and (tandem.connector, tandem.model) == ("tandem", gpu().model.name)
    assert _router(sim())[0].engine_kv_keys is None


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE], ids=["prefill", "decode"])
def test_with_precise_prefix_state_vllm_engines_publish_kv_events_where_the_router_connects(
    role: Role,
) -> None:
    spec = gpu(router={"prefixSource": "precise"})
    c = container(engine(spec, role))
    assert json.loads(flag(c["args"], "--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
        "topic": "",
    }
    assert {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"} in c["ports"]
    assert {"name": "kv-replay", "containerPort": 5558, "protocol": "TCP"} in c["ports"]
    config, _ = _router(spec)
    assert config.kv_events is not None
    assert config.kv_events.for_engine("http://10.1.2.3:8000") == (
        "tcp://10.1.2.3:5557",
        "tcp://10.1.2.3:5558",
    )


def test_simulated_engines_publish_the_same_way() -> None:
    args = container(engine(sim(router={"prefixSource": "precise"}), Role.DECODE))["args"]
    assert flag(args, "--kv-events-endpoint") == "tcp://*:5557"
    assert flag(args, "--kv-events-replay-endpoint") == "tcp://*:5558"


def test_without_precise_prefix_state_no_engine_publishes_and_the_router_subscribes_to_none() -> None:
    for spec in (gpu(), sim()):
        c = container(engine(spec, Role.DECODE))
        assert "--kv-events-config" not in c["args"] and "--kv-events-endpoint" not in c["args"]
        assert [p["name"] for p in c["ports"]] == ["http"]
        assert _router(spec)[0].kv_events is None
