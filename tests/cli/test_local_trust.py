"""A local `tandem up` stack trusts nobody by default: its Redis refuses clients without the password,
its engines refuse `/v1/*` calls without the key only the gateway holds, every chunk in its pool is
keyed and sealed with the run's pool key, and the stack still serves.

Real: the plan `tandem up` builds for a spec (fresh random credentials), its processes started by the
local runtime's own Supervisor (redis-server, two simulated engines, the gateway) on loopback, and
clients speaking Redis and HTTP to them. Faked: nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest
import redis
from tests.servers import unretried_redis

from tandem.core.specrules import parse_inference_service
from tandem.kvpool.keys import check_chunk, pool_key
from tandem.local.binaries import find_redis_server
from tandem.local.plan import LocalCredentials, LocalPlan, build_plan
from tandem.local.ports import free_ports
from tandem.local.supervisor import Supervisor

CREDENTIALS = LocalCredentials.generate()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlan]:
    binary = find_redis_server()
    if binary is None:
        pytest.fail("redis-server is not installed; run `bash scripts/bootstrap.sh`")
    state_dir = tmp_path_factory.mktemp("trust")
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {
            "model": {"name": "m/7b", "servedName": "m"},
            "engine": {"kind": "sim", "sim": {"timeScale": 100}},
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "disaggregation": {"mode": "always"},
            "kvPool": {"chunkSize": 16},
        },
    }
    ports = free_ports()
    plan = build_plan(
        parse_inference_service(doc),
        ports=ports,
        router_port=next(ports),
        python=sys.executable,
        redis_server=binary,
        state_dir=state_dir,
        credentials=CREDENTIALS,
    )
    plan.router_config_path.write_text(plan.router_config.model_dump_json(by_alias=True, exclude_none=True))
    supervisor = Supervisor(log_dir=state_dir / "logs")
    try:
        for process in plan.processes:
            supervisor.wait_ready(supervisor.start(process), timeout=60)
        yield plan
    finally:
        supervisor.stop_all(grace=5)


def port_of(plan: LocalPlan, name: str) -> int:
    return next(p.port for p in plan.processes if p.name == name)


def test_redis_refuses_a_client_without_the_password(stack: LocalPlan) -> None:
    with unretried_redis(port_of(stack, "redis")) as anonymous:
        with pytest.raises(redis.AuthenticationError):  # NOAUTH
            anonymous.ping()
        with pytest.raises(redis.AuthenticationError):
            anonymous.flushall()
    with (
        unretried_redis(port_of(stack, "redis"), password="guessed") as guesser,
        pytest.raises(redis.AuthenticationError),
    ):
        guesser.ping()


def test_an_engine_called_directly_without_the_key_answers_401_and_its_probes_stay_open(
    stack: LocalPlan,
) -> None:
    engine = f"http://127.0.0.1:{port_of(stack, 'decode-0')}"
    body = {"model": "m", "prompt": "hello", "max_tokens": 2}
    assert httpx.post(f"{engine}/v1/completions", json=body).status_code == 401
    assert httpx.get(f"{engine}/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{engine}/health").status_code == 200
    assert httpx.get(f"{engine}/metrics").status_code == 200


def test_the_gateway_holds_the_key_and_the_engines_reach_the_pool_with_the_password(stack: LocalPlan) -> None:
    prompt = "a prompt long enough to fill a few chunks of the pool " * 8
    body = {"model": "m", "prompt": prompt, "max_tokens": 4}
    answer = httpx.post(f"{stack.endpoint}/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"]
    assert httpx.get(f"{stack.endpoint}/models", timeout=10).json()["data"][0]["id"] == "m"
    # The prefill engine stored the prompt's KV in the pool: it authenticated with the password.
    with redis.Redis(port=port_of(stack, "redis"), password=CREDENTIALS.redis_password) as client:
        assert client.dbsize() > 0


def test_the_engines_key_and_seal_every_chunk_with_the_runs_pool_key(stack: LocalPlan) -> None:
    prompt = "another prompt, long enough to fill chunks of the pool " * 8
    body = {"model": "m", "prompt": prompt, "max_tokens": 2}
    assert httpx.post(f"{stack.endpoint}/completions", json=body, timeout=30).status_code == 200
    assert CREDENTIALS.pool_key is not None
    key = pool_key(CREDENTIALS.pool_key)
    with redis.Redis(port=port_of(stack, "redis"), password=CREDENTIALS.redis_password) as client:
        names = [name.decode() for name in client.scan_iter(match="*metadata")]
        assert names
        for name in names:
            base = name.removesuffix("metadata")
            metadata, kv_bytes = client.get(name), client.get(base + "kv_bytes")
            assert metadata is not None and kv_bytes is not None
            assert check_chunk(key, name=base, metadata=metadata, kv_bytes=kv_bytes) == "ok", base
