"""A rollout under load keeps every request's prefill and decode engines of one KV generation.

The story: a closed loop of streamed greedy completions runs through the gateway with every request
disaggregated (`mode: always`) while both pools roll from generation `g1` to `g2` through the
discovery source, as a Deployment rollout changes the pools' Service endpoints: a new decode engine
appears (before any new prefill engine: its requests go decode-only), a new prefill engine appears,
old decode engines are removed one by one while a second new one joins, and last the old prefill
engine is removed. No client request fails, no engine loads KV another generation wrote, and every
answer is the text the prompt gives on an engine that computes it alone.

Real: redis-server on 127.0.0.1 (the KV pool), simulated engines (`tandem.sim`, tiny profile at time
scale 1000, prefill engines producers and decode engines consumers; `--kv-generation` tells their
chunks apart by content, under the same keys, as two images' KV would be), the gateway with file
discovery over an endpoint file carrying each engine's KV layout (what the pods' labels say under
Kubernetes discovery), httpx streaming clients. Nothing is faked. The second story runs the same
rollout with the layouts left out of the endpoint file (a gateway that pairs regardless of them) and
checks that this does load another generation's KV, so the first story can fail. The last two give
the engines their layout in their pool keys' scope (`--kv-layout`, as the operator's engines have it):
with pairing, as the operator configures the gateway (`kvLayoutInKeys`), and without any pairing,
where the keys alone keep the generations apart (a decode engine finds no chunk of the other
generation, and computes the prompt itself). No test asserts on how long anything took; the phases
move on counted requests, not on time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter, metric
from tests.router.pd_pool import engine_counter
from tests.servers import RedisServer

from tandem.core.files import replace_text
from tandem.core.routerconfig import RouterConfig
from tandem.router.settings import RouterSettings
from tandem.sim.app import create_app as create_sim
from tandem.sim.settings import KVRole, SimSettings

FOREIGN = "tandem_sim_kv_pool_foreign_chunks_total"
CLIENTS = 4
PER_PHASE = 12  # completed requests between two steps of the rollout
MAX_TOKENS = 6


async def engine(
    launcher: Launcher, pool_url: str, *, role: KVRole, generation: str | None, keyed: bool = False
) -> str:
    """A simulated engine of `generation`; `keyed`: its pool keys carry it as its KV layout."""
    settings = SimSettings(
        profile="tiny-cpu",
        model=MODEL_NAME,
        served_model_name=MODEL,
        time_scale=1000,
        kv_role=role,
        kv_pool=pool_url,
        kv_generation=generation,
        kv_layout=generation if keyed else None,
    )
    return await launcher.serve_app(create_sim(settings))


def prompt(n: int) -> list[int]:
    """A prompt of its own per request (300 tokens: one full 256-token chunk), so that no request
    finds another's chunks in the pool: every KV load is the one its own prefill wrote."""
    return [20_000 + (n * 7919 + i) % 40_000 for i in range(300)]


@dataclass
class Endpoints:
    """The endpoint file, rewritten atomically at every step; `layouts` False leaves them out."""

    path: Path
    layouts: bool
    generation: dict[str, str] = field(default_factory=dict)  # URL → its generation

    def write(self, *, prefill: list[str], decode: list[str]) -> None:
        document: dict[str, Any] = {"prefill": prefill, "decode": decode}
        if self.layouts:
            document["layouts"] = {url: self.generation[url] for url in prefill + decode}
        replace_text(self.path, json.dumps(document))


