"""Declared adapters loaded ahead of their first requests when the engines' CPU tiers hold them all
(`tandem.router.scheduling.adapterwarm`, `tandem.router.upstream.adaptercopy.AdapterWarmer`).

Real: the plan over plain data; `tandem sim` engines with `--enable-lora --max-cpu-loras`, vLLM's
runtime API and filesystem resolver over adapter folders in tmp_path, the router (`create_app`),
uvicorn servers on 127.0.0.1, httpx. Nothing is faked; no assertion is on speed.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.router.servers import serve
from tests.router.test_gateway_lora import RESOLVER, lora_config, write_adapter

from tandem.core.routerconfig import RouterConfig
from tandem.router.app import create_app as router_app
from tandem.router.compose.service import adapter_restarts, adapter_warmer
from tandem.router.config import resolve
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.request.adapters import ServiceAdapters
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.adapterwarm import warm_plan, warm_room
from tandem.router.scheduling.scorers import home_ranks
from tandem.router.settings import RouterSettings
from tandem.router.types import EngineStats
from tandem.router.upstream.adaptercopy import AdapterCopier, AdapterWarmer
from tandem.router.upstream.client import HTTPUpstream, new_wire
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

NAMES = [f"w{i}" for i in range(6)]

# -- the plan -------------------------------------------------------------------------------------


def test_every_adapter_gets_one_engine_within_its_room_first_in_its_own_order() -> None:
    urls = ["a", "b", "c"]
    plan = warm_plan(NAMES, urls, {}, room=2)
    placed = [n for adapters in plan.values() for n in adapters]
    assert sorted(placed) == NAMES and all(len(adapters) <= 2 for adapters in plan.values())
    # Room to spare: each adapter at the first engine of its rendezvous order.
    roomy = warm_plan(NAMES, urls, {}, room=6)
    for url, adapters in roomy.items():
        assert all(min(home_ranks(n, urls), key=home_ranks(n, urls).__getitem__) == url for n in adapters)


def test_the_plan_is_the_same_whatever_order_the_engines_come_in() -> None:
    assert warm_plan(NAMES, ["a", "b", "c"], {}, room=3) == warm_plan(NAMES, ["c", "a", "b"], {}, room=3)


@pytest.mark.parametrize(
    ("held", "room", "expected"),
    [
        pytest.param({}, 1, {}, id="six-over-three-engines-of-one:no-fit-no-plan"),
        pytest.param({"a": NAMES}, 6, {}, id="all-held:nothing-to-load"),
        pytest.param({"a": ["w0", "other"], "b": ["w0"]}, 2, None, id="held-once-counted-once"),
    ],
)
def test_what_is_held_is_not_loaded_and_what_does_not_fit_is_left_to_first_use(
    held: dict[str, list[str]], room: int, expected: dict[str, list[str]] | None
) -> None:
    plan = warm_plan(NAMES, ["a", "b", "c"], held, room=room)
    if expected is not None:
        assert plan == expected
        return
    placed = [n for adapters in plan.values() for n in adapters]
    assert sorted(placed) == NAMES[1:], "w0 is held; an undeclared adapter takes no room"
    assert len(plan.get("a", [])) <= 1 and all(len(v) <= 2 for v in plan.values())


def test_the_room_is_the_cpu_tier_less_the_gpu_slots() -> None:
    assert warm_room(max_cpu_loras=64, max_loras=4) == 60
    assert warm_room(max_cpu_loras=4, max_loras=4) == 0


# -- against simulated engines --------------------------------------------------------------------


def engine(adapters: Path, *, cpu_loras: int = 6, time_scale: float = 1000) -> Any:
    settings = SimSettings.model_validate(
        {"profile": "tiny-cpu", "served_model_name": "qwen", "time_scale": time_scale,
         "enable_lora": True, "max_loras": 2, "max_cpu_loras": cpu_loras}
    )  # fmt: skip
    return sim_app(settings, environ=RESOLVER | {"VLLM_LORA_RESOLVER_CACHE_DIR": str(adapters)})


async def listed(client: httpx.AsyncClient, url: str) -> list[str]:
    return [m["id"] for m in (await client.get(f"{url}/v1/models")).json()["data"] if m.get("parent")]


async def disk_reads(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    lines = [line for line in text.splitlines() if line.startswith("tandem_sim_lora_loads_total{")]
    lines = [line for line in lines if 'source="disk"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def recording_copier(stack: AsyncExitStack, directory: Path) -> tuple[AdapterLoads, AdapterCopier]:
    """A placement record and a copier over one wire (closed with `stack`) that records each load it
    finishes there."""
    wire = new_wire(RouterSettings().proxy)
    stack.callback(wire.close)
    loads = AdapterLoads()
    copier = AdapterCopier(
        HTTPUpstream(wire, RouterSettings().proxy), directory=str(directory), timeout_s=5.0,
        done=lambda url, adapter, ok: loads.copy_done(url, adapter, ok=ok),
    )  # fmt: skip
    return loads, copier


async def test_the_warmer_loads_each_adapter_once_and_only_on_idle_engines(tmp_path: Path) -> None:
    """Two engines; the first is busy (a request in flight) until the test frees it: the second gets
    its share at once, the first only afterwards; every adapter ends on exactly one engine, in the
    placement's record there, and a second round loads nothing."""
    for name in NAMES:
        write_adapter(tmp_path, name)
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(serve(engine(tmp_path)))
        second = await stack.enter_async_context(serve(engine(tmp_path)))
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        loads, copier = recording_copier(stack, tmp_path)
        busy = {first.url: 1, second.url: 0}
        warmer = AdapterWarmer(
            loads, copier, pools=lambda: [list(busy.items())], names=lambda: NAMES, capacity=6, room=4
        )
        plan = warmer.todo()
        assert sorted(n for adapters in plan.values() for n in adapters) == NAMES
        warmer.kick()
        for _ in range(200):
            if not warmer.todo().get(second.url):
                break
            await asyncio.sleep(0.02)
        assert sorted(await listed(direct, second.url)) == sorted(plan.get(second.url, []))
        assert await listed(direct, first.url) == [], "busy: nothing loaded there yet"
        busy[first.url] = 0
        for _ in range(200):
            if not warmer.todo():
                break
            await asyncio.sleep(0.02)
        on_first, on_second = await listed(direct, first.url), await listed(direct, second.url)
        assert sorted(on_first + on_second) == NAMES and not set(on_first) & set(on_second)
        assert sorted(loads.residency.adapters(first.url)) == sorted(on_first)
        assert copier.warm_loads == {"loaded": 6, "failed": 0} and copier.copies == {"loaded": 0, "failed": 0}
        warmer.kick()
        await asyncio.sleep(0.1)
        assert copier.warm_loads["loaded"] == 6, "a second round finds everything held"
        await warmer.stop()
        await copier.stop()


