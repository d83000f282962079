"""The engine pools: one Deployment per role (prefill = KV producer, decode = KV consumer).

`engine.kind: vllm` runs the vLLM image with the KV connector `kvPool.connector` names:
- `lmcache`: vLLM's LMCacheConnectorV1, configured by LMCache's `LMCACHE_*` environment and the
  `<name>-lmcache` ConfigMap (`LMCACHE_CONFIG_FILE`; left out when the pool has a password, because
  LMCache ignores its environment when a file is given and the password may only come from a Secret).
  An init container first checks the image's vLLM and LMCache (`tandem.kvpool.lmcache_check`): a pair
  known to corrupt KV transfers keeps the pod from starting, with the reason as its log line;
- `tandem`: `tandem.kvpool.vllm_connector.TandemConnector`, configured entirely by its
  `--kv-transfer-config` (pool URL, model, chunk size), its password from `TANDEM_KVPOOL_PASSWORD`.
Both come from the pure builders in `tandem.kvpool.engine_config`. `engine.kind: sim` runs `tandem sim`
(Tandem's vLLM-compatible simulator) in the Tandem image. All listen on port 8000 with `/health` and
`/metrics`, so probes, Services and the router treat them alike. With `engine.lora`, both pools get
the LoRA flags, environment and adapter volumes (`lora.py`). Every pod runs non-root with a
read-only root filesystem (`security.py`).

Each pool adds its own `engine` settings over the shared ones (image; args after the shared args;
env over the shared env: `tandem.core.poolengine`, the rule `tandem up` applies too), then
`spec.engine.template` and the pool's `template` are merged onto the pod (`podtemplate.py`); every
pod carries the KV-layout label (`kvlayout.py`). A pool whose engine spans several pods
(`nodesPerReplica` > 1) is a LeaderWorkerSet instead (`multinode.py`). Pure
builders.
"""

from __future__ import annotations

import inspect
from typing import Any

from tandem.core.kvevents import (
    KV_EVENTS_PORT,
    KV_EVENTS_REPLAY_PORT,
    cluster_binds,
    sim_kv_events_args,
    vllm_kv_events_config,
)
from tandem.core.poolengine import PoolName, merged_env, pool_engine_args, pool_engine_env
from tandem.core.spec import ENGINE_HASH_SEED, DecodeSpec, InferenceServiceSpec, PrefillSpec
from tandem.core.tracing import engine_tracing
from tandem.kvpool import engine_config, lmcache_check
from tandem.kvpool.engine_config import KVRole, lmcache_env, to_json
from tandem.operator.resources.kvlayout import KV_LAYOUT_LABEL, kv_layout, pool_image
from tandem.operator.resources.kvpool import (
    LMCACHE_FILE,
    LMCACHE_SUFFIX,
    build_lmcache_configmap,
    config_hash,
    kv_pool_url,
    lmcache_pool_url,
    uses_lmcache,
)
from tandem.operator.resources.lora import lora_args, lora_env, lora_volumes, sync_container
from tandem.operator.resources.meta import (
    ENGINE_PORT,
    Images,
    Owner,
    Role,
    child_name,
    labels,
    object_meta,
    selector_labels,
)
from tandem.operator.resources.multinode import build_leader_worker_set
from tandem.operator.resources.podtemplate import apply_templates
from tandem.operator.resources.security import (
    TMP_MOUNT,
    VLLM_UID,
    cache_keys_env,
    container_security_context,
    engine_key_env,
    password_env,
    pod_security_context,
    scratch_volumes,
)

#: Where the model PVC is mounted (read-only); `model.source.path` is relative to it.
MODEL_MOUNT = "/models"
LMCACHE_MOUNT = "/etc/lmcache"
#: vLLM's HOME (an emptyDir): ~/.cache (Hugging Face downloads, torch.compile and kernel caches) and
#: ~/.config live here, as the root filesystem is read-only.
VLLM_HOME = "/home/vllm"
#: How long a terminating engine waits for its running and queued requests to finish.
DRAIN_SECONDS = 120
CONFIG_HASH_ANNOTATION = "tandem.dev/config-hash"
KV_ROLE: dict[Role, KVRole] = {Role.PREFILL: "producer", Role.DECODE: "consumer"}

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

