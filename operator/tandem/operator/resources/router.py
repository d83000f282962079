"""The gateway: its configuration, its identity (ServiceAccount + Role to read EndpointSlices) and its
Deployment running `tandem router --config /etc/tandem/router.yaml`. Pure builders.

With LoRA on, the gateway's adapters are not in its configuration: the pods mount ConfigMap
`<name>-adapter-names` (`lora.build_adapter_names_configmap`) whole at `/etc/tandem/adapter-names`,
outside the pod template's config hash, and re-read `names.json` there (`RouterConfig.adapterNamesFile`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.core.adapternames import NAMES_KEY
from tandem.core.kvevents import cluster_addresses
from tandem.core.routerconfig import EngineKVKeys, KubernetesDiscovery, RouterConfig
from tandem.core.spec import InferenceServiceSpec, SecretKeyRef, engine_hash_seed
from tandem.operator.resources.engine import (
    CONFIG_HASH_ANNOTATION,
    MODEL_MOUNT,
    model_argument,
)
from tandem.operator.resources.kvpool import config_hash, kv_pool_url
from tandem.operator.resources.lora import ADAPTER_DIR, ADAPTER_NAMES_SUFFIX
from tandem.operator.resources.meta import (
    ENGINE_PORT,
    METRICS_PORT,
    ROUTER_PORT,
    Images,
    Owner,
    Role,
    child_name,
    object_meta,
    selector_labels,
    to_yaml,
)
from tandem.operator.resources.podtemplate import apply_templates
from tandem.operator.resources.secrets import metrics_token_ref
from tandem.operator.resources.security import (
    GATEWAY_ENGINE_KEY_ENV,
    METRICS_TOKEN_ENV,
    TMP_MOUNT,
    cache_keys_env,
    container_security_context,
    engine_key_env,
    password_env,
    pod_security_context,
)
from tandem.operator.resources.services import service_name

ROUTER_SUFFIX = "router"
CONFIG_DIR = "/etc/tandem"
CONFIG_FILE = "router.yaml"
#: Where the API-key Secret is mounted (a whole-volume mount, not subPath, so Secret updates reach the
#: router, which re-reads the file).
AUTH_DIR = "/etc/tandem/auth"
API_KEYS_FILE = "api-keys"
#: Where the tokenizer ConfigMap is mounted (`spec.model.tokenizer.configMap`).
TOKENIZER_DIR = "/etc/tandem/tokenizer"
#: Where ConfigMap `<name>-adapter-names` is mounted (whole, so its updates reach the running pods).
ADAPTER_NAMES_DIR = "/etc/tandem/adapter-names"
ADAPTER_NAMES_VOLUME = "lora-names"
#: The router's own resources (the spec has none for it): a light async proxy.
ROUTER_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def router_config(spec: InferenceServiceSpec, *, owner: Owner) -> RouterConfig:
    """The RouterConfig: the spec (the router reads `model`, `engine.kind`, `disaggregation`,
    `kvPool`, `router`) and discovery through the pool Services' EndpointSlices.

    The router pods roll whenever it changes, engine-only edits included: a rolling update of a
    stateless gateway is cheap, and the router always sees the spec the engines run with. Adapters
    are the exception: with LoRA on, the spec it carries has no `adapters` and no `adapterCatalog`,
    and `adapterNamesFile` names the mounted `names.json` instead (`adapter_names_file`), so adding,
    changing or removing an adapter of any source, or a catalog, leaves it (and the gateway pods)
    unchanged.
    """
    names_file = adapter_names_file(spec)
    if names_file is not None:
        spec = spec.model_copy(update={"adapters": [], "adapter_catalog": None})
    return RouterConfig(
        service=owner.name,
        spec=spec,
        adapter_names_file=names_file,
        discovery=KubernetesDiscovery(
            namespace=owner.namespace,
            prefill_service=service_name(owner, Role.PREFILL),
            decode_service=service_name(owner, Role.DECODE),
            port=ENGINE_PORT,
        ),
        kv_pool_url=kv_pool_url(spec, owner),
        api_keys_file=f"{AUTH_DIR}/{API_KEYS_FILE}" if spec.router.auth.enabled else None,
        tokenizer_path=tokenizer_path(spec),
        engine_kv_keys=engine_kv_keys(spec),
        # The engines' keys carry their KV layout (the pods' label): the simulator's and Tandem's
        # connector's; LMCache's keys carry no scope at all.
        kv_layout_in_keys=spec.engine.kind == "sim" or spec.kv_pool.connector == "tandem",
        kv_events=cluster_addresses() if spec.router.prefix_source == "precise" else None,
        # Every engine pod's resolver folder (`lora`): the gateway copies hot adapters from it.
        adapter_load_dir=ADAPTER_DIR if spec.engine.lora is not None else None,
    )


def adapter_names_file(spec: InferenceServiceSpec) -> str | None:
    """Where the gateway reads the adapters' names (`ADAPTER_NAMES_DIR`); None with LoRA off."""
    return f"{ADAPTER_NAMES_DIR}/{NAMES_KEY}" if spec.engine.lora is not None else None


