"""Conditional disaggregation and the KV-pool barrier, with real engines writing a real pool.

Real: redis-server on 127.0.0.1 (the `redis_server` fixture), simulated engines (`tandem.sim`, the
tiny profile at time scale 1000: a producer for prefill, a consumer for decode, both in LMCache's
layout), the router, the official `openai` client. Faked: in the barrier-timeout story, the prefill
engine is a `FakeEngine`, which answers but writes nothing to the pool; in the outage stories the
pool's URL is a loopback port nothing listens on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from tests.router.harness import MODEL_NAME, Launcher, metric
from tests.router.pd_pool import AUTO_512, PROMPT, complete, engine_counter, fake_pair, sim, sim_pair
from tests.router.servers import closed_port_url
from tests.servers import RedisServer

from tandem.kvpool.keys import PoolKeys, chunk_hashes, chunk_key
from tandem.router.identity.cachescope import CacheScopes
from tandem.router.settings import DisaggregationSettings, RouterSettings


async def test_after_a_prefill_the_barrier_sees_the_chunks_and_decode_loads_them(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await sim_pair(launcher, redis_server.url)
    settings = RouterSettings.model_validate({"access": {"cache_key": "k" * 32}})
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url, settings=settings
    )
    response = await complete(router, PROMPT)
    assert response.headers["x-tandem-prefill-endpoint"] == prefill.removeprefix("http://")
    assert "x-tandem-pd-fallback" not in response.headers
    assert await metric(router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") == 1
    # The decode engine found both chunks the prefill engine wrote under the router's key names.
    assert await engine_counter(decode, "vllm:external_prefix_cache_hits_total") == 512
    # Under the tenant's scope (its cache salt), not the shared one.
    salt = CacheScopes(key=b"k" * 32).salt("default")
    keys = PoolKeys(model=MODEL_NAME, chunk_size=256).chunk_keys(PROMPT, scope=salt)
    shared = [chunk_key(model=MODEL_NAME, chunk_hash=h) + "metadata" for h in chunk_hashes(PROMPT, 256)]
    with redis_server.client() as client:
        assert (client.exists(*keys), client.exists(*shared)) == (2, 0)


async def test_auto_mode_prefills_what_is_not_cached_and_decodes_what_the_pool_holds(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await sim_pair(launcher, redis_server.url)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="auto", spec=AUTO_512, kv_pool_url=redis_server.url
    )
    first = await complete(router, PROMPT)  # nothing cached: 600 uncached ≥ 512
    assert "x-tandem-prefill-endpoint" in first.headers
    second = await complete(router, PROMPT)  # 512 in the pool: 88 uncached < 512
    assert "x-tandem-prefill-endpoint" not in second.headers
    assert "x-tandem-pd-fallback" not in second.headers
    decisions = "tandem_router_pd_decisions_total"
    assert await metric(router, decisions, decision="disaggregate", reason="many_uncached") == 1
    assert await metric(router, decisions, decision="decode_only", reason="few_uncached") == 1
    short = await complete(router, PROMPT[:100])  # shorter than a chunk, and than 512
    assert "x-tandem-prefill-endpoint" not in short.headers
    assert await metric(router, decisions, decision="decode_only", reason="few_uncached") == 2


async def test_a_disaggregated_request_hashes_its_chunk_keys_once_for_the_look_up_and_the_barrier(
    launcher: Launcher, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[int] = []
    real = PoolKeys.chunk_keys

    def counting(
        self: PoolKeys, token_ids: Sequence[int], suffix: str = "metadata", *, scope: str | None = None
    ) -> list[str]:
        hashed.append(len(token_ids))
        return real(self, token_ids, suffix, scope=scope)

    monkeypatch.setattr(PoolKeys, "chunk_keys", counting)
    prefill, decode = await sim_pair(launcher, redis_server.url)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="auto", spec=AUTO_512, kv_pool_url=redis_server.url
    )
    first = await complete(router, PROMPT)  # looked up (nothing there), prefilled, waited for
    assert "x-tandem-prefill-endpoint" in first.headers
    assert await metric(router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") == 1
    assert hashed == [len(PROMPT)]


async def test_chunks_that_never_arrive_time_the_barrier_out_and_decode_goes_alone(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill = await launcher.engine("p0")  # answers, but writes nothing to the pool
    decode = await sim(launcher, "consumer", redis_server.url)
    settings = RouterSettings(disaggregation=DisaggregationSettings(kv_barrier_timeout_seconds=0.2))
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", settings=settings, kv_pool_url=redis_server.url
    )
    response = await complete(router, PROMPT)
    assert response.headers["x-tandem-pd-fallback"] == "barrier_timeout"
    assert "x-tandem-prefill-endpoint" not in response.headers
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="barrier_timeout") == 1
    assert await metric(router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="timeout") == 1


async def test_a_prompt_shorter_than_a_chunk_has_nothing_to_wait_for(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    prefill, decode = await fake_pair(launcher)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url
    )
    response = await complete(router, PROMPT[:200])
    assert response.headers["x-tandem-prefill-endpoint"] == prefill.url.removeprefix("http://")
    assert await metric(router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") == 1


async def test_a_pool_that_is_down_sends_requests_decode_only_without_failing_them(
    launcher: Launcher,
) -> None:
    prefill, decode = await fake_pair(launcher)
    down = closed_port_url().replace("http://", "redis://")
    auto = await launcher.router(
        decode=[decode], prefill=[prefill], mode="auto", spec=AUTO_512, kv_pool_url=down
    )
    await complete(auto, PROMPT)
    assert prefill.received == []
    assert (
        await metric(
            auto, "tandem_router_pd_decisions_total", decision="decode_only", reason="pool_unavailable"
        )
        == 1
    )
    always = await launcher.router(decode=[decode], prefill=[prefill], mode="always", kv_pool_url=down)
    response = await complete(always, PROMPT)
    assert response.headers["x-tandem-pd-fallback"] == "pool_unavailable"
    assert await metric(always, "tandem_router_pd_fallbacks_total", reason="pool_unavailable") == 1


async def test_disaggregated_requests_teach_the_handover_its_lead(
    launcher: Launcher, redis_server: RedisServer
) -> None:
    """Each disaggregated request tells the handover how long it took from its grant to its decode
    engine and there to its first byte (`tandem.router.pipeline.lead`): nothing before 8 requests,
    then a lead above 0, which `tandem_router_handover_lead_seconds` shows."""
    prefill, decode = await sim_pair(launcher, redis_server.url)
    settings = RouterSettings.model_validate({"admission": {"handover_lead": "on"}})
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url, settings=settings
    )
    lead = "tandem_router_handover_lead_seconds"
    for n in range(8):
        assert await metric(router, lead) == 0.0, n
        response = await complete(router, [2000 + n, *PROMPT[1:]])
        assert "x-tandem-prefill-endpoint" in response.headers
    # The relay learns after the answer's last byte, which the client may read first.
    for _ in range(200):
        if await metric(router, lead) > 0.0:
            break
        await asyncio.sleep(0.01)
    assert await metric(router, lead) > 0.0


async def test_the_lead_is_off_unless_asked_for(launcher: Launcher, redis_server: RedisServer) -> None:
    prefill, decode = await sim_pair(launcher, redis_server.url)
    router = await launcher.router(
        decode=[decode], prefill=[prefill], mode="always", kv_pool_url=redis_server.url
    )
    await complete(router, PROMPT)
    text = (await router.http.get("/metrics")).text
    assert "tandem_router_handover_lead_seconds" not in text
    assert "tandem_router_pd_kv_barrier_wait_seconds" in text