#: The init container of LMCache engine pods runs this file's source with the image's `python3 -c`.
LMCACHE_CHECK_SCRIPT = inspect.getsource(lmcache_check)
LMCACHE_CHECK_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def pool_spec(spec: InferenceServiceSpec, role: Role) -> PrefillSpec | DecodeSpec:
    """The spec section of a pool role."""
    return spec.prefill if role is Role.PREFILL else spec.decode


def pool_name(role: Role) -> PoolName:
    """The pool a role runs (`tandem.core.poolengine`'s name for it)."""
    return "prefill" if role is Role.PREFILL else "decode"


def kv_transfer_config(
    spec: InferenceServiceSpec, role: Role, *, owner: Owner, layout: str | None = None
) -> dict[str, object]:
    """vLLM's `--kv-transfer-config` for a role: the spec's connector, producer on prefill and
    consumer on decode (`tandem.kvpool.engine_config.kv_transfer_config`). The pool URL in it never
    carries the Secret's password (vLLM logs this JSON); the connector reads that from its env.
    `layout`: the pods' KV-layout label, which Tandem's connector puts in its keys' scope."""
    return engine_config.kv_transfer_config(
        connector=spec.kv_pool.connector,
        role=KV_ROLE[role],
        pool_url=kv_pool_url(spec, owner),
        model=spec.model.name,
        chunk_size=spec.kv_pool.chunk_size,
        kv_layout=layout,
    )


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


def vllm_args(
    spec: InferenceServiceSpec, role: Role, *, owner: Owner, layout: str | None = None
) -> list[str]:
    """`vllm serve` arguments of a role; the spec's `engine.args` come last so they can override.
    `layout`: the pods' KV-layout label (in Tandem's connector's keys)."""
    # Both names, as the router accepts both in `model` and forwards the body unchanged; the
    # first is the one vLLM reports in its metrics.
    names = dict.fromkeys([spec.model.public_name, spec.model.name])
    pool = pool_spec(spec, role)
    return [
        model_argument(spec),
        "--served-model-name",
        *names,
        "--host",
        "0.0.0.0",
        "--port",
        str(ENGINE_PORT),
        "--tensor-parallel-size",
        str(pool.tensor_parallel),
        *(data_parallel_args(spec, role) if pool.multinode else []),
        "--kv-transfer-config",
        to_json(kv_transfer_config(spec, role, owner=owner, layout=layout)),
        *_kv_events_args(spec, vllm=True),
        *engine_tracing(spec.tracing, kind="vllm")[0],
        *lora_args(spec),
        *pool_engine_args(spec, pool_name(role)),
    ]


#: vLLM's data-parallel RPC port on a multi-node pool's leader (vLLM's and KServe's default).
DP_RPC_PORT = 5555


def ranks_per_pod(spec: InferenceServiceSpec, role: Role) -> int:
    """Data-parallel ranks one pod of a multi-node pool runs: its GPUs / tensorParallel (at least 1)."""
    pool = pool_spec(spec, role)
    gpus = engine_resources(spec, role).get("limits", {}).get("nvidia.com/gpu", str(pool.tensor_parallel))
    return max(1, int(gpus) // pool.tensor_parallel) if str(gpus).isdigit() else 1


def data_parallel_args(spec: InferenceServiceSpec, role: Role) -> list[str]:
    """The data-parallel flags every pod of a multi-node pool shares: the group's size in ranks and
    this pod's share; the leader's address and each pod's first rank are added when it starts
    (`multinode.py`), as they come from LeaderWorkerSet's environment."""
    local = ranks_per_pod(spec, role)
    return [
        "--data-parallel-size",
        str(local * pool_spec(spec, role).nodes_per_replica),
        "--data-parallel-size-local",
        str(local),
        "--data-parallel-rpc-port",
        str(DP_RPC_PORT),
    ]


def _kv_events_args(spec: InferenceServiceSpec, *, vllm: bool) -> list[str]:
    """With `router.prefixSource: precise`, the engine publishes its KV events on every interface,
    vLLM's ports (`tandem.core.kvevents`), where the router's subscribers connect."""
    if spec.router.prefix_source != "precise":
        return []
    events, replay = cluster_binds()
    if vllm:
        return ["--kv-events-config", to_json(vllm_kv_events_config(endpoint=events, replay=replay))]
    return sim_kv_events_args(endpoint=events, replay=replay)


def sim_args(spec: InferenceServiceSpec, role: Role, *, owner: Owner, layout: str | None = None) -> list[str]:
    """`tandem sim` arguments of a role, mirroring what vLLM gets (`layout`: the pods' KV-layout
    label, in the simulator's pool keys as in Tandem's connector's)."""
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
        *(["--kv-layout", layout] if layout else []),
        "--host",
        "0.0.0.0",
        "--port",
        str(ENGINE_PORT),
        *_kv_events_args(spec, vllm=False),
        *engine_tracing(spec.tracing, kind="sim")[0],
        *lora_args(spec),
        *pool_engine_args(spec, pool_name(role)),
    ]


