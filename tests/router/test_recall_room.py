"""A disaggregated request that pre-empted a stream makes room on its decode engine
(`Recalls.make_room`, `tandem.router.upstream.recall`).

Real: redis-server on 127.0.0.1, a simulated prefill engine and a simulated decode engine with
`--max-num-seqs 2` on that pool (`tandem.sim`, tiny profile at 3× speed), the gateway in P/D mode
`always`, HTTP clients. The gateway is told the engine's 2 slots and a lookahead of 1.0, so it keeps
2 heavy requests waiting in the decode engine's first-come-first-served queue (the state the
handover's lead leaves a disaggregated engine in, made deterministic). A light tenant's request then
pre-empts a heavy stream and is sent to the decode engine, either prefilled elsewhere
(`minUncachedTokens` 0) or, its prompt short, decode-only in the stopped stream's place (the swap,
`--preemption-swap on`, `tandem.router.pd.disagg`): with recall on the heavy requests still waiting
there are recalled to the gateway's queue, so at most the one that took the stopped stream's slot
starts before the light request; with recall off they all stay ahead of it. Every heavy answer still
arrives whole. Nothing is faked.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tests.router.harness import MODEL, MODEL_NAME, router_config
from tests.router.pd_pool import streamed
from tests.router.servers import serve
from tests.servers import RedisServer

from tandem.router.app import create_app as router_app
from tandem.router.settings import RouterSettings
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import KVRole, SimSettings

TIME_SCALE = 3.0
HEAVY = 4  # the gateway's limit: 2 slots + a lookahead of 2
HEAVY_TOKENS = 48
PROMPT = "the quick brown fox jumps over the lazy dog " * 40  # a text prompt: its stream is continuable


def _sim(role: KVRole, pool: str, *, max_num_seqs: int) -> SimSettings:
    return SimSettings(
        profile="tiny-cpu",
        model=MODEL_NAME,
        served_model_name=MODEL,
        time_scale=TIME_SCALE,
        kv_role=role,
        kv_pool=pool,
        max_num_seqs=max_num_seqs,
        seed=1,
    )


def _counter(page: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


@pytest.mark.parametrize(
    ("recall", "light_way"), [("on", "prefilled"), ("off", "prefilled"), ("on", "swapped")]
)
async def test_heavy_requests_waiting_in_the_decode_engine_make_room_for_a_pre_empting_one(
    recall: str, light_way: str, redis_server: RedisServer
) -> None:
    settings = RouterSettings.model_validate(
        {
            "collector": {"enabled": False},  # C stays the declared 2: the story is the recall, not C
            "admission": {
                "engine_capacity": 2,
                "lookahead": 1.0,
                "recall": recall,
                "preemption_swap": "on" if light_way == "swapped" else "off",
            },
        }
    )
    async with (
        serve(sim_app(_sim("producer", redis_server.url, max_num_seqs=8))) as prefill,
        serve(sim_app(_sim("consumer", redis_server.url, max_num_seqs=2))) as decode,
    ):
        config = router_config(
            decode=[decode.url],
            prefill=[prefill.url],
            mode="always",
            kv_pool_url=redis_server.url,
            spec={
                "router": {"slo": {"ttftSeconds": 60}},
                # 0: every prompt has enough uncached tokens to be prefilled elsewhere, pre-empting or not
                "disaggregation": {"minUncachedTokens": 0 if light_way == "prefilled" else 4096},
            },
        )
        async with (
            serve(router_app(config, settings=settings)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=60, trust_env=False) as client,
        ):
            started: list[str] = []

            async def send(tenant: str, n: int, max_tokens: int) -> tuple[int, int]:
                """(heavy answers started before this one's first byte, tokens received)."""
                body = streamed(f"{n} {PROMPT}", max_tokens)
                before, usage = -1, ""
                headers = {"x-tenant-id": tenant}
                async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                    assert response.status_code == 200, (await response.aread()).decode()
                    async for line in response.aiter_lines():
                        if before < 0 and line.startswith("data: {"):
                            before = started.count("heavy")
                            started.append(tenant)
                        if '"usage":{' in line.replace(" ", ""):
                            usage = line.replace(" ", "")
                return before, int(usage.split('"completion_tokens":')[1].split(",")[0])

            heavy = [asyncio.create_task(send("heavy", n, HEAVY_TOKENS)) for n in range(HEAVY)]
            while started.count("heavy") < 2:  # noqa: ASYNC110 - the two slots answer; two wait
                await asyncio.sleep(0.005)
            waiting_then = started.count("heavy")
            overtaken, light_tokens = await send("light", 100, 8)
            answers = await asyncio.gather(*heavy)
            page = (await client.get("/metrics")).text
    assert waiting_then == 2
    assert light_tokens == 8 and [tokens for _, tokens in answers] == [HEAVY_TOKENS] * HEAVY
    assert _counter(page, "tandem_router_preemptions_total") >= 1
    swapped = _counter(page, 'tandem_router_pd_decisions_total{decision="decode_only",reason="preempting"}')
    assert swapped == (1 if light_way == "swapped" else 0)
    recalled = _counter(page, "tandem_router_recalled_total")
    if recall == "on":
        assert recalled >= 1
        # The one that took the stopped stream's blocks may start; the other waits behind light.
        assert overtaken - waiting_then <= 1, f"{overtaken - waiting_then} heavy answers started first"
    else:
        assert recalled == 0
        assert overtaken - waiting_then == 2, f"{overtaken - waiting_then} heavy answers started first"