@dataclass
class Load:
    """A closed loop of `CLIENTS` streaming clients; answers and failures by request number."""

    router: RunningRouter
    answers: dict[int, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    served: list[tuple[str, str]] = field(default_factory=list)  # (prefill, decode) of P/D requests
    next_request: int = 0
    stop: bool = False

    @property
    def done(self) -> int:
        return len(self.answers) + len(self.failures)

    async def client(self) -> None:
        while not self.stop:
            n, self.next_request = self.next_request, self.next_request + 1
            try:
                self.answers[n] = await self.one(n)
            except (httpx.HTTPError, AssertionError, ValueError) as exc:
                self.failures.append(f"request {n}: {exc!r}")

    async def one(self, n: int) -> str:
        body = {
            "model": MODEL,
            "prompt": prompt(n),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        text: list[str] = []
        async with self.router.http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                raise AssertionError(f"status {response.status_code}: {(await response.aread())[:200]!r}")
            prefill = response.headers.get("x-tandem-prefill-endpoint")
            decode = response.headers["x-tandem-decode-endpoint"]
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = orjson.loads(line.removeprefix("data: "))
                text.extend(choice["text"] for choice in chunk.get("choices", ()))
            if not done:
                raise AssertionError("the stream ended without [DONE]")
        if prefill is not None and response.headers.get("x-tandem-pd-fallback") is None:
            self.served.append((prefill, decode))
        return "".join(text)


async def until(load: Load, done: int, *, condition: Callable[[], Awaitable[bool]] | None = None) -> None:
    """Wait until `done` requests are over (and `condition` holds), the load still running."""
    for _ in range(6000):
        if load.done >= done and (condition is None or await condition()):
            return
        if load.failures:
            return  # the assertions report them
        await asyncio.sleep(0.01)
    raise AssertionError(f"the load stalled at {load.done} requests")


async def roll(
    launcher: Launcher, redis: RedisServer, tmp_path: Path, *, layouts: bool, keyed: bool = False
) -> tuple[Load, list[str]]:
    """Run the rollout under load (module docstring); returns the load and every engine's URL.
    `keyed`: the engines' pool keys carry their layout, and the gateway is told so when `layouts`."""
    url = redis.url
    p1 = await engine(launcher, url, role="producer", generation="g1", keyed=keyed)
    d1a = await engine(launcher, url, role="consumer", generation="g1", keyed=keyed)
    d1b = await engine(launcher, url, role="consumer", generation="g1", keyed=keyed)
    p2 = await engine(launcher, url, role="producer", generation="g2", keyed=keyed)
    d2a = await engine(launcher, url, role="consumer", generation="g2", keyed=keyed)
    d2b = await engine(launcher, url, role="consumer", generation="g2", keyed=keyed)
    endpoints = Endpoints(tmp_path / "endpoints.json", layouts=layouts)
    endpoints.generation = {u: "g1" for u in (p1, d1a, d1b)} | {u: "g2" for u in (p2, d2a, d2b)}
    endpoints.write(prefill=[p1], decode=[d1a, d1b])
    config = RouterConfig.model_validate(
        {
            "service": "rollout",
            "spec": {
                "model": {"name": MODEL_NAME, "servedName": MODEL},
                "engine": {"kind": "sim"},
                "disaggregation": {"mode": "always"},
            },
            "discovery": {"kind": "file", "path": str(endpoints.path), "pollSeconds": 0.02},
            "kvPoolUrl": url,
            "kvLayoutInKeys": keyed and layouts,
        }
    )
    # Without layouts a keyed pool's barrier cannot find the chunks (the gateway computes keys of no
    # layout): a short barrier keeps that story's misses short until the gateway turns it off.
    settings = RouterSettings.model_validate({"disaggregation": {"kv_barrier_timeout_seconds": 0.2}})
    router = await launcher.router_for(config, settings=settings if keyed and not layouts else None)
    load = Load(router)
    clients = [asyncio.create_task(load.client()) for _ in range(CLIENTS)]

    async def served_by(engine_url: str) -> bool:
        return await engine_counter(engine_url, "vllm:request_success_total") >= 2

    steps: list[tuple[list[str], list[str], str | None]] = [
        ([p1], [d1a, d1b, d2a], d2a),  # a new decode engine, no new prefill engine yet
        ([p1, p2], [d1a, d1b, d2a], p2),  # the new prefill engine
        ([p1, p2], [d1b, d2a, d2b], d2b),  # an old decode engine out, a second new one in
        ([p1, p2], [d2a, d2b], None),  # the last old decode engine out
        ([p2], [d2a, d2b], None),  # the old prefill engine out: the rollout is over
    ]
    try:
        await until(load, PER_PHASE)
        for prefill, decode, joined in steps:
            endpoints.write(prefill=prefill, decode=decode)
            condition = (lambda j=joined: served_by(j)) if joined is not None else None
            await until(load, load.done + PER_PHASE, condition=condition)
        await until(load, load.done + PER_PHASE)
    finally:
        load.stop = True
        await asyncio.gather(*clients)
    return load, [p1, d1a, d1b, p2, d2a, d2b]


async def reference(launcher: Launcher, numbers: list[int]) -> dict[int, str]:
    """The answers an engine computing every prompt itself gives (no pool, no generation)."""
    alone = await launcher.serve_app(
        create_sim(
            SimSettings(profile="tiny-cpu", model=MODEL_NAME, served_model_name=MODEL, time_scale=1000)
        )
    )
    texts: dict[int, str] = {}
    async with httpx.AsyncClient(base_url=alone, trust_env=False, timeout=20) as client:
        for n in numbers:
            body = {
                "model": MODEL,
                "prompt": prompt(n),
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            }
            texts[n] = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
    return texts


async def foreign_chunks(engines: list[str]) -> float:
    return sum([await engine_counter(url, FOREIGN) for url in engines])


async def test_a_rollout_of_both_pools_under_load_fails_nothing_and_never_mixes_generations(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    load, engines = await roll(launcher, redis_server, tmp_path, layouts=True)
    assert load.failures == []
    assert await foreign_chunks(engines) == 0
    expected = await reference(launcher, sorted(load.answers))
    wrong = [n for n, text in load.answers.items() if text != expected[n]]
    assert wrong == []
    # The story exercised what it names: both generations served disaggregated requests, decode
    # engines loaded KV, and a decode engine without a prefill engine of its layout went decode-only.
    p1, _, _, p2, _, _ = (u.removeprefix("http://") for u in engines)
    prefills = {prefill for prefill, _ in load.served}
    assert {p1, p2} <= prefills
    assert sum([await engine_counter(u, "vllm:external_prefix_cache_hits_total") for u in engines]) > 0
    assert await metric(load.router, "tandem_router_pd_fallbacks_total", reason="layout_mismatch") >= 1


async def test_the_same_rollout_without_layouts_loads_another_generations_kv(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    load, engines = await roll(launcher, redis_server, tmp_path, layouts=False)
    assert load.failures == []
    assert await foreign_chunks(engines) > 0
    expected = await reference(launcher, sorted(load.answers))
    assert any(text != expected[n] for n, text in load.answers.items())


async def test_with_the_layout_in_the_pool_keys_the_rollout_is_as_clean_and_the_barrier_finds_the_kv(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The operator's configuration: engines keyed by their layout, a gateway that pairs by layout and
    computes the keys of the decode endpoint's layout, so its KV barrier finds every prefill's chunks."""
    load, engines = await roll(launcher, redis_server, tmp_path, layouts=True, keyed=True)
    assert load.failures == []
    assert await foreign_chunks(engines) == 0
    expected = await reference(launcher, sorted(load.answers))
    assert [n for n, text in load.answers.items() if text != expected[n]] == []
    assert sum([await engine_counter(u, "vllm:external_prefix_cache_hits_total") for u in engines]) > 0
    assert await metric(load.router, "tandem_router_pd_fallbacks_total", reason="barrier_timeout") == 0
    assert await metric(load.router, "tandem_router_pd_kv_barrier_wait_seconds_count", outcome="ok") >= 1


async def test_with_the_layout_in_the_pool_keys_no_generation_loads_anothers_kv_even_unpaired(
    launcher: Launcher, redis_server: RedisServer, tmp_path: Path
) -> None:
    """No layouts in the endpoint file: the gateway pairs engines of two generations, as in the second
    story, but a decode engine's keys are its own generation's: it finds none of the other's chunks."""
    load, engines = await roll(launcher, redis_server, tmp_path, layouts=False, keyed=True)
    assert load.failures == []
    assert await foreign_chunks(engines) == 0
    expected = await reference(launcher, sorted(load.answers))
    assert [n for n, text in load.answers.items() if text != expected[n]] == []
