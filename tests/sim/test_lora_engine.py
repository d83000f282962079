"""LoRA adapters in the simulator's engine core: batching limits, adapter residency and its costs,
the adapter-scoped prefix cache and the KV events vLLM 0.32 publishes for it.

Real: the engine core, scheduler, block pool and time model on the tiny profile, stepped on
simulated time by `run_to_completion`. Nothing is faked; adapters are plain `LoRARef` values.
"""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]
import pytest
from tests.sim.builders import TINY, prompt, request, run_to_completion

from tandem.sim.engine.blocks import BlockStored, KVEvent
from tandem.sim.engine.core import EngineConfig, EngineCore
from tandem.sim.engine.lora import AdapterCache, LoRAConfig, LoRARef
from tandem.sim.engine.requests import NewRequest
from tandem.sim.engine.scheduler import SchedulerConfig
from tandem.sim.engine.timemodel import BatchShape, step_time
from tandem.sim.kvevents_wire import encode_batch


def adapter(name: str, int_id: int = 1, *, rank: int = 16) -> LoRARef:
    return LoRARef(name, int_id, f"/adapters/{name}", rank, rank * TINY.model.lora_bytes_per_rank)


def lora_core(
    *, max_loras: int = 1, max_cpu_loras: int | None = None, events: list[KVEvent] | None = None
) -> EngineCore:
    config = EngineConfig(
        profile=TINY,
        num_gpu_blocks=256,
        scheduler=SchedulerConfig(max_loras=max_loras),
        lora=LoRAConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras or max_loras),
    )
    return EngineCore(config, on_kv_event=events.append if events is not None else None)


def under(new: NewRequest, lora: LoRARef | None, *, salt: str | None = None) -> NewRequest:
    return NewRequest(new.request_id, new.prompt_token_ids, new.params, new.pool_tokens, salt, lora)


def test_a_batch_never_holds_more_adapters_than_max_loras() -> None:
    core = lora_core(max_loras=1, max_cpu_loras=2)
    a, b = adapter("a", 1), adapter("b", 2)
    for i, lora in enumerate((a, b, a)):
        core.add_request(under(request(f"r{i}", prompt(20, salt=i), max_tokens=4), lora), now=0.0)
    run = run_to_completion(core)
    names = {"r0": "a", "r1": "b", "r2": "a"}
    for step in run.step_tokens:
        assert len({names[r] for r in step}) <= 1
    # r2 (adapter a) overtakes r1 (adapter b), which waits at the head until a's batch is done
    first_step = run.step_tokens[0]
    assert set(first_step) == {"r0", "r2"}
    assert all(len(run.outputs[r]) == 4 for r in names)


def test_a_request_the_adapter_budget_leaves_waiting_is_counted_deferred() -> None:
    core = lora_core(max_loras=1, max_cpu_loras=2)
    a, b = adapter("a", 1), adapter("b", 2)
    for i, lora in enumerate((a, b, None)):
        core.add_request(under(request(f"r{i}", prompt(20, salt=i), max_tokens=4), lora), now=0.0)
    core.add_request(request("r3", prompt(20, salt=3), max_tokens=4), now=0.0)
    plan = core.plan_step(now=0.0)
    assert {s.request.request_id for s in plan.output.scheduled} == {"r0", "r2", "r3"}
    stats = core.finish_step(plan, now=plan.time.total_s).scheduler
    assert (stats.num_waiting, stats.num_deferred) == (1, 1)  # r1: b does not fit beside a
    run = run_to_completion(core, now=plan.time.total_s)
    assert len(run.outputs["r1"]) == 4 and core.stats().num_deferred == 0


def test_base_model_requests_batch_with_any_adapter() -> None:
    core = lora_core(max_loras=1)
    core.add_request(under(request("lora", prompt(20), max_tokens=2), adapter("a")), now=0.0)
    core.add_request(request("base", prompt(20, salt=1), max_tokens=2), now=0.0)
    run = run_to_completion(core)
    assert set(run.step_tokens[0]) == {"lora", "base"}


def test_the_adapter_cache_is_two_lru_tiers() -> None:
    cache = AdapterCache(LoRAConfig(max_loras=1, max_cpu_loras=2))
    a, b, c = adapter("a"), adapter("b"), adapter("c")
    assert (cache.add(a).disk_loads, cache.add(b).disk_loads) == (1, 1)
    assert cache.activate([a]).host_loads == 1
    assert cache.activate([a]).host_loads == 0  # already in its slot
    moved = cache.activate([b])
    assert (moved.disk_loads, moved.host_loads, list(cache.gpu)) == (0, 1, ["b"])
    assert cache.add(c).disk_loads == 1  # evicts the CPU tier's oldest, a
    assert list(cache.cpu) == ["b", "c"]
    moved = cache.activate([a])
    assert (moved.disk_loads, moved.host_loads) == (1, 1)
    assert cache.add(a, reload=True).disk_loads == 1  # load_inplace reads it again


