"""A finished request's objects are freed by reference counting, not left to the cyclic collector.

A reference cycle through a request's context (context → attempt → ticket → context, or a cancelled
task's traceback holding the frame that holds the context) keeps the whole request (its body, its
tokens, the upstream response, the client's transport) alive until a full collection, which at the
gateway's rates means hundreds of thousands of objects between collections: RSS that climbs and
collector passes that cost CPU (docs/soak.md). With the collector off, every request kind is served
and afterwards no request object may be left in memory.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from tests.router.harness import MODEL, Launcher, RunningRouter, metric
from tests.router.test_preemption import LONG, TWO_SLOTS, chat, heavy_pair, running_streams, stream_events

from tandem.router.pipeline.context import RequestContext
from tandem.router.scheduling.state import Ticket
from tandem.router.settings import AdmissionSettings, RouterSettings
from tandem.router.upstream.dispatch import Attempt

NIXL_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_block_ids": [1]}


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def live_request_objects() -> dict[str, int]:
    kinds = (RequestContext, Attempt, Ticket)
    counts = {kind.__name__: 0 for kind in kinds}
    for obj in gc.get_objects():
        for kind in kinds:
            if isinstance(obj, kind):
                counts[kind.__name__] += 1
    return counts


async def settled(router: RunningRouter) -> None:
    for _ in range(100):  # cleanups run right after the response ends; give the loop a few turns
        if await metric(router, "tandem_router_endpoint_in_flight_requests") == 0:
            return
        await asyncio.sleep(0.02)


async def test_no_request_object_outlives_its_request(launcher: Launcher, no_cyclic_collector: None) -> None:
    decode = await launcher.engine("d0", tokens=6)
    slow = await launcher.engine("d1", tokens=500, token_delay=0.02)
    failing = await launcher.engine("d2", status=503)
    dying = await launcher.engine("d3", tokens=6, die_after=2)
    router = await launcher.router(decode=[decode])
    leaving = await launcher.router(decode=[slow])
    retrying = await launcher.router(decode=[failing, decode], spec={"router": {"policy": "round-robin"}})
    broken = await launcher.router(decode=[dying])
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}

    for _ in range(5):
        stream = await router.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, stream=True
        )
        assert len([chunk async for chunk in stream]) >= 6
        assert (await router.http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert (await router.http.post("/v1/completions", json={"model": MODEL})).status_code == 400
        unknown = await router.http.post("/v1/chat/completions", json={**chat, "model": "nope"})
        assert unknown.status_code == 404
    for _ in range(3):  # the failing engine first or second: a retry on the other
        assert (await retrying.http.post("/v1/chat/completions", json=chat)).status_code == 200
    assert failing.received  # at least one request was served on a retry
    async with broken.http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as response:
        assert b"error" in b"".join([chunk async for chunk in response.aiter_raw()])
    left = await leaving.openai.completions.create(model=MODEL, prompt="x", max_tokens=500, stream=True)
    async for _ in left:
        break
    await left.close()
    await asyncio.wait_for(slow.cancelled.wait(), timeout=10)
    for running in (router, leaving, retrying, broken):
        await settled(running)

    assert live_request_objects() == {"RequestContext": 0, "Attempt": 0, "Ticket": 0}


async def test_no_disaggregated_request_object_outlives_its_request(
    launcher: Launcher, no_cyclic_collector: None
) -> None:
    prefill = await launcher.engine("p0", kv_transfer_params=NIXL_PARAMS)
    decode = await launcher.engine("d0")
    router = await launcher.router(decode=[decode], prefill=[prefill], mode="always")

    for _ in range(5):
        stream = await router.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me"}], max_tokens=4, stream=True
        )
        assert len([chunk async for chunk in stream]) >= 4
    await settled(router)

    assert len(prefill.received) == 5
    assert live_request_objects() == {"RequestContext": 0, "Attempt": 0, "Ticket": 0}


async def test_no_queued_or_refused_request_object_outlives_its_request(
    launcher: Launcher, no_cyclic_collector: None
) -> None:
    decode = await launcher.engine("d0", tokens=2, answer_delay=0.3)
    one_at_a_time = AdmissionSettings(max_in_flight_per_endpoint=1, poll_seconds=0.02)
    settings = RouterSettings(admission=one_at_a_time)
    router = await launcher.router(decode=[decode], settings=settings, spec={"router": {"maxQueue": 3}})
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}

    assert (await router.http.post("/v1/completions", json=body)).status_code == 200
    running = asyncio.create_task(router.http.post("/v1/completions", json=body))
    await asyncio.sleep(0.05)
    late = await router.http.post("/v1/completions", json=body, headers={"x-slo-ttft-ms": "100"})
    assert late.status_code == 429  # it waited in the queue until its own deadline
    assert await metric(router, "tandem_router_queue_wait_seconds_count", outcome="rejected") == 1
    assert (await running).status_code == 200
    answers = await asyncio.gather(
        *(router.http.post("/v1/completions", json=body, headers={"x-tenant-id": f"t{i}"}) for i in range(6))
    )  # one runs, three wait in the fair queue, two find it full
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(200) >= 4 and set(statuses) <= {200, 429}
    running = asyncio.create_task(router.http.post("/v1/completions", json=body))
    other = {"x-tenant-id": "w"}
    waiting = asyncio.create_task(router.http.post("/v1/completions", json=body, headers=other))
    for _ in range(500):
        if await metric(router, "tandem_router_queue_depth", priority="0") >= 1:
            break
        await asyncio.sleep(0.01)
    waiting.cancel()  # a queued request whose client hangs up
    assert (await running).status_code == 200
    await settled(router)

    assert live_request_objects() == {"RequestContext": 0, "Attempt": 0, "Ticket": 0}


async def test_no_preempted_or_continued_request_object_outlives_its_request(
    launcher: Launcher, no_cyclic_collector: None
) -> None:
    engine = await launcher.engine("d0", tokens=LONG, token_delay=0.02)
    router = await launcher.router(decode=[engine], settings=RouterSettings(admission=TWO_SLOTS))
    heavy = await running_streams(router, heavy_pair())
    await stream_events(router, chat("light", 3), "light")
    await asyncio.gather(*heavy)
    await settled(router)

    assert await metric(router, "tandem_router_preemptions_total") == 1
    assert live_request_objects() == {"RequestContext": 0, "Attempt": 0, "Ticket": 0}
