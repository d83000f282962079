"""Learned capacity on engines that serve LoRA adapters: requests an engine holds out of its batch for
want of an adapter slot are no sign of its limit; those waiting for room are.

Pure stories over plain `EngineStats` (`tests.router.scheduling_builders`): learning follows readings,
so no clock is needed. The engine's pages are parsed from hand-written text and from a `tandem sim`
engine's own /metrics (served by uvicorn on 127.0.0.1), the series vLLM 0.32 writes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import httpx
from openai import AsyncOpenAI
from tests.router.harness import FakeClock
from tests.router.scheduling_builders import A, snapshot, stats
from tests.servers import run_uvicorn

from tandem.router.discovery.capacity import CONFIRM, DEFAULT_CAPACITY, EngineCapacity
from tandem.router.discovery.enginestats import parse_engine_metrics
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.observe.schedmetrics import EngineStateCollector
from tandem.router.scheduling.state import SchedulingState
from tandem.router.types import AdapterLoad
from tandem.sim.app import create_app as sim_app
from tandem.sim.settings import SimSettings

GAUGES = 'vllm:num_requests_running{engine="0"} 5\nvllm:num_requests_waiting{engine="0"} 3\n'


def by_reason(engine: str, capacity: float, deferred: float) -> str:
    name = "vllm:num_requests_waiting_by_reason"
    return (
        f'{name}{{engine="{engine}",model_name="m",reason="capacity"}} {capacity}\n'
        f'{name}{{engine="{engine}",model_name="m",reason="deferred"}} {deferred}\n'
    )


def test_the_deferred_count_is_read_from_vllms_waiting_reasons_and_summed_over_engines() -> None:
    assert parse_engine_metrics(GAUGES).deferred is None  # an engine without the series
    assert parse_engine_metrics(GAUGES + by_reason("0", 1, 2)).deferred == 2
    assert parse_engine_metrics(GAUGES + by_reason("0", 1, 2) + by_reason("1", 0, 3)).deferred == 5


def test_the_gateway_reports_each_engines_deferred_requests_where_the_engine_says_them() -> None:
    clock = FakeClock()
    endpoints = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=clock)
    endpoints.set_pool("decode", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"])
    endpoints.record_scrape("http://10.0.0.1:8000", replace(stats(running=5, waiting=3), deferred=2))
    endpoints.record_scrape("http://10.0.0.2:8000", stats(running=1, waiting=0))
    families = EngineStateCollector(endpoints, SchedulingState(clock=clock)).collect()
    requests = next(f for f in families if f.name == "tandem_router_endpoint_engine_requests")
    seen = {(s.labels["endpoint"], s.labels["state"]): s.value for s in requests.samples}
    assert seen == {
        ("10.0.0.1:8000", "running"): 5,
        ("10.0.0.1:8000", "waiting"): 3,
        ("10.0.0.1:8000", "deferred"): 2,
        ("10.0.0.2:8000", "running"): 1,
        ("10.0.0.2:8000", "waiting"): 0,
    }


def reading(
    active: int,
    *,
    running: int = 5,
    waiting: int = 3,
    deferred: int | None = None,
    step: int,
    preemptions: float = 0.0,
) -> Any:
    """A snapshot of engine A with `--max-loras 4` and requests for `active` adapters."""
    names = frozenset(f"a{i}" for i in range(active))
    load = AdapterLoad(running=names, waiting=names, max_loras=4)
    engine = replace(
        stats(running=running, waiting=waiting, kv_usage=0.1, tokens=float(step), preemptions=preemptions),
        adapters=load,
        deferred=deferred,
    )
    return snapshot(A, engine=engine)


def test_requests_waiting_for_an_adapter_slot_teach_no_limit() -> None:
    """`--max-loras 4` and requests for six adapters, on an engine that does not say why its requests
    wait: the requests of the two that do not fit in a batch wait however many the engine could run,
    so readings holding requests back then say nothing of C (the gateway would otherwise hold in its
    queue requests whose adapters are running). With four adapters the same readings are the engine's
    limit; a pre-emption still bounds C."""
    many = EngineCapacity(initial=DEFAULT_CAPACITY)
    assert [many.concurrency(reading(6, step=i)) for i in range(1, CONFIRM + 3)] == [DEFAULT_CAPACITY] * (
        CONFIRM + 2
    )
    assert many.concurrency(reading(6, step=20, preemptions=1.0)) == 4, (
        "its cache ran out: one below what ran"
    )
    few = EngineCapacity(initial=DEFAULT_CAPACITY)
    assert [few.concurrency(reading(4, step=i)) for i in range(1, CONFIRM + 1)][-1] == 5


def test_an_engine_that_says_which_requests_its_adapter_budget_deferred_is_read_by_the_rest() -> None:
    """vLLM 0.32 counts the requests its adapter budget held out of the batch (`deferred`): with six
    adapters active, three waiting of which two deferred, one waits for room, so the readings are its
    limit at the five it runs; three waiting, all deferred, say nothing of C."""
    for_room = EngineCapacity(initial=DEFAULT_CAPACITY)
    learned = [for_room.concurrency(reading(6, deferred=2, step=i)) for i in range(1, CONFIRM + 1)]
    assert learned[-1] == 5
    for_slots = EngineCapacity(initial=DEFAULT_CAPACITY)
    held = [for_slots.concurrency(reading(6, deferred=3, step=i)) for i in range(1, CONFIRM + 3)]
    assert held == [DEFAULT_CAPACITY] * (CONFIRM + 2)


async def test_a_simulated_engine_reports_a_request_its_adapter_budget_deferred(tmp_path: Any) -> None:
    """Two adapters' requests on an engine with `--max-loras 1`: while one runs, the other waits,
    counted deferred on the engine's page and read as such."""
    adapters = []
    for name in ("sql", "chat"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(
            '{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}'
        )
        adapters.append(f"{name}={tmp_path / name}")
    settings = SimSettings.model_validate(
        {"profile": "tiny-cpu", "served_model_name": "qwen", "time_scale": 1, "enable_lora": True,
         "max_loras": 1, "max_cpu_loras": 2, "lora_modules": adapters}
    )  # fmt: skip
    with run_uvicorn(sim_app(settings, environ={})) as url:
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            calls = [
                asyncio.create_task(
                    client.completions.create(
                        model=name, prompt="hello", max_tokens=400, extra_body={"ignore_eos": True}
                    )
                )
                for name in ("sql", "chat")
            ]
            async with httpx.AsyncClient(base_url=url) as scraper:
                seen = None
                for _ in range(200):
                    seen = parse_engine_metrics((await scraper.get("/metrics")).text)
                    if seen.running == 1 and seen.waiting == 1:
                        break
                    await asyncio.sleep(0.01)
            for call in calls:
                call.cancel()
    assert seen is not None and (seen.running, seen.waiting, seen.deferred) == (1, 1, 1)