def engine_env(spec: InferenceServiceSpec, *, owner: Owner, role: Role | None = None) -> list[dict[str, Any]]:
    """Environment of an engine container of `role`; the spec's `engine.env` wins on a name clash,
    and the pool's `engine.env` over that.

    The engine API key (`VLLM_API_KEY`, which vLLM and `tandem sim` require on /v1/*), the pool's
    password and the pool key (`TANDEM_KV_POOL_KEY`; never the gateway's salt key) come from their
    Secrets. The password variable comes before LMCache's URL, which refers to it as
    `$(TANDEM_KVPOOL_PASSWORD)`: Kubernetes expands only variables defined earlier in the list.
    """
    env: dict[str, dict[str, Any]] = {"PYTHONHASHSEED": {"value": ENGINE_HASH_SEED}}
    secrets = [*password_env(spec), *engine_key_env(spec), *cache_keys_env(owner, gateway=False)]
    env |= {e["name"]: {"valueFrom": e["valueFrom"]} for e in secrets}
    if spec.engine.kind == "vllm":
        env["HOME"] = {"value": VLLM_HOME}
    if uses_lmcache(spec):
        url = lmcache_pool_url(spec, owner)
        env |= {
            k: {"value": v} for k, v in lmcache_env(pool_url=url, chunk_size=spec.kv_pool.chunk_size).items()
        }
        if spec.kv_pool.redis.password_secret is None:
            env["LMCACHE_CONFIG_FILE"] = {"value": f"{LMCACHE_MOUNT}/{LMCACHE_FILE}"}
    env |= lora_env(spec)
    _, tracing_env = engine_tracing(spec.tracing, kind=spec.engine.kind)
    if tracing_env:  # the spans' service: `<name>-prefill`, `<name>-decode`
        env |= {k: {"value": v} for k, v in tracing_env.items()}
        env["OTEL_SERVICE_NAME"] = {"value": f"{owner.name}-{role.value}" if role else f"{owner.name}-engine"}
    told = pool_engine_env(spec, pool_name(role)) if role is not None else merged_env(spec.engine.env)
    env |= {name: {"value": value} for name, value in told.items()}
    return [{"name": name, **entry} for name, entry in env.items()]


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
    layout = kv_layout(spec, images, model=model_argument(spec))
    args = (
        vllm_args(spec, role, owner=owner, layout=layout)
        if vllm
        else sim_args(spec, role, owner=owner, layout=layout)
    )
    container: dict[str, Any] = {
        "name": "engine",
        "image": pool_image(spec, role.value, images),
        "command": ["vllm", "serve"] if vllm else ["tandem"],
        "args": args,
        "env": engine_env(spec, owner=owner, role=role),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}, *_kv_events_ports(spec)],
        **_probes(),
        "lifecycle": {"preStop": {"exec": {"command": ["python3", "-c", DRAIN_SCRIPT]}}},
    }
    resources = engine_resources(spec, role)
    if resources:
        container["resources"] = resources
    mounts = _volumes(spec, owner)[1]
    if mounts:
        container["volumeMounts"] = mounts
    container["securityContext"] = container_security_context()
    return container


def _lmcache_check_container(spec: InferenceServiceSpec, role: Role, images: Images) -> dict[str, Any]:
    """Refuses an engine image whose vLLM and LMCache are known not to fit (`lmcache_check`). It gets
    only `spec.engine.env` and the pool's (where TANDEM_LMCACHE_CHECK=off skips it), not the pool's
    password."""
    told = pool_engine_env(spec, pool_name(role))
    return {
        "name": "lmcache-check",
        "image": pool_image(spec, role.value, images),
        "command": ["python3", "-c", LMCACHE_CHECK_SCRIPT],
        "env": [{"name": name, "value": value} for name, value in told.items()],
        "resources": LMCACHE_CHECK_RESOURCES,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }


