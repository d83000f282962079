"""The KV pool: the LMCache configuration the engines read, and the managed Redis behind it.

With `kvPool.redis.url` set, the pool is that external Redis and no Redis is deployed; otherwise the
pool is a single Redis pod (no persistence: it is a cache) behind the Service `<name>-kv`, with
`maxmemory` and `maxmemory-policy` from the spec. Pure builders.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from tandem.core.quantity import parse_bytes
from tandem.core.spec import InferenceServiceSpec
from tandem.kvpool.engine_config import PASSWORD_ENV, lmcache_env
from tandem.kvpool.redisconf import authenticated_command, pool_config, server_args
from tandem.operator.resources.meta import (
    REDIS_PORT,
    Images,
    Owner,
    Role,
    child_name,
    object_meta,
    to_yaml,
)
from tandem.operator.resources.meta import selector_labels as _selector
from tandem.operator.resources.podtemplate import apply_templates
from tandem.operator.resources.security import (
    REDIS_UID,
    TMP_MOUNT,
    container_security_context,
    password_env,
    pod_security_context,
    scratch_volumes,
)

LMCACHE_SUFFIX = "lmcache"
KV_SUFFIX = "kv"
#: File name of the LMCache configuration inside its ConfigMap (and its mount directory).
LMCACHE_FILE = "lmcache.yaml"
#: Headroom of the Redis container's memory limit over `maxmemory`: Redis needs room for client
#: buffers, replication backlog and fragmentation (the Redis docs suggest planning ~25% extra).
REDIS_LIMIT_FACTOR = Decimal("1.25")
#: Redis' working directory (an emptyDir; also where the password config file is written).
REDIS_DATA_DIR = "/data"


def _mebibytes(n_bytes: Decimal | int) -> str:
    """Bytes as a quantity in whole MiB, rounded up: 1342177280 → `1280Mi`."""
    mib = (Decimal(n_bytes) / 2**20).to_integral_value(rounding="ROUND_CEILING")
    return f"{mib}Mi"


def kv_pool_url(spec: InferenceServiceSpec, owner: Owner) -> str:
    """Where the pool is: the external URL, else `redis://<name>-kv:6379` (same namespace)."""
    return spec.kv_pool.redis.url or f"redis://{child_name(owner, KV_SUFFIX)}:{REDIS_PORT}"


def config_hash(data: dict[str, str]) -> str:
    """Short digest of a ConfigMap's data, put on pod templates so a config change rolls the pods."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(data.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def lmcache_pool_url(spec: InferenceServiceSpec, owner: Owner) -> str:
    """The pool URL LMCache is given: with a password Secret, the URL carries `$(TANDEM_KVPOOL_PASSWORD)`,
    which Kubernetes expands from the environment variable of that name when the container starts
    (LMCache reads the password only from its URL). A URL that already has a password keeps it."""
    url = kv_pool_url(spec, owner)
    if spec.kv_pool.redis.password_secret is None:
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        return url
    reference = f"$({PASSWORD_ENV})"
    if parts.scheme == "unix":  # redis-py takes a socket's password as a query parameter
        return f"{url}{'&' if parts.query else '?'}password={reference}"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{reference}@{host}"))


def lmcache_config(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    """LMCache settings shared by both roles, as in `lmcache.yaml`: `engine_config.lmcache_env` with
    `LMCACHE_<KEY>` → `key` and the values typed (the shared-pool layout, no NIXL P/D mode).

    The prefill engine (kv_producer) stores every `chunk_size`-token chunk of a prompt's KV in the
    pool; the decode engine (kv_consumer) looks the chunks up by key. Keys contain the world size,
    so both pools must use the same tensor-parallel size to share chunks. The URL here never has a
    password in it: with a password Secret the engines use the environment instead (engine.py).
    """
    env = lmcache_env(pool_url=kv_pool_url(spec, owner), chunk_size=spec.kv_pool.chunk_size)
    return {name.removeprefix("LMCACHE_").lower(): yaml.safe_load(value) for name, value in env.items()}


def build_lmcache_configmap(spec: InferenceServiceSpec, *, owner: Owner) -> dict[str, Any]:
    """ConfigMap `<name>-lmcache` with `lmcache.yaml`, mounted by vLLM engines (LMCACHE_CONFIG_FILE)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, name=child_name(owner, LMCACHE_SUFFIX), role=Role.KV_POOL),
        "data": {LMCACHE_FILE: to_yaml(lmcache_config(spec, owner))},
    }


def uses_lmcache(spec: InferenceServiceSpec) -> bool:
    """Whether the engines are vLLM with LMCache's connector (and so need the LMCache ConfigMap)."""
    return spec.engine.kind == "vllm" and spec.kv_pool.connector == "lmcache"


def _redis_container(spec: InferenceServiceSpec, images: Images) -> dict[str, Any]:
    maxmemory = parse_bytes(spec.kv_pool.redis.memory)
    password = password_env(spec)
    args = server_args(
        pool_config(spec.kv_pool.redis),
        port=REDIS_PORT,
        data_dir=REDIS_DATA_DIR,
        # Protected mode stays on: with a password it refuses nothing an authenticated client sends,
        # and without one (only when a spec could name none) it refuses every non-loopback client.
        protected_mode=True,
    )
    # The readiness probe's redis-cli reads the password from REDISCLI_AUTH.
    env = [
        *password,
        *password_env(spec, "REDISCLI_AUTH"),
        {"name": "REDIS_DATA_DIR", "value": REDIS_DATA_DIR},
    ]
    volumes = scratch_volumes({"data": REDIS_DATA_DIR, "tmp": TMP_MOUNT})[1]
    return {
        "name": "redis",
        "image": images.redis,
        "command": authenticated_command() if password else ["redis-server"],
        "args": args,
        "env": env,
        "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
        "resources": {
            "requests": {"cpu": "1", "memory": _mebibytes(maxmemory)},
            "limits": {"memory": _mebibytes(maxmemory * REDIS_LIMIT_FACTOR)},
        },
        "readinessProbe": {
            "exec": {"command": ["sh", "-c", 'test "$(redis-cli ping)" = PONG']},
            "periodSeconds": 5,
        },
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10},
        "volumeMounts": volumes,
        "securityContext": container_security_context(),
    }


def build_redis_deployment(spec: InferenceServiceSpec, *, owner: Owner, images: Images) -> dict[str, Any]:
    """Deployment `<name>-kv`: one Redis with the spec's maxmemory and eviction policy, and the
    password from `kvPool.redis.passwordSecret` when there is one (`tandem.kvpool.redisconf`).

    `Recreate` so that two Redis pods never serve the pool at once; no RDB/AOF persistence; runs as
    the image's `redis` user with a read-only root filesystem and emptyDirs for its dir and /tmp.
    `kvPool.redis.template` is merged onto the pod (container `redis`; `podtemplate.py`).
    """
    meta = object_meta(owner, name=child_name(owner, KV_SUFFIX), role=Role.KV_POOL)
    pod_spec = {
        "containers": [_redis_container(spec, images)],
        "volumes": scratch_volumes({"data": REDIS_DATA_DIR, "tmp": TMP_MOUNT})[0],
        "securityContext": pod_security_context(run_as_user=REDIS_UID),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(owner, Role.KV_POOL)},
            "template": apply_templates(
                {"metadata": {"labels": meta["labels"]}, "spec": pod_spec}, [spec.kv_pool.redis.template]
            ),
        },
    }
