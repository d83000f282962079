"""The KV pool: the LMCache configuration the engines read, and the managed Redis behind it.

With `kvPool.redis.url` set, the pool is that external Redis and no Redis is deployed; otherwise the
pool is a single Redis pod (no persistence: it is a cache) behind the Service `<name>-kv`, with
`maxmemory` and `maxmemory-policy` from the spec. Pure builders.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal
from typing import Any

from tandem.core.quantity import parse_bytes
from tandem.core.spec import InferenceServiceSpec
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

LMCACHE_SUFFIX = "lmcache"
KV_SUFFIX = "kv"
#: File name of the LMCache configuration inside its ConfigMap (and its mount directory).
LMCACHE_FILE = "lmcache.yaml"
#: Headroom of the Redis container's memory limit over `maxmemory`: Redis needs room for client
#: buffers, replication backlog and fragmentation (the Redis docs suggest planning ~25% extra).
REDIS_LIMIT_FACTOR = Decimal("1.25")


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


def lmcache_config(spec: InferenceServiceSpec, owner: Owner) -> dict[str, Any]:
    """LMCache settings shared by both roles: the shared-pool layout (no NIXL P/D mode).

    The prefill engine (kv_producer) stores every `chunk_size`-token chunk of a prompt's KV in the
    pool; the decode engine (kv_consumer) looks the chunks up by key. Keys contain the world size,
    so both pools must use the same tensor-parallel size to share chunks.
    """
    return {
        "chunk_size": spec.kv_pool.chunk_size,
        "local_cpu": True,
        "max_local_cpu_size": 5.0,
        "remote_url": kv_pool_url(spec, owner),
        "remote_serde": "naive",
    }


def build_lmcache_configmap(spec: InferenceServiceSpec, *, owner: Owner) -> dict[str, Any]:
    """ConfigMap `<name>-lmcache` with `lmcache.yaml`, mounted by vLLM engines (LMCACHE_CONFIG_FILE)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, name=child_name(owner, LMCACHE_SUFFIX), role=Role.KV_POOL),
        "data": {LMCACHE_FILE: to_yaml(lmcache_config(spec, owner))},
    }


def build_redis_deployment(spec: InferenceServiceSpec, *, owner: Owner, images: Images) -> dict[str, Any]:
    """Deployment `<name>-kv`: one Redis with the spec's maxmemory and eviction policy.

    `Recreate` so that two Redis pods never serve the pool at once; no RDB/AOF persistence.
    """
    maxmemory = parse_bytes(spec.kv_pool.redis.memory)
    container = {
        "name": "redis",
        "image": images.redis,
        "args": [
            "redis-server",
            "--port",
            str(REDIS_PORT),
            "--maxmemory",
            str(maxmemory),
            "--maxmemory-policy",
            spec.kv_pool.redis.eviction_policy,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
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
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 999,  # the `redis` user of the official image
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    meta = object_meta(owner, name=child_name(owner, KV_SUFFIX), role=Role.KV_POOL)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(owner, Role.KV_POOL)},
            "template": {
                "metadata": {"labels": meta["labels"]},
                "spec": {"containers": [container], "enableServiceLinks": False},
            },
        },
    }
