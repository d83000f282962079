"""The engine-side KV pool configuration: vLLM's --kv-transfer-config and LMCache's environment."""

from __future__ import annotations

import json

import pytest

from tandem.kvpool.engine_config import PASSWORD_ENV, kv_transfer_config, lmcache_env, to_json


def test_tandem_producer_config_names_the_module_and_carries_pool_settings() -> None:
    config = kv_transfer_config(
        connector="tandem", role="producer", pool_url="redis://127.0.0.1:6379", model="tiny", chunk_size=256
    )
    assert config == {
        "kv_connector": "TandemConnector",
        "kv_connector_module_path": "tandem.kvpool.vllm_connector",
        "kv_role": "kv_producer",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "url": "redis://127.0.0.1:6379",
            "model": "tiny",
            "chunk_size": 256,
            "timeout_s": 2.0,
            "password_env": PASSWORD_ENV,
        },
    }


def test_a_kv_layout_goes_into_tandems_extra_config_and_not_into_lmcaches() -> None:
    common: dict[str, object] = {
        "role": "consumer",
        "pool_url": "redis://h:1",
        "model": "m",
        "chunk_size": 256,
    }
    tandem = kv_transfer_config(connector="tandem", kv_layout="3f1c0a9e5b7d2c41", **common)  # type: ignore[arg-type]
    extra = tandem["kv_connector_extra_config"]
    assert isinstance(extra, dict) and extra["kv_layout"] == "3f1c0a9e5b7d2c41"
    lmcache = kv_transfer_config(connector="lmcache", kv_layout="3f1c0a9e5b7d2c41", **common)  # type: ignore[arg-type]
    assert "3f1c0a9e5b7d2c41" not in to_json(lmcache)


def test_tandem_consumer_role_and_timeout() -> None:
    config = kv_transfer_config(
        connector="tandem", role="consumer", pool_url="redis://h:1", model="m", chunk_size=512, timeout_s=0.5
    )
    assert config["kv_role"] == "kv_consumer"
    extra = config["kv_connector_extra_config"]
    assert isinstance(extra, dict)
    assert extra["timeout_s"] == 0.5
    assert extra["chunk_size"] == 512


def test_no_password_ever_appears_in_the_config() -> None:
    config = kv_transfer_config(
        connector="tandem", role="consumer", pool_url="redis://127.0.0.1:1", model="m", chunk_size=256
    )
    assert "password" not in to_json(config).replace("password_env", "")


def test_lmcache_config_uses_the_builtin_connector_with_recompute() -> None:
    config = kv_transfer_config(
        connector="lmcache", role="consumer", pool_url="redis://h:1", model="m", chunk_size=256
    )
    assert config == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_consumer",
        "kv_load_failure_policy": "recompute",
    }


def test_lmcache_env_points_at_the_pool_with_raw_chunks() -> None:
    env = lmcache_env(pool_url="redis://127.0.0.1:7000", chunk_size=256)
    assert env["LMCACHE_REMOTE_URL"] == "redis://127.0.0.1:7000"
    assert env["LMCACHE_CHUNK_SIZE"] == "256"
    assert env["LMCACHE_REMOTE_SERDE"] == "naive"
    assert env["LMCACHE_LOCAL_CPU"] == "False"
    assert env["LMCACHE_PRE_CACHING_HASH_ALGORITHM"] == "sha256_cbor"  # keys without Python's hash


def test_to_json_is_compact_and_round_trips() -> None:
    config = kv_transfer_config(
        connector="tandem", role="producer", pool_url="redis://h:1", model="m", chunk_size=256
    )
    text = to_json(config)
    assert " " not in text
    assert json.loads(text) == config


@pytest.mark.parametrize("chunk_size", [0, -256])
def test_a_non_positive_chunk_size_is_refused(chunk_size: int) -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        kv_transfer_config(
            connector="tandem", role="producer", pool_url="redis://h:1", model="m", chunk_size=chunk_size
        )
    with pytest.raises(ValueError, match="chunk_size"):
        lmcache_env(pool_url="redis://h:1", chunk_size=chunk_size)
