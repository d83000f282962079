"""The gateway's self-check of its KV-pool keys, through the router.

Real: redis-server on 127.0.0.1 (the `redis_server` fixture), the router, and in the verified story
simulated engines (`tandem.sim`, a producer for prefill and a consumer for decode) that write the
pool under the keys the gateway computes. Faked: in the mismatch stories the prefill engine is a
`FakeEngine`, which answers but writes nothing to the pool, as engines writing other keys look to
the gateway; in the outage story the pool's URL is a loopback port nothing listens on. Every
assertion counts barriers, fallbacks and Redis commands; none measures time.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tests.core.tokenizer_files import write_qwen2
from tests.router.harness import Launcher, RunningRouter, metric, router_config
from tests.router.pd_pool import AUTO_512, PROMPT, complete, fake_pair, sim_pair
from tests.router.servers import closed_port_url
from tests.servers import RedisServer

from tandem.core.routerconfig import EngineKVKeys
from tandem.kvpool.keys import LMCache03Hash, PoolKeys
from tandem.router.pd.keycheck import MISSES_TO_MISMATCH
from tandem.router.settings import DisaggregationSettings, RouterSettings

BARRIER = "tandem_router_pd_kv_barrier_wait_seconds_count"
STATE = "tandem_router_kv_pool_keys_state"
LMCACHE = EngineKVKeys(connector="lmcache", model="/models/qwen", python_hash_seed="0")


def prompt(n: int) -> list[int]:
    """The n-th of distinct 600-token prompts (two full chunks), so no engine has a prefix cached."""
    return [2000 + 700 * n + i for i in range(600)]


#: A short barrier: each miss costs the test 50 ms.
SHORT = RouterSettings(disaggregation=DisaggregationSettings(kv_barrier_timeout_seconds=0.05))


async def state(router: RunningRouter) -> str:
    """The state the router's gauge says it is in."""
    states = [s for s in ("unverified", "verified", "mismatch") if await metric(router, STATE, state=s) == 1]
    assert len(states) == 1, states
    return states[0]


def exists_calls(redis_server: RedisServer) -> int:
    """EXISTS commands Redis has run (the barrier's checks and the decision's look-ups)."""
    with redis_server.client() as client:
        stats = client.info("commandstats")
    return int(stats.get("cmdstat_exists", {}).get("calls", 0))


async def test_prefills_whose_chunks_never_appear_stop_the_barrier_after_four(
    launcher: Launcher, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    prefill, decode = await fake_pair(launcher)  # they answer and write nothing
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", settings=SHORT, kv_pool_url=redis_server.url
    )
    assert await state(router) == "unverified"
    with caplog.at_level(logging.INFO, logger="tandem.router.pd.disagg"):
        for _ in range(MISSES_TO_MISMATCH):
            response = await complete(router, PROMPT)
            assert response.headers["x-tandem-pd-fallback"] == "barrier_timeout"
        assert await state(router) == "mismatch"
        for _ in range(3):  # no more waiting: disaggregated at once, as without a pool
            response = await complete(router, PROMPT)
            assert response.headers["x-tandem-prefill-endpoint"] == prefill.url.removeprefix("http://")
            assert "x-tandem-pd-fallback" not in response.headers
    assert await metric(router, BARRIER, outcome="timeout") == MISSES_TO_MISMATCH
    assert await metric(router, BARRIER) == MISSES_TO_MISMATCH
    assert await metric(router, "tandem_router_pd_fallbacks_total") == MISSES_TO_MISMATCH
    assert len(prefill.received) == MISSES_TO_MISMATCH + 3
    assert "kv_transfer_params" in decode.received[-1].body
    [line] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR
    assert line.getMessage().startswith(f"kv pool keys mismatch: after {MISSES_TO_MISMATCH} prefills")
    assert vars(line)["key_hash"] == "tandem"
    assert vars(line)["example_key"].endswith("metadata")