def adapter_names_volume(
    spec: InferenceServiceSpec, *, owner: Owner, suffix: str = ""
) -> list[tuple[dict[str, Any], str]]:
    """(volume, mount path) of ConfigMap `<name>-adapter-names` (`owner`'s) at `ADAPTER_NAMES_DIR`;
    none with LoRA off. A whole-volume mount, not subPath: the kubelet then updates the file in the
    running pods (within its sync period, about a minute). A gateway serving several services names
    each volume with a `suffix` (`-<service>`: `lora-names-` and a name of at most 52 characters fit
    a volume name's 63) and mounts it elsewhere (`resources.gateway`)."""
    if spec.engine.lora is None:
        return []
    configmap = {"name": child_name(owner, ADAPTER_NAMES_SUFFIX)}
    return [({"name": f"{ADAPTER_NAMES_VOLUME}{suffix}", "configMap": configmap}, ADAPTER_NAMES_DIR)]


def engine_kv_keys(spec: InferenceServiceSpec) -> EngineKVKeys | None:
    """How the vLLM engines name their KV-pool chunks beyond the spec: the connector, the keys' model
    part (vLLM's model argument for LMCache, which keys by `model_config.model`; `spec.model.name`,
    which Tandem's connector is given) and the PYTHONHASHSEED the engines get; none for the simulator."""
    if spec.engine.kind != "vllm":
        return None
    connector = spec.kv_pool.connector
    model = model_argument(spec) if connector == "lmcache" else spec.model.name
    return EngineKVKeys(connector=connector, model=model, python_hash_seed=engine_hash_seed(spec))


def tokenizer_path(spec: InferenceServiceSpec) -> str | None:
    """Where the router reads the model's tokenizer files: the tokenizer ConfigMap's mount, else the
    weights' PVC mounted read-only as the engines mount it; none for the simulator (its tokenizer
    is built in) or for a model without files (the router then estimates, docs/router.md)."""
    if spec.engine.kind != "vllm":
        return None
    if spec.model.tokenizer is not None:
        return TOKENIZER_DIR
    source = spec.model.source
    if source is not None and source.pvc:
        return model_argument(spec)
    return None


def build_router_configmap(spec: InferenceServiceSpec, *, owner: Owner) -> dict[str, Any]:
    """ConfigMap `<name>-router` holding `router.yaml` (a RouterConfig document)."""
    document = config_document(router_config(spec, owner=owner))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, name=child_name(owner, ROUTER_SUFFIX), role=Role.ROUTER),
        "data": {CONFIG_FILE: to_yaml(document)},
    }


def config_document(config: RouterConfig) -> dict[str, Any]:
    """`config` as a ConfigMap holds it (JSON types, camelCase keys), without `adapterNamesFile` and
    `adapterLoadDir` when they are unset: a service without LoRA keeps the document it had before
    those keys existed, which a gateway of an older image (refusing unknown keys) still reads."""
    unset = {"adapter_names_file", "adapter_load_dir"}
    exclude = {name for name in unset if getattr(config, name) is None} or None
    return config.model_dump(mode="json", by_alias=True, exclude=exclude)


def build_router_service_account(owner: Owner, role: Role = Role.ROUTER) -> dict[str, Any]:
    """ServiceAccount `<name>-router` (an InferenceGateway's: `<name>-gateway`), the identity the
    gateway uses to read EndpointSlices."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(owner, name=service_name(owner, role), role=role),
    }


def build_router_role(owner: Owner, role: Role = Role.ROUTER) -> dict[str, Any]:
    """Role `<name>-router` (`<name>-gateway`): read EndpointSlices in the namespace (the pools'
    members) and list and watch its Pods (their `tandem.dev/kv-layout` labels, which EndpointSlices
    do not carry), nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(owner, name=service_name(owner, role), role=role),
        "rules": [
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        ],
    }


def build_router_role_binding(owner: Owner, role: Role = Role.ROUTER) -> dict[str, Any]:
    """RoleBinding `<name>-router` (`<name>-gateway`) of the Role to the ServiceAccount."""
    name = service_name(owner, role)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_meta(owner, name=name, role=role),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


@dataclass(frozen=True)
class GatewayPod:
    """What varies between a service's own gateway pod and an InferenceGateway's: the credentials'
    variables, the API-key Secret, and extra read-only volumes (tokenizer files, adapter names) with
    their mounts; only `config`'s data is in the pod template's hash, not what these volumes hold."""

    env: list[dict[str, Any]]
    api_keys: SecretKeyRef | None = None
    #: The diagnostics port's token (`TANDEM_METRICS_TOKEN`), when the spec asks for one.
    metrics_token: SecretKeyRef | None = None
    mounts: list[tuple[dict[str, Any], str]] = field(default_factory=list)


