"""How a vLLM engine is told to use the KV pool: its `--kv-transfer-config` and, for LMCache, its environment.

Two connectors write the same Redis layout (`tandem.core.kvkeys`):

- `tandem`: `tandem.kvpool.vllm_connector.TandemConnector`, configured entirely through
  `kv_connector_extra_config` (`url`, `model`, `chunk_size`, `timeout_s`, `password_env`). The Redis
  password, when the pool has one, is read from the environment variable named by `password_env`
  (`TANDEM_KVPOOL_PASSWORD`), never from the JSON, which vLLM logs.
- `lmcache`: vLLM's built-in `LMCacheConnectorV1`, producer on prefill and consumer on decode (the
  layout of production-stack's disaggregated-prefill examples), with LMCache's own settings in
  `LMCACHE_*` environment variables (`lmcache_env`).

Both set `kv_load_failure_policy: recompute`: vLLM's default (`fail`) turns a pool miss during a load
into an HTTP 500; with `recompute` the engine computes the lost tokens instead.

Pure functions: no vLLM import, so the operator, the CLI and tests can build engine arguments.
"""

from __future__ import annotations

import json
from typing import Literal

ConnectorKind = Literal["tandem", "lmcache"]
KVRole = Literal["producer", "consumer"]

TANDEM_CONNECTOR_CLASS = "TandemConnector"
TANDEM_CONNECTOR_MODULE = "tandem.kvpool.vllm_connector"
LMCACHE_CONNECTOR_CLASS = "LMCacheConnectorV1"
#: The environment variable the tandem connector reads the Redis password from.
PASSWORD_ENV = "TANDEM_KVPOOL_PASSWORD"
#: The environment variable holding the pool secret (`tandem.kvpool.client.pool_key_from_env`): keyed
#: chunk hashes and a tag on every chunk Tandem's connector writes. Engines and the gateway hold it.
POOL_KEY_ENV = "TANDEM_KV_POOL_KEY"
FAILURE_POLICY = "recompute"
#: LMCache's chunk hash for the engines Tandem configures: vLLM's `sha256_cbor` (`tandem.core.kvkeys.
#: LMCacheCborHash`), which, unlike LMCache's default `builtin`, does not depend on Python's hash.
LMCACHE_HASH_ALGORITHM = "sha256_cbor"
LMCACHE_HASH_ENV = "LMCACHE_PRE_CACHING_HASH_ALGORITHM"


def kv_transfer_config(
    *,
    connector: ConnectorKind,
    role: KVRole,
    pool_url: str,
    model: str,
    chunk_size: int,
    timeout_s: float = 2.0,
    kv_layout: str | None = None,
) -> dict[str, object]:
    """vLLM's `--kv-transfer-config` dict for one engine of a P/D pair.

    `model` is the model part of the pool's keys (`spec.model.name`); `chunk_size` tokens per chunk
    (a multiple of the engine's block size); `timeout_s` bounds every Redis command of the connector;
    `kv_layout` (Tandem's connector): the engine's KV-layout generation, put in its keys' scope.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    kv_role = f"kv_{role}"
    if connector == "lmcache":
        return {
            "kv_connector": LMCACHE_CONNECTOR_CLASS,
            "kv_role": kv_role,
            "kv_load_failure_policy": FAILURE_POLICY,
        }
    return {
        "kv_connector": TANDEM_CONNECTOR_CLASS,
        "kv_connector_module_path": TANDEM_CONNECTOR_MODULE,
        "kv_role": kv_role,
        "kv_load_failure_policy": FAILURE_POLICY,
        "kv_connector_extra_config": {
            "url": pool_url,
            "model": model,
            "chunk_size": chunk_size,
            "timeout_s": timeout_s,
            "password_env": PASSWORD_ENV,
            **({"kv_layout": kv_layout} if kv_layout else {}),
        },
    }


def to_json(config: dict[str, object]) -> str:
    """A config dict as the compact JSON string vLLM's `--kv-transfer-config` flag takes."""
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def lmcache_env(*, pool_url: str, chunk_size: int) -> dict[str, str]:
    """LMCache's settings for the shared Redis pool, as `LMCACHE_<KEY>` environment variables.

    Chunks of `chunk_size` tokens go to `pool_url` as raw tensor bytes (`naive` serde, the layout
    `tandem.core.kvkeys` describes); no local CPU tier (the pool is the hand-off between engines), no
    partial trailing chunks (LMCache's default, which the key scheme assumes), and `sha256_cbor`
    chunk hashes (`LMCACHE_HASH_ALGORITHM`: keys any process can compute from the engines'
    PYTHONHASHSEED string, unset included).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return {
        "LMCACHE_CHUNK_SIZE": str(chunk_size),
        "LMCACHE_REMOTE_URL": pool_url,
        "LMCACHE_REMOTE_SERDE": "naive",
        "LMCACHE_LOCAL_CPU": "False",
        "LMCACHE_SAVE_UNFULL_CHUNK": "False",
        LMCACHE_HASH_ENV: LMCACHE_HASH_ALGORITHM,
    }