async def test_with_prefill_and_decode_pools_each_adapter_is_on_one_engine_of_each(tmp_path: Path) -> None:
    """P/D: a request under an adapter runs on a prefill and a decode engine, so each pool gets its
    own plan. An adapter a request already loaded on a decode engine is still loaded on a prefill
    engine (held in one pool is not held in the other), and not again in the decode pool."""
    for name in NAMES:
        write_adapter(tmp_path, name)
    async with AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(serve(engine(tmp_path))) for _ in range(4)]
        prefill, decode = [s.url for s in sims[:2]], [s.url for s in sims[2:]]
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        loads, copier = recording_copier(stack, tmp_path)
        assert await copier.copy(decode[1], "w0", inplace=False), "a request's load, before warming"
        loads.residency.record(decode[1], "w0", capacity=6)
        warmer = AdapterWarmer(
            loads, copier, pools=lambda: [[(u, 0) for u in prefill], [(u, 0) for u in decode]],
            names=lambda: NAMES, capacity=6, room=4,
        )  # fmt: skip
        warmer.kick()
        for _ in range(300):
            if not warmer.todo():
                break
            await asyncio.sleep(0.02)
        for urls in (prefill, decode):
            held = [n for url in urls for n in await listed(direct, url)]
            assert sorted(held) == NAMES, f"each declared adapter on exactly one engine of {urls}"
        assert "w0" in await listed(direct, decode[1]) and "w0" not in await listed(direct, decode[0])
        assert copier.warm_loads == {"loaded": 1 + 2 * len(NAMES) - 1, "failed": 0}
        await warmer.stop()
        await copier.stop()


