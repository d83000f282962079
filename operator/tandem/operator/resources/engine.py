"""The engine pools: one Deployment per role (prefill = KV producer, decode = KV consumer).

`engine.kind: vllm` runs the vLLM image with LMCache as the KV connector; `engine.kind: sim` runs
`tandem sim` (Tandem's vLLM-compatible simulator) in the Tandem image. Both listen on port 8000 with
`/health` and `/metrics`, so probes, Services and the router treat them alike. Pure builders.
"""

from __future__ import annotations

import json
from typing import Any

from tandem.core.spec import DecodeSpec, InferenceServiceSpec, PrefillSpec
from tandem.operator.resources.kvpool import (
    LMCACHE_FILE,
    LMCACHE_SUFFIX,
    build_lmcache_configmap,
    config_hash,
    kv_pool_url,
)
from tandem.operator.resources.meta import (
    ENGINE_PORT,
    Images,
    Owner,
    Role,
    child_name,
    object_meta,
    selector_labels,
)

#: Where the model PVC is mounted (read-only); `model.source.path` is relative to it.
MODEL_MOUNT = "/models"
LMCACHE_MOUNT = "/etc/lmcache"
#: Every engine pod gets the same hash seed: LMCache and vLLM derive prefix-chunk keys from Python's
#: `hash()`, so producer and consumer must agree on it or the consumer never finds a chunk.
PYTHONHASHSEED = "0"
#: How long a terminating engine waits for its running and queued requests to finish.
DRAIN_SECONDS = 120
CONFIG_HASH_ANNOTATION = "tandem.dev/config-hash"
KV_ROLE = {Role.PREFILL: "producer", Role.DECODE: "consumer"}

# preStop drain: give the router a few seconds to see the pod leave the EndpointSlice, then wait
# until the engine reports no running or waiting request (vLLM metric names), at most DRAIN_SECONDS.
DRAIN_SCRIPT = f"""\
import time, urllib.request
time.sleep(5)
deadline = time.monotonic() + {DRAIN_SECONDS}
names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:{ENGINE_PORT}/metrics", timeout=2).read()
    except OSError:
        break
    lines = text.decode().splitlines()
    if sum(float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith(names)) == 0:
        break
    time.sleep(1)
"""


def pool_spec(spec: InferenceServiceSpec, role: Role) -> PrefillSpec | DecodeSpec:
    """The spec section of a pool role."""
    return spec.prefill if role is Role.PREFILL else spec.decode


def kv_transfer_config(role: Role) -> dict[str, Any]:
    """vLLM's `--kv-transfer-config` for a role: LMCache, producer on prefill, consumer on decode.

    The one place a later KV connector choice (`kvPool.connector`) plugs in.
    """
    return {"kv_connector": "LMCacheConnectorV1", "kv_role": f"kv_{KV_ROLE[role]}"}


def model_argument(spec: InferenceServiceSpec) -> str:
    """What vLLM serves: the weights' path under the PVC mount, the source URI, or the model name.

    `hf://org/name` URIs are given to vLLM as the Hugging Face id `org/name`.
    """
    source = spec.model.source
    if source is not None and source.pvc:
        return f"{MODEL_MOUNT}/{(source.path or '').lstrip('/')}".rstrip("/")
    if source is not None and source.uri:
        return source.uri.removeprefix("hf://")
    return spec.model.name


def vllm_args(spec: InferenceServiceSpec, role: Role) -> list[str]:
    """`vllm serve` arguments of a role; the spec's `engine.args` come last so they can override."""
    # Both names, as the router accepts both in `model` and forwards the body unchanged; the
    # first is the one vLLM reports in its metrics.
    names = dict.fromkeys([spec.model.public_name, spec.model.name])
    return [
        model_argument(spec),
        "--served-model-name",
        *names,
        "--host",
        "0.0.0.0",
        "--port",
        str(ENGINE_PORT),
        "--tensor-parallel-size",
        str(pool_spec(spec, role).tensor_parallel),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(role), separators=(",", ":")),
        *spec.engine.args,
    ]


