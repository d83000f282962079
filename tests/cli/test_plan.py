"""The local runtime's plan: which processes `tandem up` starts for a spec. Pure; ports are a counter."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from tandem.core.specrules import parse_inference_service
from tandem.local.plan import LocalCredentials, LocalPlan, PlanError, build_plan

CREDENTIALS = LocalCredentials(redis_password="pool-pw", engine_api_key="engine-key")


def plan_for(spec: dict[str, Any], *, redis_server: str | None = "/usr/bin/redis-server") -> LocalPlan:
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "m/7b", "servedName": "m"}, "engine": {"kind": "sim"}, **spec},
    }
    return build_plan(
        parse_inference_service(doc),
        ports=itertools.count(9000),
        router_port=8080,
        python="/py",
        redis_server=redis_server,
        state_dir=Path("/state"),
        credentials=CREDENTIALS,
    )


def names(plan: LocalPlan) -> list[str]:
    return [p.name for p in plan.processes]


def test_the_stack_starts_pool_then_engines_then_gateway() -> None:
    plan = plan_for({"prefill": {"replicas": 1}, "decode": {"replicas": 2}})
    assert names(plan) == ["redis", "prefill-0", "decode-0", "decode-1", "router"]
    assert plan.endpoint == "http://127.0.0.1:8080/v1"
    assert plan.model == "m"


def test_prefill_engines_produce_and_decode_engines_consume_the_pool() -> None:
    plan = plan_for({})
    by_name = {p.name: p.argv for p in plan.processes}
    prefill, decode = by_name["prefill-0"], by_name["decode-0"]
    assert prefill[prefill.index("--kv-role") + 1] == "producer"
    assert decode[decode.index("--kv-role") + 1] == "consumer"
    assert prefill[prefill.index("--kv-pool") + 1] == "redis://127.0.0.1:9000"
    assert decode[decode.index("--served-model-name") + 1] == "m"


def test_the_gateway_discovers_exactly_the_planned_engines() -> None:
    plan = plan_for({"prefill": {"replicas": 2}, "decode": {"replicas": 1}})
    discovery = plan.router_config.discovery
    assert discovery.kind == "static"
    assert discovery.prefill == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert discovery.decode == ["http://127.0.0.1:9003"]
    assert plan.router_config.kv_pool_url == "redis://127.0.0.1:9000"


def test_redis_gets_the_spec_memory_and_eviction_policy() -> None:
    plan = plan_for({"kvPool": {"redis": {"memory": "1Gi", "evictionPolicy": "allkeys-lfu"}}})
    argv = plan.processes[0].argv
    assert argv[argv.index("--maxmemory") + 1] == str(2**30)
    assert argv[argv.index("--maxmemory-policy") + 1] == "allkeys-lfu"
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"


def test_an_external_pool_is_used_instead_of_starting_redis() -> None:
    plan = plan_for({"kvPool": {"redis": {"url": "redis://10.0.0.5:6379"}}}, redis_server=None)
    assert "redis" not in names(plan)
    assert plan.router_config.kv_pool_url == "redis://10.0.0.5:6379"


def test_engine_args_and_env_reach_the_engines() -> None:
    engine_spec = {"kind": "sim", "args": ["--max-num-seqs", "8"], "env": [{"name": "A", "value": "1"}]}
    plan = plan_for({"engine": engine_spec})
    engine = plan.processes[1]
    assert engine.argv[-2:] == ("--max-num-seqs", "8")
    assert engine.env == {"A": "1", "VLLM_API_KEY": "engine-key", "TANDEM_KVPOOL_PASSWORD": "pool-pw"}


def test_redis_requires_a_password_and_only_the_environment_carries_the_credentials() -> None:
    plan = plan_for({"prefill": {"replicas": 1}, "decode": {"replicas": 1}})
    redis, prefill, decode, router = plan.processes
    assert redis.argv[:2] == ("sh", "-c") and redis.argv[3] == "/usr/bin/redis-server"
    assert redis.argv[redis.argv.index("--protected-mode") + 1] == "yes"
    assert redis.env["TANDEM_KVPOOL_PASSWORD"] == "pool-pw"
    for engine in (prefill, decode):
        assert (engine.env["VLLM_API_KEY"], engine.env["TANDEM_KVPOOL_PASSWORD"]) == ("engine-key", "pool-pw")
    assert router.env == {"TANDEM_ENGINE_API_KEY": "engine-key", "TANDEM_KVPOOL_PASSWORD": "pool-pw"}
    for process in plan.processes:
        assert not any("pool-pw" in arg or "engine-key" in arg for arg in process.argv), process.name
    assert "pool-pw" not in plan.router_config.model_dump_json()
    external = plan_for({"kvPool": {"redis": {"url": "redis://10.0.0.5:6379"}}}, redis_server=None)
    assert "TANDEM_KVPOOL_PASSWORD" not in external.processes[-1].env  # the caller's own, inherited


@pytest.mark.parametrize(
    ("spec", "redis_server", "message"),
    [
        pytest.param({}, None, "no redis-server", id="no-redis"),
    ],
)
def test_what_cannot_run_locally_is_refused_with_the_reason(
    spec: dict[str, Any], redis_server: str | None, message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        plan_for(spec, redis_server=redis_server)


def test_with_precise_prefix_state_each_simulated_engine_publishes_on_its_own_socket() -> None:
    plan = plan_for({"router": {"prefixSource": "precise"}})
    addresses = plan.router_config.kv_events
    assert addresses is not None and plan.router_config.spec.router.prefix_source == "precise"
    engines = [p for p in plan.processes if p.role in ("prefill", "decode")]
    binds = set()
    for process in engines:
        argv = list(process.argv)
        events = argv[argv.index("--kv-events-endpoint") + 1]
        replay = argv[argv.index("--kv-events-replay-endpoint") + 1]
        assert (events, replay) == addresses.for_engine(process.url)
        binds.add(events)
    assert len(binds) == len(engines)  # one machine, one loopback address: never a shared socket
    scaled = plan_for({"router": {"prefixSource": "precise"}, "decode": {"autoscaling": {"enabled": True}}})
    assert scaled.new_engine is not None  # an engine the autoscaler starts later publishes too
    later = scaled.new_engine("decode", 9, 9999)
    argv = list(later.argv)
    assert argv[argv.index("--kv-events-endpoint") + 1] == "ipc:///state/kv-events/9999.pub"


def test_engines_and_the_gateway_share_the_pool_key_and_only_the_gateway_holds_the_salt_key() -> None:
    keyed = LocalCredentials(redis_password="pool-pw", engine_api_key=None, pool_key="pk", cache_key="sk")
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "m/7b"}, "engine": {"kind": "sim"}},
    }
    plan = build_plan(
        parse_inference_service(doc), ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=Path("/state"), credentials=keyed,
    )  # fmt: skip
    redis, *engines, router = plan.processes
    assert (router.env["TANDEM_KV_POOL_KEY"], router.env["TANDEM_CACHE_KEY"]) == ("pk", "sk")
    for engine in engines:
        assert engine.env["TANDEM_KV_POOL_KEY"] == "pk" and "TANDEM_CACHE_KEY" not in engine.env
    assert "TANDEM_KV_POOL_KEY" not in redis.env and "TANDEM_CACHE_KEY" not in redis.env
    for process in plan.processes:
        assert not any(arg in ("pk", "sk") for arg in process.argv), process.name
    assert (
        '"pk"' not in plan.router_config.model_dump_json()
        and '"sk"' not in plan.router_config.model_dump_json()
    )


def test_a_run_draws_its_own_cache_keys() -> None:
    first, second = LocalCredentials.generate(), LocalCredentials.generate()
    assert first.pool_key and first.cache_key and first.pool_key != first.cache_key
    assert first.pool_key != second.pool_key
    assert "pool_key" not in repr(first) and first.pool_key not in repr(first)