async def test_in_auto_mode_a_mismatch_stops_the_pool_look_ups_too(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await fake_pair(launcher)
    router = await launcher.router(
        decode=[decode],
        prefill=[prefill],
        mode="auto",
        spec=AUTO_512,
        settings=SHORT,
        kv_pool_url=redis_server.url,
    )
    for n in range(MISSES_TO_MISMATCH):
        await complete(router, prompt(n))  # look-up finds nothing → prefill → barrier times out
    assert await state(router) == "mismatch"
    asked = exists_calls(redis_server)
    for n in range(MISSES_TO_MISMATCH, MISSES_TO_MISMATCH + 3):
        response = await complete(router, prompt(n))
        assert "x-tandem-prefill-endpoint" in response.headers  # 600 uncached by the local prefix
    assert exists_calls(redis_server) == asked  # neither a look-up nor a barrier
    decisions = "tandem_router_pd_decisions_total"
    assert await metric(router, decisions, decision="disaggregate", reason="many_uncached") == 7


async def test_the_first_barrier_that_finds_the_chunks_verifies_the_keys(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await sim_pair(launcher, redis_server.url)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url
    )
    assert await state(router) == "unverified"
    await complete(router, PROMPT)
    assert await metric(router, BARRIER, outcome="ok") == 1
    assert await state(router) == "verified"


async def test_a_prompt_shorter_than_a_chunk_verifies_nothing(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await fake_pair(launcher)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url
    )
    for n in range(MISSES_TO_MISMATCH):  # as many as would make a mismatch if they counted as misses
        await complete(router, prompt(n)[:200])
    assert await metric(router, BARRIER, outcome="ok") == MISSES_TO_MISMATCH
    assert await state(router) == "unverified"


async def test_a_pool_that_is_down_is_no_evidence_of_a_key_mismatch(launcher: Launcher) -> None:
    prefill, decode = await fake_pair(launcher)
    down = closed_port_url().replace("http://", "redis://")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always", kv_pool_url=down)
    for _ in range(MISSES_TO_MISMATCH + 2):
        response = await complete(router, PROMPT)
        assert response.headers["x-tandem-pd-fallback"] == "pool_unavailable"
    assert await state(router) == "unverified"


async def test_without_a_pool_there_is_no_keys_state(launcher: Launcher) -> None:
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode])
    assert "tandem_router_kv_pool_keys_state" not in (await router.http.get("/metrics")).text


async def test_lmcache_engines_writing_lmcache_0_3_keys_are_found_after_one_miss(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default engine image's LMCache (0.3) keys its chunks `vllm@model@1@0@hash`, hashed its own
    way: the gateway starts with LMCache 0.5's keys, finds the prompt under 0.3's after one barrier
    miss, and uses those from then on. Faked: the engines (answer, write nothing); the test writes the
    prompt's chunks as LMCache 0.3 would (tests/core/test_kvkeys_lmcache03.py has its real keys)."""
    prefill, decode = await fake_pair(launcher)
    write_qwen2(tmp_path, vocab=600)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"}))
    config = router_config(
        decode=[decode.url],
        prefill=[prefill.url],
        mode="always",
        spec={"engine": {"kind": "vllm"}, "kvPool": {"connector": "lmcache"}},
        kv_pool_url=redis_server.url,
    ).model_copy(update={"tokenizer_path": str(tmp_path), "engine_kv_keys": LMCACHE})
    legacy = PoolKeys(model=LMCACHE.model, chunk_size=256, scheme=LMCache03Hash(5313149338359954478))
    with redis_server.client() as client:
        for name in legacy.chunk_keys(PROMPT):
            client.set(name.removesuffix("metadata") + "kv_bytes", b"kv")
            client.set(name, b"meta")
    router = await launcher.router_for(config, settings=SHORT)
    with caplog.at_level(logging.INFO, logger="tandem.router.pd.disagg"):
        first = await complete(router, PROMPT)
        assert first.headers["x-tandem-pd-fallback"] == "barrier_timeout"  # 0.5's keys: not there
        assert await state(router) == "verified"
        second = await complete(router, PROMPT)
    assert "x-tandem-pd-fallback" not in second.headers
    assert await metric(router, BARRIER, outcome="ok") == 1
    lines = [r.getMessage() for r in caplog.records]
    assert (
        "kv pool keys: the engines write lmcache-0.3 keys, not lmcache-sha256_cbor: "
        "the gateway computes those now" in lines
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
