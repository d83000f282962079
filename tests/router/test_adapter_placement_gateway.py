"""Adapter placement through a real gateway: an adapter's repeated requests stay on its home engine
(the first of its rendezvous order), and a burst of it spreads over the engines within the load
bound.

Real: three `tandem sim` engines with `--enable-lora` and the filesystem resolver over adapter
directories written to tmp_path, at time scale 1 (so a burst's requests are in flight together), the
router (`create_app`, policy `tandem`), uvicorn servers on 127.0.0.1, httpx; each engine's
/metrics as Prometheus text. Nothing is faked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.router.servers import serve
from tests.router.test_gateway_lora import RESOLVER, complete, lora_config, write_adapter
from tests.router.test_routing_sims import samples

from tandem.router.app import create_app as router_app
from tandem.router.scheduling.adapterplace import COPY_SLACK, MIN_BOUND, load_bound
from tandem.router.scheduling.scorers import home_ranks
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

ENGINES = 3
BURST = 12
#: Between the burst's requests (a 50 req/s burst; each request runs about 0.6 s, so all overlap).
GAP_S = 0.02


def engine(adapters: Path, *, seed: int) -> Any:
    settings = SimSettings.model_validate(
        {
            "profile": "tiny-cpu",
            "served_model_name": "qwen",
            "time_scale": 1,
            "num_gpu_blocks": 400,
            "seed": seed,
            "enable_lora": True,
            "max_loras": 2,
            "lora_modules": [f"sql={adapters / 'sql'}"],
        }
    )
    return sim_app(settings, environ=RESOLVER | {"VLLM_LORA_RESOLVER_CACHE_DIR": str(adapters)})


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[str]]]:
    write_adapter(tmp_path, "sql")
    write_adapter(tmp_path, "chat")
    async with AsyncExitStack() as stack:
        urls = [
            (await stack.enter_async_context(serve(engine(tmp_path, seed=i)))).url for i in range(ENGINES)
        ]
        router = await stack.enter_async_context(serve(router_app(lora_config(urls))))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
        )
        yield client, urls


async def served(client: httpx.AsyncClient, urls: list[str]) -> dict[str, float]:
    """Requests each engine has finished (`vllm:request_success_total`, summed over reasons)."""
    out = {}
    for url in urls:
        metrics = samples((await client.get(f"{url}/metrics")).text)
        out[url] = sum(metrics.get("vllm:request_success_total", {}).values())
    return out


async def later(delay_s: float, client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    await asyncio.sleep(delay_s)
    return await client.post("/v1/completions", json=body)


async def send_burst(client: httpx.AsyncClient, urls: list[str]) -> dict[str, float]:
    """BURST requests for `chat`, GAP_S apart, all answered; how many each engine finished."""
    before = await served(client, urls)
    body = complete("chat", "a long answer") | {"max_tokens": 64}
    replies = await asyncio.gather(*(later(i * GAP_S, client, body) for i in range(BURST)))
    assert [r.status_code for r in replies] == [200] * BURST
    after = await served(client, urls)
    return {url: after[url] - before[url] for url in urls}


async def test_an_adapters_requests_stay_home_and_a_burst_of_it_spreads_within_the_bound(
    gateway: tuple[httpx.AsyncClient, list[str]],
) -> None:
    client, urls = gateway
    ranks = home_ranks("chat", urls)
    home = min(urls, key=ranks.__getitem__)

    # Every engine answers once first: until then slow start gives a new engine one prompt at a time.
    warming = [complete("qwen", f"warm-up {i}") | {"max_tokens": 64} for i in range(ENGINES)]  # overlap
    warm = await asyncio.gather(*(client.post("/v1/completions", json=body) for body in warming))
    assert [r.status_code for r in warm] == [200] * ENGINES
    assert set((await served(client, urls)).values()) == {1.0}

    for i in range(6):  # one at a time: the home is never at the bound
        reply = await client.post("/v1/completions", json=complete("chat", f"question {i}"))
        assert reply.status_code == 200
    assert await served(client, urls) == {url: 7.0 if url == home else 1.0 for url in urls}

    burst = await send_burst(client, urls)
    assert sum(burst.values()) == BURST
    assert sum(1 for n in burst.values() if n > 0) >= 2, burst  # spread beyond the home
    # No engine took more than the bound with the whole burst in flight: ceil(1.25 · 12 / 3) = 5.
    assert max(burst.values()) <= load_bound([(BURST - 1) / ENGINES] * ENGINES), burst
    assert burst[home] >= 2, burst  # the home filled first


@pytest.fixture
async def copying_gateway(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[str], Path]]:
    """The engines of `gateway`, and a gateway told to copy hot adapters from a second directory
    holding the same adapters (`adapterLoadDir`), so that each engine's `/v1/models` says (`root`)
    whether it got `chat` from a copy or from its resolver; yields that directory too."""
    write_adapter(tmp_path, "sql")
    write_adapter(tmp_path, "chat")
    copies = tmp_path / "copies"
    write_adapter(copies, "chat")
    async with AsyncExitStack() as stack:
        urls = [
            (await stack.enter_async_context(serve(engine(tmp_path, seed=i)))).url for i in range(ENGINES)
        ]
        config = lora_config(urls).model_copy(update={"adapter_load_dir": str(copies)})
        router = await stack.enter_async_context(serve(router_app(config)))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=router.url, timeout=30, trust_env=False)
        )
        yield client, urls, copies


def by_label(series: dict[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for labels, value in series.items()}


async def copies_loaded(client: httpx.AsyncClient) -> dict[str, float]:
    metrics = samples((await client.get("/metrics")).text)
    return by_label(metrics.get("tandem_router_adapter_copies_total", {}), "outcome")


async def send_burst_past_a_copy(client: httpx.AsyncClient, urls: list[str]) -> dict[str, float]:
    """The burst of `send_burst` (longer requests, so that all of it is in flight together), in two
    parts: its first `COPY_SLACK + MIN_BOUND` requests (the home takes `MIN_BOUND`, the next asks for
    a copy and stays home, as does the one after it: the slack), then, once the gateway says the copy
    is loaded, the rest. Without the wait, a request that finds the home at bound + slack while the
    copy still loads reads the adapter itself on another engine, by design (`adapterplace`; unit
    test `test_past_the_slack_or_without_a_copy_a_request_loads_the_adapter_itself`), and how often that
    happens is the host's timing, not the gateway's logic. How many each engine finished."""
    before = await served(client, urls)
    body = complete("chat", "a long answer") | {"max_tokens": 128}
    first = MIN_BOUND + COPY_SLACK
    head = [asyncio.ensure_future(later(i * GAP_S, client, body)) for i in range(first)]
    for _ in range(200):  # the copy of a tiny adapter loads within a few engine steps
        if (await copies_loaded(client)).get("loaded", 0) >= 1:
            break
        await asyncio.sleep(0.01)
    tail = [later(i * GAP_S, client, body) for i in range(BURST - first)]
    replies = await asyncio.gather(*head, *tail)
    assert [r.status_code for r in replies] == [200] * BURST
    after = await served(client, urls)
    return {url: after[url] - before[url] for url in urls}


async def test_a_burst_spreads_by_copies_through_the_runtime_api_not_by_its_requests_loads(
    copying_gateway: tuple[httpx.AsyncClient, list[str], Path],
) -> None:
    """The burst of the test above with copies on: it still spreads within the bound (plus the
    slack a copy in flight allows), and every engine it spread to beyond the home got `chat` from the
    gateway's `POST /v1/load_lora_adapter` (its `/v1/models` entry's root is the copies' directory)
    before any of its requests arrived there; no copy failed; each engine read `chat` from disk once."""
    client, urls, copies = copying_gateway
    ranks = home_ranks("chat", urls)
    home = min(urls, key=ranks.__getitem__)
    warming = [complete("qwen", f"warm-up {i}") | {"max_tokens": 64} for i in range(ENGINES)]
    warm = await asyncio.gather(*(client.post("/v1/completions", json=body) for body in warming))
    assert [r.status_code for r in warm] == [200] * ENGINES
    reply = await client.post("/v1/completions", json=complete("chat", "question"))
    assert reply.status_code == 200

    burst = await send_burst_past_a_copy(client, urls)
    spread = [url for url in urls if url != home and burst[url] > 0]
    assert spread, burst
    assert max(burst.values()) <= load_bound([(BURST - 1) / ENGINES] * ENGINES) + COPY_SLACK, burst

    outcomes = await copies_loaded(client)
    assert outcomes.get("loaded", 0) >= len(spread) and outcomes.get("failed", 0) == 0, outcomes
    for url in urls:
        models = (await client.get(f"{url}/v1/models")).json()["data"]
        root = next(m["root"] for m in models if m["id"] == "chat") if url in spread or url == home else None
        if url in spread:
            assert root == str(copies / "chat"), (url, root)  # copied, not resolved by a request
        elif url == home:
            assert root != str(copies / "chat")  # the first request resolved it there
        engine_metrics = samples((await client.get(f"{url}/metrics")).text)
        reads = by_label(engine_metrics.get("tandem_sim_lora_loads_total", {}), "source")
        assert reads.get("disk", 0.0) <= 1.0, (url, reads)
