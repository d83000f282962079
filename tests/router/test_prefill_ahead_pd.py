"""Prefill ahead through a live P/D gateway (`tandem.router.pd.ahead`): a request waiting for its
decode slot is prefilled while it waits, and goes to decode when the slot frees.

Real: redis-server on 127.0.0.1, a simulated prefill engine and a simulated decode engine on that
pool (`tandem.sim`), the gateway in P/D mode `always` with the decode engine's 1 slot declared (the
collector off: C stays 1) and no handover, HTTP clients. A long answer takes the slot; a second
request waits. With `--prefill-ahead` its prefill is done while the first still streams; with 0 it
starts only after the first answer has ended. Both answers arrive whole either way.
"""

from __future__ import annotations

import asyncio
import time

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

PROMPT = "the quick brown fox jumps over the lazy dog " * 20
FIRST_TOKENS = 160


def _sim(role: KVRole, pool: str) -> SimSettings:
    return SimSettings(
        profile="tiny-cpu", model=MODEL_NAME, served_model_name=MODEL, kv_role=role, kv_pool=pool, seed=1
    )


def _prefills(page: str) -> float:
    name = 'tandem_router_pd_prefill_duration_seconds_count{outcome="ok"}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name))


def _counter(page: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name))


@pytest.mark.parametrize("ahead", [1.0, 0.0])
async def test_a_request_waiting_for_its_decode_slot_is_prefilled_as_it_waits(
    ahead: float, redis_server: RedisServer
) -> None:
    settings = RouterSettings.model_validate(
        {
            "collector": {"enabled": False},
            "admission": {"engine_capacity": 1, "handover_tokens": 0, "prefill_ahead": ahead},
        }
    )
    async with (
        serve(sim_app(_sim("producer", redis_server.url))) as prefill,
        serve(sim_app(_sim("consumer", redis_server.url))) as decode,
    ):
        config = router_config(
            decode=[decode.url],
            prefill=[prefill.url],
            mode="always",
            kv_pool_url=redis_server.url,
            spec={"router": {"slo": {"ttftSeconds": 60}}},
        )
        async with (
            serve(router_app(config, settings=settings)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=60, trust_env=False) as client,
        ):

            async def complete(
                n: int, max_tokens: int, halfway: asyncio.Event | None = None
            ) -> tuple[int, float]:
                """(completion tokens, when the answer ended); `halfway` is set at half its tokens."""
                body = streamed(f"{n} {PROMPT}", max_tokens)
                usage, chunks = "", 0
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200, (await response.aread()).decode()
                    async for line in response.aiter_lines():
                        chunks += line.startswith("data: {")
                        if halfway is not None and chunks >= max_tokens // 2:
                            halfway.set()
                        if '"usage":{' in line.replace(" ", ""):
                            usage = line.replace(" ", "")
                return int(usage.split('"completion_tokens":')[1].split(",")[0]), time.monotonic()

            halfway = asyncio.Event()
            first = asyncio.create_task(complete(1, FIRST_TOKENS, halfway))
            await asyncio.sleep(0.05)  # it has the slot
            second = asyncio.create_task(complete(2, 4))
            await asyncio.wait_for(halfway.wait(), 30)
            mid = _prefills((await client.get("/metrics")).text)  # the first holds its slot still
            prefilled_at = None
            while not first.done():
                if prefilled_at is None and _prefills((await client.get("/metrics")).text) >= 2:
                    prefilled_at = time.monotonic()
                await asyncio.sleep(0.01)
            (first_tokens, first_end), (second_tokens, _) = await first, await asyncio.wait_for(second, 30)
            page = (await client.get("/metrics")).text
    assert first_tokens == FIRST_TOKENS and second_tokens == 4
    assert _prefills(page) == 2
    used = _counter(page, 'tandem_router_pd_prefill_ahead_total{outcome="used"}')
    if ahead:
        assert prefilled_at is not None and prefilled_at < first_end, "prefilled while the first streamed"
        assert used == 1
    else:
        assert mid == 1, "no prefill before the slot freed"
        assert used == 0