async def test_a_load_of_an_adapter_the_engine_has_counts_as_held(tmp_path: Path) -> None:
    """Not in place, vLLM answers 400 "has already been loaded" without a read: another worker or
    replica loaded it, and the engine holds it."""
    write_adapter(tmp_path, "w0")
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(serve(engine(tmp_path)))
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        wire = new_wire(RouterSettings().proxy)
        stack.callback(wire.close)
        copier = AdapterCopier(
            HTTPUpstream(wire, RouterSettings().proxy), directory=str(tmp_path), timeout_s=5.0
        )
        assert await copier.copy(sim.url, "w0", inplace=False)
        reads = await disk_reads(direct, sim.url)
        assert await copier.copy(sim.url, "w0", inplace=False)
        assert await disk_reads(direct, sim.url) == reads == 1, "the second answer read nothing"
        assert copier.warm_loads == {"loaded": 2, "failed": 0}
        assert not await copier.copy(sim.url, "missing", inplace=False), "no such adapter: failed"


def warm_config(urls: list[str], load_dir: Path, *, cpu_loras: int | None = 6) -> RouterConfig:
    document = lora_config(urls).model_dump(by_alias=True, mode="json")
    lora: dict[str, int] = {"maxLoras": 2}
    if cpu_loras is not None:
        lora["maxCpuLoras"] = cpu_loras
    document["spec"]["engine"]["lora"] = lora
    document["spec"]["adapters"] = []
    document["adapterNames"] = NAMES
    document["adapterLoadDir"] = str(load_dir)
    return RouterConfig.model_validate(document)


async def test_through_the_gateway_no_first_request_reads_its_adapter(tmp_path: Path) -> None:
    """A gateway in front of two engines whose CPU tiers hold the six declared adapters loads each
    onto one engine before any request; then a request under each adapter reads nothing from disk
    (the placement sends it where the adapter was loaded)."""
    for name in NAMES:
        write_adapter(tmp_path, name)
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(serve(engine(tmp_path))) for _ in range(2)]
        urls = [e.url for e in engines]
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        gateway = await stack.enter_async_context(serve(router_app(warm_config(urls, tmp_path))))
        for _ in range(300):
            held = [n for url in urls for n in await listed(direct, url)]
            if sorted(held) == NAMES:
                break
            await asyncio.sleep(0.05)
        assert sorted(held) == NAMES, "each declared adapter on exactly one engine"
        reads = [await disk_reads(direct, url) for url in urls]
        assert sum(reads) == len(NAMES)
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=gateway.url, trust_env=False))
        for name in NAMES:
            reply = await client.post(
                "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2}
            )
            assert reply.status_code == 200, reply.text
        assert [await disk_reads(direct, url) for url in urls] == reads, "no request read its adapter"
        page = (await client.get("/metrics")).text
        assert 'tandem_router_adapter_warm_loads_total{outcome="loaded"} 6.0' in page


async def test_the_gateway_is_ready_once_its_declared_adapters_are_loaded(tmp_path: Path) -> None:
    """At start-up `GET /health` says 503 `warming` while the six declared adapters are read onto
    the two engines (at time scale 1 each read takes the simulator's tens of milliseconds), and its
    first 200 comes when every one of them is held. Polled, not timed: the assertion is on what the
    engines hold when the answer changes."""
    for name in NAMES:
        write_adapter(tmp_path, name)
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(serve(engine(tmp_path, time_scale=1))) for _ in range(2)]
        urls = [e.url for e in engines]
        direct = await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        gateway = await stack.enter_async_context(serve(router_app(warm_config(urls, tmp_path))))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=gateway.url, trust_env=False))
        answers = []
        for _ in range(1000):
            reply = await client.get("/health")
            answers.append((reply.status_code, reply.json()["status"]))
            if reply.status_code == 200:
                break
            await asyncio.sleep(0.005)
        held = [n for url in urls for n in await listed(direct, url)]
        assert answers[-1] == (200, "ok") and sorted(held) == NAMES, "ready: every adapter is held"
        assert (503, "warming") in answers, answers[:3]
        assert set(answers[:-1]) <= {(503, "warming"), (503, "unavailable")}