def sim_args(spec: InferenceServiceSpec, role: Role, *, owner: Owner) -> list[str]:
    """`tandem sim` arguments of a role, mirroring what vLLM gets."""
    sim = spec.engine.sim
    return [
        "sim",
        "--model",
        spec.model.name,
        "--served-model-name",
        spec.model.public_name,
        "--profile",
        sim.profile,
        "--time-scale",
        f"{sim.time_scale:g}",
        "--kv-role",
        KV_ROLE[role],
        "--kv-pool",
        kv_pool_url(spec, owner),
        "--kv-chunk-size",
        str(spec.kv_pool.chunk_size),
        "--host",
        "0.0.0.0",
        "--port",
        str(ENGINE_PORT),
        *spec.engine.args,
    ]


def engine_env(spec: InferenceServiceSpec) -> list[dict[str, str]]:
    """Environment of every engine container; the spec's `engine.env` wins on a name clash."""
    env = {"PYTHONHASHSEED": PYTHONHASHSEED}
    if spec.engine.kind == "vllm":
        env["LMCACHE_CONFIG_FILE"] = f"{LMCACHE_MOUNT}/{LMCACHE_FILE}"
    env |= {var.name: var.value for var in spec.engine.env}
    return [{"name": name, "value": value} for name, value in env.items()]


def engine_resources(spec: InferenceServiceSpec, role: Role) -> dict[str, Any]:
    """The pool's resources; vLLM pools always get `nvidia.com/gpu` limits (default: the TP size)."""
    pool = pool_spec(spec, role)
    requests, limits = dict(pool.resources.requests), dict(pool.resources.limits)
    if spec.engine.kind == "vllm":
        gpus = limits.get("nvidia.com/gpu") or requests.get("nvidia.com/gpu")
        limits["nvidia.com/gpu"] = gpus or str(pool.tensor_parallel)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def _probes() -> dict[str, Any]:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        # Loading weights can take minutes; liveness only starts counting once this succeeds.
        "startupProbe": {**health, "periodSeconds": 10, "failureThreshold": 90},
        "readinessProbe": {**health, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
    }


def _container(spec: InferenceServiceSpec, role: Role, *, owner: Owner, images: Images) -> dict[str, Any]:
    vllm = spec.engine.kind == "vllm"
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.engine.image if vllm else images.tandem,
        "command": ["vllm", "serve"] if vllm else ["tandem"],
        "args": vllm_args(spec, role) if vllm else sim_args(spec, role, owner=owner),
        "env": engine_env(spec),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        **_probes(),
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", DRAIN_SCRIPT]}}},
    }
    resources = engine_resources(spec, role)
    if resources:
        container["resources"] = resources
    mounts = _volumes(spec, owner)[1]
    if mounts:
        container["volumeMounts"] = mounts
    if not vllm:
        container["securityContext"] = {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    return container


def _volumes(spec: InferenceServiceSpec, owner: Owner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod volumes and the engine container's mounts: model PVC, LMCache config, shared memory."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    source = spec.model.source
    if source is not None and source.pvc:
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    if spec.engine.kind == "vllm":
        lmcache = {"name": child_name(owner, LMCACHE_SUFFIX)}
        volumes.append({"name": "lmcache-config", "configMap": lmcache})
        mounts.append({"name": "lmcache-config", "mountPath": LMCACHE_MOUNT, "readOnly": True})
        # NCCL (tensor parallelism) needs more shared memory than a container's default 64 MiB.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def build_engine_deployment(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    role: Role,
    images: Images,
    lmcache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Deployment `<name>-prefill` or `<name>-decode` for one engine pool.

    For vLLM, `lmcache` is the LMCache ConfigMap (built when None); the pod template carries its
    hash, so a change of the pool's configuration rolls the pods.
    """
    if role not in KV_ROLE:
        raise ValueError(f"not an engine role: {role}")
    meta = object_meta(owner, name=child_name(owner, role.value), role=role)
    template_meta: dict[str, Any] = {
        "labels": meta["labels"],
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(ENGINE_PORT),
            "prometheus.io/path": "/metrics",
        },
    }
    if spec.engine.kind == "vllm":
        lmcache = lmcache or build_lmcache_configmap(spec, owner=owner)
        template_meta["annotations"][CONFIG_HASH_ANNOTATION] = config_hash(lmcache["data"])
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, role, owner=owner, images=images)],
        "terminationGracePeriodSeconds": DRAIN_SECONDS + 30,
        "enableServiceLinks": False,
    }
    volumes = _volumes(spec, owner)[0]
    if volumes:
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": pool_spec(spec, role).replicas,
            "selector": {"matchLabels": selector_labels(owner, role)},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
