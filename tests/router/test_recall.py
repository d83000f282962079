"""Recalling requests an engine queues beyond its learned capacity (`tandem.router.upstream.recall`).

Pure: `to_recall`'s table. Real asyncio tasks: `Recalls` cancels the newest waiting ones and tells a
recall from any other cancellation. Real servers on 127.0.0.1: one simulated engine with
`--max-num-seqs 2` (`tandem.sim`, 3× speed), a gateway told nothing of it, a heavy tenant's burst of 12
streams sent before the engine's slots are known, then a light tenant's request: the burst's
surplus is recalled into the gateway's fair queue, so no heavy answer the engine had queued starts
before the light request (with recall off, 8 of them did here), and every heavy answer still arrives
whole. Nothing is faked.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.harness import router_config
from tests.router.servers import serve

from tandem.router.app import create_app as router_app
from tandem.router.settings import RouterSettings
from tandem.router.types import Endpoint, EndpointSnapshot, EngineReading, EngineStats
from tandem.router.upstream.recall import Recalls, to_recall
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings


@pytest.mark.parametrize(
    ("occupied", "limit", "waiting", "pending", "expected"),
    [
        (16, 4, 12, 16, 12),  # the example: everything the engine queues beyond C
        (16, 4, 3, 16, 3),  # no more than the engine says waits
        (16, 4, 12, 5, 5),  # only requests still without an answer
        (4, 4, 5, 4, 0),  # within the limit: another process's requests wait, not ours to take
        (3, 4, 2, 3, 0),
    ],
)
def test_the_excess_over_the_limit_that_waits_is_recalled(
    occupied: int, limit: int, waiting: int, pending: int, expected: int
) -> None:
    assert to_recall(occupied=occupied, limit=limit, waiting=waiting, pending=pending) == expected


TIME_SCALE = 3.0  # tiny-cpu at 3× speed: the burst takes about a second to drain
ENGINE = Endpoint("decode", "http://127.0.0.1:1")


def _snapshot(*, in_flight: int, waiting: int, stale: bool = False) -> EndpointSnapshot:
    stats = EngineStats(running=2, waiting=waiting, kv_usage=0.1, block_size=16, num_gpu_blocks=64)
    reading = EngineReading(stats=stats, scraped_at=0.0, stale=stale)
    return EndpointSnapshot(
        endpoint=ENGINE, in_flight=in_flight, consecutive_failures=0, in_rotation=True, engine=reading
    )


async def test_the_newest_waiting_requests_are_recalled_and_know_it() -> None:
    recalls = Recalls()
    outcomes: list[str] = []

    async def waits(name: str) -> None:
        entry = recalls.register(ENGINE)
        assert entry is not None
        try:
            await asyncio.sleep(30)
            outcomes.append(f"{name} answered")
        except asyncio.CancelledError as exc:
            outcomes.append(f"{name} recalled" if entry.taken_back(exc) else f"{name} cancelled")
        finally:
            recalls.done(ENGINE, entry)

    tasks = [asyncio.create_task(waits(name)) for name in ("first", "second", "third", "fourth")]
    await asyncio.sleep(0)
    assert recalls.check(_snapshot(in_flight=4, waiting=2, stale=True), limit=1) == 0  # stale: unknown
    assert recalls.check(_snapshot(in_flight=4, waiting=2), limit=1) == 2
    await asyncio.sleep(0)
    assert sorted(outcomes) == ["fourth recalled", "third recalled"]
    assert recalls.pending(ENGINE.url) == 2
    tasks[0].cancel()  # a client that leaves is not a recall
    await asyncio.sleep(0)
    assert "first cancelled" in outcomes
    assert recalls.check(_snapshot(in_flight=1, waiting=5), limit=1) == 0
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert recalls.pending(ENGINE.url) == 0


async def _waiting(
    recalls: Recalls, entries: list[tuple[str, bool]]
) -> tuple[list[asyncio.Task[None]], list[str]]:
    """One task per `(tenant, loaded)` waiting on ENGINE in that order; the list of those recalled
    (`tenant + index`, and `+room` when the recall carried an event to wait for before resending)."""
    recalled: list[str] = []

    async def waits(index: int, tenant: str, loaded: bool) -> None:
        entry = recalls.register(ENGINE, tenant=tenant, loaded=loaded)
        assert entry is not None
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError as exc:
            if not entry.taken_back(exc):
                raise
            recalled.append(f"{tenant}{index}" + ("+room" if entry.until is not None else ""))
        finally:
            recalls.done(ENGINE, entry)

    tasks = [asyncio.create_task(waits(i, t, loaded)) for i, (t, loaded) in enumerate(entries)]
    await asyncio.sleep(0)
    return tasks, recalled


async def test_a_reading_never_recalls_a_request_whose_kv_a_prefill_loaded() -> None:
    recalls = Recalls()
    tasks, recalled = await _waiting(recalls, [("heavy", False), ("heavy", True), ("heavy", True)])
    # Two over the limit and two waiting by the reading, but only the first was prefilled here.
    assert recalls.check(_snapshot(in_flight=3, waiting=2), limit=1) == 1
    await asyncio.sleep(0)
    assert recalled == ["heavy0"]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_pre_empting_request_has_other_tenants_newest_requests_recalled_while_over_the_limit() -> (
    None
):
    recalls = Recalls()
    # Two heavy requests sent ahead of their slots, then the light one (its own entry comes last).
    tasks, recalled = await _waiting(
        recalls, [("heavy", True), ("heavy", True), ("heavy", True), ("light", True)]
    )
    # Limit 6: 5 streams answering (not pending) + 3 heavy pending + the light one = 9 open.
    assert (
        recalls.make_room(_snapshot(in_flight=9, waiting=0), limit=6, tenant="light", until=asyncio.Event())
        == 3
    )
    await asyncio.sleep(0)
    # Each knows to wait for the light request (it keeps its grant), not for its tenant's turn.
    assert sorted(recalled) == ["heavy0+room", "heavy1+room", "heavy2+room"]
    assert recalls.pending(ENGINE.url) == 1  # the light request itself stays
    # Within the limit, nothing is recalled.
    more, again = await _waiting(recalls, [("heavy", True)])
    assert (
        recalls.make_room(_snapshot(in_flight=6, waiting=3), limit=6, tenant="light", until=asyncio.Event())
        == 0
    )
    # One over: only the newest other tenant's request, never the light one.
    assert (
        recalls.make_room(_snapshot(in_flight=7, waiting=3), limit=6, tenant="light", until=asyncio.Event())
        == 1
    )
    await asyncio.sleep(0)
    assert again == ["heavy0+room"] and recalls.pending(ENGINE.url) == 1
    for task in tasks + more:
        task.cancel()
    await asyncio.gather(*tasks, *more, return_exceptions=True)


def _metric(page: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name
    )


@pytest.mark.parametrize("recall", ["on", "off"])
async def test_a_burst_sent_before_the_slots_were_known_is_recalled_behind_a_newcomer(recall: str) -> None:
    sim = SimSettings(
        profile="tiny-cpu", served_model_name="qwen", time_scale=TIME_SCALE, max_num_seqs=2, seed=1
    )
    async with serve(sim_app(sim)) as engine:
        config = router_config(decode=[engine.url], spec={"router": {"slo": {"ttftSeconds": 60}}})
        settings = RouterSettings.model_validate(
            {
                "collector": {"interval_seconds": 0.2, "learning_interval_seconds": 0.05},
                "admission": {"recall": recall},
            }
        )
        async with (
            serve(router_app(config, settings=settings)) as router,
            httpx.AsyncClient(timeout=60, trust_env=False) as client,
        ):
            body = {"model": "qwen", "prompt": "hello", "max_tokens": 48, "stream": True, "ignore_eos": True}
            body["stream_options"] = {"include_usage": True}
            started: list[str] = []
            finished: list[str] = []
            tokens: list[int] = []

            async def send(tenant: str) -> int:
                """The stream's answer; returns how many heavy answers started between its sending
                and its first byte (overtook it)."""
                at_send, at_first = started.count("heavy"), -1
                usage = None
                headers = {"x-tenant-id": tenant}
                async with client.stream(
                    "POST", f"{router.url}/v1/completions", json=body, headers=headers
                ) as response:
                    assert response.status_code == 200
                    async for line in response.aiter_lines():
                        if at_first < 0:
                            at_first = started.count("heavy")
                            started.append(tenant)
                        if line.startswith("data: {") and '"usage": {' in line.replace('":{', '": {'):
                            usage = line
                assert usage is not None and '"completion_tokens":48' in usage.replace(" ", "")
                finished.append(tenant)
                tokens.append(48)
                return at_first - at_send

            heavy = [asyncio.create_task(send("heavy")) for _ in range(12)]
            for _ in range(200):  # until the gateway has learned the engine's 2 slots (and, with
                # recall on, has taken the surplus back: on a CPU-starved loop the recall can still
                # be under way when the slots are confirmed, and the light request would race it)
                page = (await client.get(f"{router.url}/metrics")).text
                if _metric(page, "tandem_router_engine_capacity_confirmed") == 1 and (
                    recall == "off" or _metric(page, "tandem_router_recalled_total") >= 4
                ):
                    break
                await asyncio.sleep(0.05)
            overtaken = await send("light")
            await asyncio.gather(*heavy)
            page = (await client.get(f"{router.url}/metrics")).text
    assert _metric(page, "tandem_router_engine_capacity") == 2
    assert finished.count("heavy") == 12 and len(tokens) == 13  # every answer whole, nothing lost
    recalled = _metric(page, "tandem_router_recalled_total")
    if recall == "on":
        # The surplus came back to the gateway; the light request took the next slot (VTC: it has
        # been served nothing), no heavy answer queued in the engine started before it.
        assert recalled >= 4
        assert overtaken <= 2, f"{overtaken} heavy answers started before the light request"
    else:
        # The same burst left in the engine's queue: the light request waits behind it.
        assert recalled == 0
        assert overtaken >= 4, f"only {overtaken} heavy answers overtook the light request"
