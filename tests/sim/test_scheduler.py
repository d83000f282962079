"""Continuous batching (`tandem.sim.engine.scheduler` through `tandem.sim.engine.core.EngineCore`).

Pure: an `EngineCore` on the tiny profile is stepped back to back in simulated time by
`tests.sim.builders.run_to_completion` (the caller passes every timestamp, so there is no clock to
fake and nothing sleeps). Generation is greedy with EOS ignored, so every story is deterministic.
"""

from __future__ import annotations

import pytest
from tests.sim.builders import TINY, make_core, prompt, request, run_to_completion

from tandem.sim.engine.core import EngineCore
from tandem.sim.engine.requests import Status
from tandem.sim.engine.timemodel import BatchShape, step_time


def test_a_request_that_arrives_during_a_step_is_counted_waiting_only_once_a_step_left_it_waiting() -> None:
    # vLLM's engine core takes new requests between steps and counts after a step: an arrival is not
    # reported waiting at the end of the step it arrived in, nor before the next step schedules it.
    core = make_core(max_num_seqs=2)
    core.add_request(request("r0", prompt(20), max_tokens=4), now=0.0)
    plan = core.plan_step(now=0.0)
    for i in (1, 2):
        core.add_request(request(f"r{i}", prompt(20, salt=i), max_tokens=4), now=0.001)
    assert core.stats().num_waiting == 0
    finished = core.finish_step(plan, now=0.01)
    assert (finished.scheduler.num_running, finished.scheduler.num_waiting) == (1, 0)
    plan = core.plan_step(now=0.01)  # r1 joins r0; r2 is beyond max_num_seqs
    assert [s.request.request_id for s in plan.output.scheduled] == ["r0", "r1"]
    assert core.finish_step(plan, now=0.02).scheduler.num_waiting == 1


def test_no_more_than_max_num_seqs_run_at_once() -> None:
    core = make_core(max_num_seqs=2)
    for i in range(5):
        core.add_request(request(f"r{i}", prompt(20, salt=i), max_tokens=3), now=0.0)
    plan = core.plan_step(now=0.0)
    assert [s.request.request_id for s in plan.output.scheduled] == ["r0", "r1"]
    assert (core.stats().num_running, core.stats().num_waiting) == (2, 3)
    core.finish_step(plan, now=0.01)
    run = run_to_completion(core, now=0.01)
    assert max(len(step) for step in run.step_tokens) <= 2
    assert all(run.outputs[f"r{i}"][-1].finish_reason == "length" for i in range(5))


def test_a_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    core = make_core(max_num_batched_tokens=100)
    core.add_request(request("long", prompt(250), max_tokens=2), now=0.0)
    run = run_to_completion(core)
    assert [step["long"] for step in run.step_tokens] == [100, 100, 50, 1]
    assert [len(o.text_delta) > 0 for o in run.outputs["long"]] == [True, True]


def test_running_requests_decode_first_and_a_new_prompt_gets_the_rest_of_the_budget() -> None:
    core = make_core(max_num_batched_tokens=64)
    core.add_request(request("decoder", prompt(10), max_tokens=20), now=0.0)
    core.finish_step(core.plan_step(now=0.0), now=0.01)  # prefilled; now decoding
    core.add_request(request("newcomer", prompt(300, salt=1), max_tokens=1), now=0.01)
    run = run_to_completion(core, now=0.01)
    first_steps = run.step_tokens[:4]
    assert [step["decoder"] for step in first_steps] == [1, 1, 1, 1]
    assert [step["newcomer"] for step in first_steps] == [63, 63, 63, 63]


def test_the_token_budget_is_shared_across_new_prompts_in_arrival_order() -> None:
    core = make_core(max_num_batched_tokens=100)
    core.add_request(request("a", prompt(80), max_tokens=1), now=0.0)
    core.add_request(request("b", prompt(80, salt=2), max_tokens=1), now=0.0)
    plan = core.plan_step(now=0.0)
    assert {s.request.request_id: s.num_new_tokens for s in plan.output.scheduled} == {"a": 80, "b": 20}


def test_when_blocks_run_out_the_latest_admitted_request_is_preempted_and_recomputed() -> None:
    # 10 blocks of 16 tokens; each request grows to 60 + 70 = 130 tokens (9 blocks): both cannot fit.
    alone = run_to_completion(_with(make_core(num_gpu_blocks=10, max_model_len=160), "b", salt=2))
    core = make_core(num_gpu_blocks=10, max_model_len=160)
    core.add_request(request("a", prompt(60, salt=1), max_tokens=70), now=0.0)
    core.add_request(request("b", prompt(60, salt=2), max_tokens=70), now=0.0)
    run = run_to_completion(core)
    assert run.total("num_preemptions") >= 1
    assert [o.finish_reason for o in (run.outputs["a"][-1], run.outputs["b"][-1])] == ["length", "length"]
    first_preemption = next(i for i, it in enumerate(run.iterations) if it.num_preemptions)
    assert "b" not in run.step_tokens[first_preemption]  # b lost its blocks, a kept going
    assert run.text("b") == alone.text("b")  # recompute continues the very same text
    assert core.pool.usage() == 0.0