def test_warming_ends_with_the_first_round_or_its_bound() -> None:
    """`warming` (what /health reads): a reason until the first round over known engines is done,
    or until `ready_after_s` has passed; never with no room (nothing to load) or a bound of 0."""
    now = [0.0]
    upstream = HTTPUpstream(new_wire(RouterSettings().proxy), RouterSettings().proxy)
    copier = AdapterCopier(upstream, directory="/adapters", timeout_s=1.0)

    def warmer(*, room: int = 4, ready_after_s: float = 5.0) -> AdapterWarmer:
        return AdapterWarmer(
            AdapterLoads(), copier, pools=lambda: [[("http://127.0.0.1:1", 0)]], names=lambda: NAMES,
            capacity=6, room=room, ready_after_s=ready_after_s, clock=lambda: now[0],
        )  # fmt: skip

    bounded = warmer()
    assert bounded.warming() is not None
    now[0] = 4.9
    assert bounded.warming() is not None
    now[0] = 5.0
    assert bounded.warming() is None, "the bound: ready anyway, loading on while serving"
    now[0] = 0.0
    assert warmer(room=0).warming() is None and warmer(ready_after_s=0).warming() is None


def test_the_warmer_is_on_only_with_room_in_the_cpu_tier_and_a_copier(
    tmp_path: Path,
) -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    upstream = HTTPUpstream(new_wire(RouterSettings().proxy), RouterSettings().proxy)
    copier = AdapterCopier(upstream, directory=str(tmp_path), timeout_s=1.0)
    adapters = ServiceAdapters({"qwen"}, tuple(NAMES))
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=5.0, clock=lambda: 0.0)
    loads = AdapterLoads()

    def warmer(config: RouterConfig, *, copy: bool = True) -> AdapterWarmer | None:
        effective = resolve(config, RouterSettings())
        return adapter_warmer(effective, registry, adapters, loads, copier if copy else None)

    on = warmer(warm_config(urls, tmp_path))
    assert on is not None and on.room == 4
    prefill = ["http://127.0.0.1:3", "http://127.0.0.1:4"]
    registry.set_pool("prefill", prefill)
    registry.set_pool("decode", urls)
    assert set(on.todo()) == set(prefill + urls), "both pools' engines are warmed (6 names, room 4 each)"
    assert warmer(warm_config(urls, tmp_path), copy=False) is None, "no adapterLoadDir: no copier"
    assert warmer(warm_config(urls, tmp_path, cpu_loras=None)) is None, "vLLM's default tier: no room"
    assert warmer(warm_config(urls, tmp_path, cpu_loras=2)) is None, "no room beyond the GPU slots"


async def test_an_engine_that_restarted_holds_no_adapter_and_is_warmed_again(tmp_path: Path) -> None:
    """The registry checks each good scrape against the last (`on_restart`): another start time means
    the engine lost what it had loaded, so the placement's record forgets its adapters (a request
    there is priced as a load again) and the warmer may load them there again. The same start time
    changes nothing, nor does another engine's restart."""
    url, other = "http://127.0.0.1:1", "http://127.0.0.1:2"
    registry = EndpointRegistry(failure_threshold=3, cooldown_seconds=5.0, clock=lambda: 0.0)
    registry.set_pool("decode", [url, other])
    loads = AdapterLoads()
    for engine in (url, other):
        loads.residency.record(engine, "w0", capacity=6)
    upstream = HTTPUpstream(new_wire(RouterSettings().proxy), RouterSettings().proxy)
    copier = AdapterCopier(upstream, directory=str(tmp_path), timeout_s=1.0)
    warmer = AdapterWarmer(loads, copier, pools=lambda: [[(url, 1), (other, 1)]], names=lambda: NAMES,
                           capacity=6, room=4)  # fmt: skip
    warmer._tried.add((url, "w1"))  # a load tried there before the restart
    restarts = adapter_restarts(loads, warmer)
    assert restarts is not None
    registry.on_restart(restarts)

    def scrape(engine: str, started: float, served: float) -> None:
        stats = EngineStats(running=0, waiting=0, kv_usage=0.0, block_size=16, num_gpu_blocks=100,
                            served=served, started=started)  # fmt: skip
        registry.record_scrape(engine, stats)

    scrape(url, 1000.0, 5)
    scrape(other, 1000.0, 5)
    scrape(url, 1000.0, 9)
    assert loads.residency.holds(url, "w0"), "the same start time: nothing lost"
    scrape(url, 2000.0, 0)
    assert not loads.residency.holds(url, "w0") and loads.residency.holds(other, "w0")
    assert (url, "w1") not in warmer._tried, "its adapters may be warmed there again"
    assert adapter_restarts(None, None) is None, "no adapter placement: nothing to check"
    await warmer.stop()
