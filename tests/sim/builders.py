"""Small builders shared by the simulator's unit tests: engines on the tiny profile, prompts, and a
driver that steps an `EngineCore` on simulated time until its requests finish."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.core.tokenizer import encode
from tandem.sim.engine.blocks import KVEventSink
from tandem.sim.engine.core import EngineConfig, EngineCore
from tandem.sim.engine.generation import stream_seed
from tandem.sim.engine.profiles import PROFILES
from tandem.sim.engine.requests import IterationStats, NewRequest, RequestOutput, SamplingParams
from tandem.sim.engine.scheduler import SchedulerConfig

TINY = PROFILES["tiny-cpu"]


def make_core(
    *,
    num_gpu_blocks: int = 256,
    block_size: int = 16,
    max_model_len: int = 2048,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    on_kv_event: KVEventSink | None = None,
) -> EngineCore:
    config = EngineConfig(
        profile=TINY,
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
    )
    return EngineCore(config, on_kv_event=on_kv_event)


def prompt(n: int, *, salt: int = 0) -> tuple[int, ...]:
    """`n` tokens, each a three-letter word; different salts give different prompts."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for i in range(n):
        k = (i * 7919 + salt * 104_729) % 26**3
        words.append(" " + letters[k // 676] + letters[k // 26 % 26] + letters[k % 26])
    ids = tuple(encode("".join(words)))
    assert len(ids) == n  # " abc" is 4 bytes: one token per word
    return ids


def request(
    request_id: str,
    prompt_ids: tuple[int, ...],
    *,
    max_tokens: int = 8,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = True,
    pool_tokens: int | None = None,
    cache_salt: str | None = None,
) -> NewRequest:
    """A greedy request (its text depends on the prompt only)."""
    seed = stream_seed(prompt_ids, temperature=0.0, seed=None, entropy=0)
    params = SamplingParams(max_tokens=max_tokens, stream_seed=seed, stop=stop, ignore_eos=ignore_eos)
    return NewRequest(request_id, prompt_ids, params, pool_tokens, cache_salt)


@dataclass
class Run:
    """What stepping an engine to completion produced."""

    outputs: dict[str, list[RequestOutput]] = field(default_factory=dict)
    iterations: list[IterationStats] = field(default_factory=list)
    step_tokens: list[dict[str, int]] = field(default_factory=list)
    now: float = 0.0

    def text(self, request_id: str) -> str:
        return "".join(o.text_delta for o in self.outputs[request_id])

    def total(self, name: str) -> int:
        return sum(int(getattr(it, name)) for it in self.iterations)


def run_to_completion(core: EngineCore, *, now: float = 0.0, max_steps: int = 10_000) -> Run:
    """Step `core` back to back in simulated time until it is idle, recording every step."""
    run = Run(now=now)
    for _ in range(max_steps):
        if not core.has_work():
            return run
        plan = core.plan_step(now=run.now)
        run.step_tokens.append({s.request.request_id: s.num_new_tokens for s in plan.output.scheduled})
        run.now += plan.time.total_s
        result = core.finish_step(plan, now=run.now)
        run.iterations.append(result.iteration)
        for output in result.outputs:
            run.outputs.setdefault(output.request_id, []).append(output)
    raise AssertionError(f"engine still busy after {max_steps} steps")