def test_loads_are_charged_to_the_step_that_needs_them() -> None:
    core = lora_core(max_loras=1, max_cpu_loras=1)
    a = adapter("a")
    core.add_lora(a)
    core.add_request(under(request("r", prompt(20), max_tokens=2), a), now=0.0)
    plan = core.plan_step(now=0.0)
    assert (plan.moves.disk_loads, plan.moves.host_loads) == (1, 1)
    profile = TINY
    expected_load = a.nbytes / profile.lora_host_bandwidth + (
        a.nbytes / profile.lora_disk_bandwidth + profile.lora_disk_overhead_s
    )
    assert plan.time.lora_load_s == pytest.approx(expected_load)
    result = core.finish_step(plan, now=plan.time.total_s)
    assert (result.iteration.lora_disk_loads, result.iteration.lora_host_loads) == (1, 1)
    second = core.plan_step(now=plan.time.total_s)
    assert second.time.lora_load_s == 0.0  # resident now


def test_every_distinct_adapter_makes_a_step_slower() -> None:
    base = BatchShape(num_seqs=64, new_tokens=64, context_tokens=64_000)
    four = BatchShape(
        num_seqs=64, new_tokens=64, context_tokens=64_000, num_adapters=4, adapter_bytes=4 * 80.7e6
    )
    from tandem.sim.engine.profiles import PROFILES

    h100 = PROFILES["qwen2.5-7b-h100"]
    assert step_time(h100, base).total_s == pytest.approx(0.00763, abs=5e-5)
    assert step_time(h100, four).total_s == pytest.approx(0.00887, abs=5e-5)  # docs/sim.md's example


def test_the_same_prompt_under_base_and_two_adapters_shares_no_block() -> None:
    core = lora_core(max_loras=3)
    ids = prompt(64)
    loras = (None, adapter("a", 1), adapter("b", 2))
    for i, lora in enumerate(loras):
        core.add_request(under(request(f"first{i}", ids, max_tokens=1), lora), now=0.0)
        run_to_completion(core)
    assert {core.local_prefix_tokens(ids, lora=lora) for lora in loras} == {48}
    fresh = adapter("c", 3)
    assert core.local_prefix_tokens(ids, lora=fresh) == 0
    # the same name at another path is another adapter (vLLM 0.32 hashes the path too)
    moved = LoRARef("a", 1, "/elsewhere/a", 16, fresh.nbytes)
    assert core.local_prefix_tokens(ids, lora=moved) == 0
    core.add_request(under(request("again", ids, max_tokens=1), loras[1]), now=0.0)
    assert run_to_completion(core).total("prefix_hits") == 48


def test_kv_events_carry_the_adapter_as_vllm_0_32_does() -> None:
    events: list[KVEvent] = []
    core = lora_core(events=events)
    sql = adapter("sql", 7)
    core.add_request(under(request("s", prompt(48), max_tokens=1), sql, salt="t"), now=0.0)
    run_to_completion(core)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert len(stored) == 1
    event = stored[0]
    assert (event.lora_id, event.lora_name) == (7, "sql")
    assert event.extra_keys == (("sql", "t"), ("sql",), ("sql",))
    wire = msgpack.unpackb(encode_batch([event], ts=0.0, encoding="map"))[1][0]
    assert (wire["lora_id"], wire["lora_name"], wire["extra_keys"]) == (
        7,
        "sql",
        [["sql", "t"], ["sql"], ["sql"]],
    )
    array = msgpack.unpackb(encode_batch([event], ts=0.0, encoding="array"))[1][0]
    assert array[5:9] == [7, "GPU", "sql", [["sql", "t"], ["sql"], ["sql"]]]


def test_salted_base_model_events_keep_their_salt_only_on_the_first_block() -> None:
    events: list[KVEvent] = []
    core = lora_core(events=events)
    core.add_request(under(request("s", prompt(48), max_tokens=1), None, salt="t"), now=0.0)
    run_to_completion(core)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored[0].extra_keys == (("t",), None, None)
    assert (stored[0].lora_id, stored[0].lora_name) == (None, None)


def test_an_adapter_request_is_refused_without_enable_lora() -> None:
    config = EngineConfig(profile=TINY, num_gpu_blocks=256)
    core = EngineCore(config)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        core.add_request(under(request("r", prompt(4)), adapter("a")), now=0.0)
    with pytest.raises(ValueError, match="Use --enable-lora"):
        core.add_lora(adapter("a"))