def _router_container(pod: GatewayPod, *, images: Images) -> dict[str, Any]:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    container: dict[str, Any] = {
        "name": "router",
        "image": images.tandem,
        "command": ["tandem"],
        "args": [
            "router",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_FILE}",
            "--host",
            "0.0.0.0",
            "--port",
            str(ROUTER_PORT),
            "--metrics-port",
            str(METRICS_PORT),
        ],
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {**health, "periodSeconds": 5},
        # /health is 503 while no decode engine is in rotation: right for readiness, wrong for
        # liveness (restarting the router would not bring engines back), so liveness is TCP.
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10},
        "resources": ROUTER_RESOURCES,
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": TMP_MOUNT},
        ],
        "securityContext": container_security_context(),
    }
    if pod.api_keys is not None:
        container["volumeMounts"].append({"name": "api-keys", "mountPath": AUTH_DIR, "readOnly": True})
    for volume, mount in pod.mounts:
        container["volumeMounts"].append({"name": volume["name"], "mountPath": mount, "readOnly": True})
    container["env"] = pod.env
    if pod.metrics_token is not None:
        token = {"secretKeyRef": {"name": pod.metrics_token.name, "key": pod.metrics_token.key}}
        container["env"] = [*pod.env, {"name": METRICS_TOKEN_ENV, "valueFrom": token}]
    return container


def service_gateway_pod(spec: InferenceServiceSpec, *, owner: Owner) -> GatewayPod:
    """The parts of a service's own gateway pod: the pool's password (from its Secret) for the
    barrier's look-ups and shared counters (the URL in the config has none), the key the gateway
    sends to engines, the pool key (the engines' keyed chunk hashes) and the salt key (tenants'
    cache_salt; the gateway's alone); the API keys, the tokenizer files and the adapters' names."""
    env = [
        *password_env(spec),
        *engine_key_env(spec, GATEWAY_ENGINE_KEY_ENV),
        *cache_keys_env(owner, gateway=True),
    ]
    secret = spec.router.auth.api_keys_secret if spec.router.auth.enabled else None
    return GatewayPod(
        env=env,
        api_keys=secret,
        mounts=[*tokenizer_volume(spec), *adapter_names_volume(spec, owner=owner)],
        metrics_token=metrics_token_ref(owner) if spec.router.metrics_token else None,
    )


def build_router_deployment(
    spec: InferenceServiceSpec, *, owner: Owner, images: Images, config: dict[str, Any]
) -> dict[str, Any]:
    """Deployment `<name>-router`, given its ConfigMap `config`; the pod template carries the
    config's hash, so a config change rolls the router pods; `spec.router.template` is merged onto
    its pods."""
    pod = service_gateway_pod(spec, owner=owner)
    deployment = build_gateway_deployment(
        pod, owner=owner, role=Role.ROUTER, replicas=spec.router.replicas, images=images, config=config
    )
    # `spec.router.template` merged onto the pod (container `router`; `podtemplate.py`).
    template = deployment["spec"]["template"]
    deployment["spec"]["template"] = apply_templates(template, [spec.router.template])
    return deployment


def build_gateway_deployment(
    pod: GatewayPod, *, owner: Owner, role: Role, replicas: int, images: Images, config: dict[str, Any]
) -> dict[str, Any]:
    """The gateway Deployment `<name>-<role>` running `pod`, given its ConfigMap `config` (same
    name); the pod template carries the config's hash, so a config change rolls the pods."""
    name = service_name(owner, role)
    meta = object_meta(owner, name=name, role=role)
    annotations = {
        CONFIG_HASH_ANNOTATION: config_hash(config["data"]),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": name}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if pod.api_keys is not None:
        volumes.append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": pod.api_keys.name,
                    "items": [{"key": pod.api_keys.key, "path": API_KEYS_FILE}],
                    "defaultMode": 0o440,
                },
            }
        )
    volumes += [volume for volume, _ in pod.mounts]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(owner, role)},
            "template": {
                "metadata": {"labels": meta["labels"], "annotations": annotations},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [_router_container(pod, images=images)],
                    "volumes": volumes,
                    "securityContext": pod_security_context(),
                    "enableServiceLinks": False,
                },
            },
        },
    }


def tokenizer_volume(spec: InferenceServiceSpec, *, suffix: str = "") -> list[tuple[dict[str, Any], str]]:
    """(volume, mount path) for `tokenizer_path`: the ConfigMap, or the weights' PVC read-only. A
    gateway serving several services names each volume with a `suffix` (`-<service>`) and mounts it
    elsewhere (`resources.gateway`)."""
    if tokenizer_path(spec) is None:
        return []
    if spec.model.tokenizer is not None:
        volume = {"name": f"tokenizer{suffix}", "configMap": {"name": spec.model.tokenizer.config_map}}
        return [(volume, TOKENIZER_DIR)]
    assert spec.model.source is not None and spec.model.source.pvc
    volume = {
        "name": f"model{suffix}",
        "persistentVolumeClaim": {"claimName": spec.model.source.pvc, "readOnly": True},
    }
    return [(volume, MODEL_MOUNT)]