def _volumes(spec: InferenceServiceSpec, owner: Owner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod volumes and the engine container's mounts: model PVC, LMCache config, shared memory,
    emptyDirs for what the processes write (/tmp; vLLM's HOME), and the adapters (`lora.py`)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    source = spec.model.source
    if source is not None and source.pvc:
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    if uses_lmcache(spec):
        lmcache = {"name": child_name(owner, LMCACHE_SUFFIX)}
        volumes.append({"name": "lmcache-config", "configMap": lmcache})
        mounts.append({"name": "lmcache-config", "mountPath": LMCACHE_MOUNT, "readOnly": True})
    scratch = {"tmp": TMP_MOUNT}
    if spec.engine.kind == "vllm":
        # NCCL (tensor parallelism) needs more shared memory than a container's default 64 MiB.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        scratch["home"] = VLLM_HOME
    scratch_vols, scratch_mounts = scratch_volumes(scratch)
    adapter_vols, adapter_mounts = lora_volumes(spec, owner)
    return volumes + scratch_vols + adapter_vols, mounts + scratch_mounts + adapter_mounts


def engine_pod_template(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    role: Role,
    images: Images,
    lmcache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod template of one engine pool: the operator's pod, then `spec.engine.template` and the
    pool's `template` merged onto it, with the KV-layout label.

    With LMCache, `lmcache` is its ConfigMap (built when None); the pod template carries its hash,
    so a change of the pool's configuration rolls the pods (a change of the env rolls them anyway).
    vLLM runs as uid/gid 1000 (its images default to root); the Tandem image's USER is non-root.
    """
    if role not in KV_ROLE:
        raise ValueError(f"not an engine role: {role}")
    pod_labels = {**labels(owner, role), KV_LAYOUT_LABEL: kv_layout(spec, images, model=model_argument(spec))}
    template_meta: dict[str, Any] = {
        "labels": pod_labels,
        "annotations": {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(ENGINE_PORT),
            "prometheus.io/path": "/metrics",
        },
    }
    if uses_lmcache(spec):
        lmcache = lmcache or build_lmcache_configmap(spec, owner=owner)
        template_meta["annotations"][CONFIG_HASH_ANNOTATION] = config_hash(lmcache["data"])
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, role, owner=owner, images=images)],
        "terminationGracePeriodSeconds": DRAIN_SECONDS + 30,
        "securityContext": pod_security_context(run_as_user=VLLM_UID if spec.engine.kind == "vllm" else None),
        "automountServiceAccountToken": False,  # engines never call the Kubernetes API
        "enableServiceLinks": False,
        "volumes": _volumes(spec, owner)[0],
    }
    init = [_lmcache_check_container(spec, role, images)] if uses_lmcache(spec) else []
    sidecar = sync_container(spec, owner=owner, images=images)
    if sidecar is not None:
        init.append(sidecar)
    if init:
        pod_spec["initContainers"] = init
    pod = {"metadata": template_meta, "spec": pod_spec}
    return apply_templates(pod, [spec.engine.template, pool_spec(spec, role).template])


def build_engine_deployment(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    role: Role,
    images: Images,
    lmcache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Deployment `<name>-prefill` or `<name>-decode` for one single-node engine pool
    (`engine_pod_template` for its pods)."""
    template = engine_pod_template(spec, owner=owner, role=role, images=images, lmcache=lmcache)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner, name=child_name(owner, role.value), role=role),
        "spec": {
            "replicas": pool_spec(spec, role).replicas,
            "selector": {"matchLabels": selector_labels(owner, role)},
            "template": template,
        },
    }


def build_engine_workload(
    spec: InferenceServiceSpec,
    *,
    owner: Owner,
    role: Role,
    images: Images,
    lmcache: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The workload of one engine pool: its Deployment, or its LeaderWorkerSet when one engine
    spans several pods (`nodesPerReplica` > 1, `multinode.py`)."""
    if not pool_spec(spec, role).multinode:
        return build_engine_deployment(spec, owner=owner, role=role, images=images, lmcache=lmcache)
    template = engine_pod_template(spec, owner=owner, role=role, images=images, lmcache=lmcache)
    local = ranks_per_pod(spec, role)
    return build_leader_worker_set(spec, owner=owner, role=role, template=template, local_ranks=local)


def _kv_events_ports(spec: InferenceServiceSpec) -> list[dict[str, object]]:
    if spec.router.prefix_source != "precise":
        return []
    return [
        {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
        {"name": "kv-replay", "containerPort": KV_EVENTS_REPLAY_PORT, "protocol": "TCP"},
    ]