def test_a_preempted_request_goes_back_to_the_front_of_the_queue() -> None:
    core = make_core(num_gpu_blocks=10, max_model_len=160)
    core.add_request(request("a", prompt(60, salt=1), max_tokens=70), now=0.0)
    core.add_request(request("b", prompt(60, salt=2), max_tokens=70), now=0.0)
    core.add_request(request("c", prompt(60, salt=3), max_tokens=70), now=0.0)
    now = 0.0
    for _ in range(200):
        plan = core.plan_step(now=now)
        now += plan.time.total_s
        core.finish_step(plan, now=now)
        if plan.output.preempted:
            break
    victim = plan.output.preempted[0]
    assert victim.status is Status.WAITING
    assert core.scheduler.waiting[0] is victim
    assert victim.num_computed_tokens == 0 and victim.num_preemptions == 1


def test_a_repeated_prompt_hits_the_prefix_cache_in_tokens() -> None:
    core = make_core()
    shared = prompt(100)
    core.add_request(request("first", shared, max_tokens=2), now=0.0)
    run_to_completion(core)
    core.add_request(request("second", shared, max_tokens=2), now=1.0)
    run = run_to_completion(core, now=1.0)
    assert run.total("prefix_queries") == 100
    assert run.total("prefix_hits") == 96  # (100 - 1) // 16 full blocks
    assert run.step_tokens[0]["second"] == 4


def test_a_cache_salt_scopes_the_prefix_cache_to_requests_with_the_same_salt() -> None:
    core = make_core()
    shared = prompt(100)
    core.add_request(request("a", shared, max_tokens=2, cache_salt="tenant-a"), now=0.0)
    run_to_completion(core)
    hits = {}
    for name, salt in [("other-salt", "tenant-b"), ("no-salt", None), ("same-salt", "tenant-a")]:
        assert core.local_prefix_tokens(shared, cache_salt=salt) == (96 if salt == "tenant-a" else 0)
        core.add_request(request(name, shared, max_tokens=2, cache_salt=salt), now=1.0)
        hits[name] = run_to_completion(core, now=1.0).total("prefix_hits")
    assert hits == {"other-salt": 0, "no-salt": 0, "same-salt": 96}


@pytest.mark.parametrize(
    ("local_prefix", "loaded", "computed"),
    [
        pytest.param(0, 512, 88, id="nothing-local"),
        pytest.param(300, 224, 88, id="288-local"),
    ],
)
def test_pool_tokens_load_past_the_local_hit_and_only_the_rest_is_computed(
    local_prefix: int, loaded: int, computed: int
) -> None:
    core = make_core()
    full = prompt(600)
    if local_prefix:
        core.add_request(request("warm", full[:local_prefix], max_tokens=1), now=0.0)
        run_to_completion(core)
    core.add_request(request("r", full, max_tokens=1, pool_tokens=512), now=1.0)
    plan = core.plan_step(now=1.0)
    (scheduled,) = plan.output.scheduled
    assert (scheduled.num_loaded_tokens, scheduled.num_new_tokens) == (loaded, computed)
    assert (plan.output.admission.external_queries, plan.output.admission.external_hits) == (600, loaded)
    expected = step_time(
        TINY, BatchShape(num_seqs=1, new_tokens=computed, context_tokens=600, loaded_tokens=loaded)
    )
    assert plan.time == expected


def test_the_pool_never_supplies_the_whole_prompt() -> None:
    core = make_core()
    core.add_request(request("r", prompt(512), max_tokens=1, pool_tokens=512), now=0.0)
    (scheduled,) = core.plan_step(now=0.0).output.scheduled
    assert (scheduled.num_loaded_tokens, scheduled.num_new_tokens) == (511, 1)


def test_time_to_first_token_is_the_prefill_step_and_later_tokens_one_decode_step_apart() -> None:
    core = make_core()
    core.add_request(request("r", prompt(100), max_tokens=3), now=0.0)
    run = run_to_completion(core)
    prefill = step_time(TINY, BatchShape(num_seqs=1, new_tokens=100, context_tokens=100)).total_s
    second = step_time(TINY, BatchShape(num_seqs=1, new_tokens=1, context_tokens=101)).total_s
    assert run.iterations[0].ttfts_s == [pytest.approx(prefill)]
    assert run.iterations[1].itls_s == [pytest.approx(second)]
    (finished,) = run.iterations[-1].finished
    assert finished.e2e_s == pytest.approx(run.now)
    assert finished.queue_s == 0.0
    assert run.total("num_prompt_tokens") == 100 and run.total("num_generation_tokens") == 3


def test_an_aborted_request_frees_its_blocks() -> None:
    core = make_core()
    core.add_request(request("r", prompt(100), max_tokens=50), now=0.0)
    core.finish_step(core.plan_step(now=0.0), now=0.01)
    assert core.pool.usage() > 0
    stats = core.abort("r", now=0.02)
    assert stats is not None and stats.finish_reason == "abort"
    assert core.pool.usage() == 0.0 and not core.has_work()
    assert core.abort("r", now=0.03) is None


def test_a_request_beyond_the_context_is_refused() -> None:
    core = make_core(max_model_len=128)
    with pytest.raises(ValueError, match="max_model_len"):
        core.add_request(request("r", prompt(100), max_tokens=29), now=0.0)


def _with(core: EngineCore, request_id: str, *, salt: int) -> EngineCore:
    core.add_request(request(request_id, prompt(60, salt=salt), max_tokens=70), now=0.0)
    return core
