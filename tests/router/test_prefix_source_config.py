"""Which prefix source a gateway runs with and where it looks for each engine's KV events
(`tandem.router.config.resolve`). Pure: a config and settings in, the effective values out."""

from __future__ import annotations

import json
from pathlib import Path

from tests.router.harness import router_config

from tandem.core.kvevents import cluster_addresses
from tandem.router.config import resolve
from tandem.router.settings import RouterSettings

ENGINE = "http://10.0.0.7:8000"


def test_the_spec_decides_unless_the_flag_says_otherwise() -> None:
    precise = router_config(decode=[ENGINE], spec={"router": {"prefixSource": "precise"}})
    assert resolve(precise, RouterSettings()).prefix_source == "precise"
    assert resolve(router_config(decode=[ENGINE]), RouterSettings()).prefix_source == "approximate"
    flagged = RouterSettings.model_validate({"scheduling": {"prefix_source": "approximate"}})
    assert resolve(precise, flagged).prefix_source == "approximate"


def test_the_router_config_says_where_engines_publish_else_the_port_flags_do() -> None:
    plain = router_config(decode=[ENGINE])
    assert resolve(plain, RouterSettings()).kv_events.for_engine(ENGINE) == ("tcp://10.0.0.7:5557", None)
    ports = RouterSettings.model_validate({"scheduling": {"kv_events": {"port": 6000, "replay_port": 6001}}})
    assert resolve(plain, ports).kv_events.for_engine(ENGINE) == (
        "tcp://10.0.0.7:6000",
        "tcp://10.0.0.7:6001",
    )
    told = plain.model_copy(update={"kv_events": cluster_addresses()})
    assert resolve(told, ports).kv_events.for_engine(ENGINE) == ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")


def test_the_pool_is_looked_up_only_where_the_gateway_computes_the_engines_chunk_keys(tmp_path: Path) -> None:
    pooled = {"kv_pool_url": "redis://127.0.0.1:6379"}
    sim = router_config(decode=[ENGINE]).model_copy(update=pooled)
    assert resolve(sim, RouterSettings()).kv_pool is not None
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    vllm = {"engine": {"kind": "vllm"}, "kvPool": {"connector": "tandem"}}
    blind = router_config(decode=[ENGINE], spec=vllm).model_copy(update=pooled)
    assert resolve(blind, RouterSettings()).kv_pool is None  # no tokenizer files: not the model's tokens
    told = blind.model_copy(update={"tokenizer_path": str(tmp_path)})
    access = resolve(told, RouterSettings()).kv_pool
    assert access is not None and access.keys.dtype == "half"  # the keys' dtype, from the model's config.json
    lmcache = router_config(decode=[ENGINE], spec={**vllm, "kvPool": {"connector": "lmcache"}})
    lmcache = lmcache.model_copy(update={**pooled, "tokenizer_path": str(tmp_path)})
    assert resolve(lmcache, RouterSettings()).kv_pool is None  # no engineKvKeys: LMCache keys unknown
