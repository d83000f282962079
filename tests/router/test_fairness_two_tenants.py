"""Two tenants overloading four engines: VTC gives the light tenant its fair share, FCFS does not.

Real: four simulated engines (`tandem.sim`, tiny profile, 8 ms per step: time scale 1, each a uvicorn
server on 127.0.0.1 in its own thread), the router with a per-endpoint limit of 2 requests in flight
(so at most 8 run and the rest wait in the router's queue, where the policy orders them), HTTP
clients, and the router's per-tenant served-token counters. Nothing is faked.

Workload (closed loop, so the offered load adapts to the machine's speed): the heavy tenant keeps 32
long non-streaming requests (64 prompt + 96 output tokens) outstanding; the light tenant 16 short
streaming ones (64 + 32), so its output is charged token by token as it streams. Each tenant has
at least twice the router's capacity outstanding, so both stay backlogged (VTC lifts a tenant that
drops out of the queue, and a tenant with fewer requests than its fair share is not owed it).
Service is the paper's `W = w_p·prompt + w_q·completion` (1 and 2) between two reads of the counters,
after the light tenant's 20th and (20+120)-th answers: the window is set by token counts, never by
wall-clock time. Equal weights → fair share 1/2. FCFS serves by arrival, so the light tenant's share
is about its share of the waiting requests weighted by their size: 16·128 / (16·128 + 32·256) = 0.2.

The router and the clients share one event loop (and the engines' threads one GIL), so the engines'
pace is what keeps that loop from saturating: at time scale 2 a busy machine's loop fell behind the
clients, their requests waited to be read instead of in the router's queue, and no policy can order
requests it has not seen (queue depth 0 at the end). Time scale 1 halves the tokens a second.

Measured on a loaded 2-core machine: VTC 0.50 (0.499–0.528), FCFS 0.21.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import httpx
import pytest
from tests.router.harness import MODEL, MODEL_NAME, Launcher, RunningRouter, metric
from tests.servers import run_uvicorn

from tandem.router.settings import AdmissionSettings, CollectorSettings, RouterSettings
from tandem.sim.app import create_app as create_sim
from tandem.sim.settings import SimSettings

ENGINES = 4
PER_ENDPOINT = 2
HEAVY_WORKERS, LIGHT_WORKERS = 32, 16
PROMPT_TOKENS = 64
HEAVY_OUTPUT, LIGHT_OUTPUT = 96, 32
WARMUP, WINDOW = 20, 120  # light answers before the window opens, and inside it
W_P, W_Q = 1.0, 2.0
TIME_SCALE = 1.0


@contextlib.contextmanager
def engines(n: int) -> Iterator[list[str]]:
    settings = SimSettings(
        profile="tiny-cpu", model=MODEL_NAME, served_model_name=MODEL, time_scale=TIME_SCALE
    )
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_uvicorn(create_sim(settings))) for _ in range(n)]


@dataclass
class Window:
    light: float
    heavy: float

    @property
    def light_share(self) -> float:
        return self.light / (self.light + self.heavy)


async def service(router: RunningRouter, tenant: str) -> float:
    served = "tandem_router_tenant_served_tokens_total"
    prompt = await metric(router, served, tenant=tenant, kind="prompt")
    completion = await metric(router, served, tenant=tenant, kind="completion")
    return W_P * prompt + W_Q * completion


async def until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 - the workers' counts are plain ints, polled
        await asyncio.sleep(0.05)


async def measure(launcher: Launcher, urls: list[str], fairness: Literal["vtc", "fcfs"]) -> Window:
    admission = AdmissionSettings(
        fairness=fairness,
        max_in_flight_per_endpoint=PER_ENDPOINT,
        max_waiting_per_endpoint=None,
        max_kv_usage=None,
    )
    # Round-robin and no metrics scraping: this measures the queue's order, nothing else.
    settings = RouterSettings(admission=admission, collector=CollectorSettings(enabled=False))
    spec = {"router": {"policy": "round-robin", "slo": {"ttftSeconds": 3600}}}
    router = await launcher.router(decode=urls, settings=settings, spec=spec)
    finished = {"light": 0, "heavy": 0}
    salt = itertools.count()

    async def worker(client: httpx.AsyncClient, tenant: str, max_tokens: int, *, stream: bool) -> None:
        while True:
            n = next(salt)
            body = {
                "model": MODEL,
                "prompt": [1000 + (n * 131 + i) % 50_000 for i in range(PROMPT_TOKENS)],
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": stream,
            }
            headers = {"x-tenant-id": tenant}
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                assert response.status_code == 200
                async for _ in response.aiter_raw():
                    pass
            finished[tenant] += 1

    connections = HEAVY_WORKERS + LIGHT_WORKERS + 4
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=router.url, trust_env=False, timeout=300, limits=limits) as client:
        tasks = [
            asyncio.create_task(worker(client, "heavy", HEAVY_OUTPUT, stream=False))
            for _ in range(HEAVY_WORKERS)
        ]
        tasks += [
            asyncio.create_task(worker(client, "light", LIGHT_OUTPUT, stream=True))
            for _ in range(LIGHT_WORKERS)
        ]
        try:
            await until(lambda: finished["light"] >= WARMUP)
            start = Window(light=await service(router, "light"), heavy=await service(router, "heavy"))
            await until(lambda: finished["light"] >= WARMUP + WINDOW)
            end = Window(light=await service(router, "light"), heavy=await service(router, "heavy"))
            assert await metric(router, "tandem_router_queue_depth") > 0  # still overloaded at the end
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return Window(light=end.light - start.light, heavy=end.heavy - start.heavy)


@pytest.fixture(scope="module")
def four_engines() -> Iterator[list[str]]:
    with engines(ENGINES) as urls:
        yield urls


async def test_vtc_gives_the_light_tenant_its_fair_share_under_overload(
    launcher: Launcher, four_engines: list[str]
) -> None:
    window = await measure(launcher, four_engines, "vtc")
    print(f"VTC: light {window.light:.0f}, heavy {window.heavy:.0f}, light share {window.light_share:.3f}")
    assert window.light_share == pytest.approx(0.5, rel=0.10)


async def test_fcfs_gives_the_light_tenant_far_less(launcher: Launcher, four_engines: list[str]) -> None:
    window = await measure(launcher, four_engines, "fcfs")
    print(f"FCFS: light {window.light:.0f}, heavy {window.heavy:.0f}, light share {window.light_share:.3f}")
    assert window.light_share < 0.5 * 0.7
