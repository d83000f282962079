"""The engine core: scheduler + time model + generation, stepped by its caller with explicit times.

One step is two calls, so the caller can let simulated time pass in between:

    plan = core.plan_step(now=t)                    # what runs, and `plan.time.total_s`
    result = core.finish_step(plan, now=t + plan.time.total_s)   # tokens out, stats

The core never reads a clock and never sleeps: the same inputs give the same outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.core.tokenizer import EOS_TOKEN_ID, decode
from tandem.sim.engine.blocks import BlockPool, KVEventSink
from tandem.sim.engine.generation import find_stop, sample_token, stop_buffer, visible_length
from tandem.sim.engine.lora import AdapterCache, AdapterMoves, LoRAConfig, LoRARef
from tandem.sim.engine.profiles import Profile
from tandem.sim.engine.requests import (
    FinishedStats,
    FinishReason,
    IterationStats,
    NewRequest,
    Request,
    RequestOutput,
    SchedulerStats,
    prompt_block_hashes,
)
from tandem.sim.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from tandem.sim.engine.timemodel import StepTime, step_time


@dataclass(frozen=True)
class EngineConfig:
    """Everything the core needs; sizes in tokens and blocks. `lora` is None without `--enable-lora`
    (its `max_loras` must then equal `scheduler.max_loras`)."""

    profile: Profile
    num_gpu_blocks: int
    block_size: int = 16
    max_model_len: int = 2048
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoRAConfig | None = None


@dataclass(frozen=True)
class StepPlan:
    """A planned step: what runs and how long it takes (simulated seconds) from `started_at`."""

    output: SchedulerOutput
    time: StepTime
    started_at: float
    moves: AdapterMoves = field(default_factory=AdapterMoves)

    @property
    def empty(self) -> bool:
        """Nothing to run and no adapter to load."""
        return not self.output.scheduled and not self.moves


@dataclass(frozen=True)
class StepResult:
    outputs: list[RequestOutput]
    iteration: IterationStats
    scheduler: SchedulerStats


class EngineCore:
    """One simulated engine. Not thread-safe; every call is synchronous and takes no wall time."""

    def __init__(self, config: EngineConfig, *, on_kv_event: KVEventSink | None = None) -> None:
        self.config = config
        self.pool = BlockPool(
            num_blocks=config.num_gpu_blocks, block_size=config.block_size, on_event=on_kv_event
        )
        self.scheduler = Scheduler(config.scheduler, self.pool)
        self.adapters = AdapterCache(config.lora) if config.lora is not None else None
        self._pending_moves = AdapterMoves()
        self._requests: dict[str, Request] = {}

    def add_lora(self, ref: LoRARef, *, reload: bool = False, charge: bool = True) -> None:
        """vLLM's `add_lora`: read an adapter into the CPU tier (again, with `reload`). Its cost is
        charged to the next step (the engine does it between steps), unless `charge` is False (the
        adapters of `--lora-modules`, loaded before the engine serves). Raises ValueError without
        `--enable-lora`."""
        if self.adapters is None:
            raise ValueError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        moves = self.adapters.add(ref, reload=reload)
        if charge:
            self._pending_moves.add(moves)

    def add_request(self, new: NewRequest, *, now: float) -> None:
        """Queue a request that arrived at `now`. Raises ValueError for a duplicate id or a request
        that cannot fit the context (the API layer checks both first)."""
        if new.request_id in self._requests:
            raise ValueError(f"request id {new.request_id!r} is already running")
        if len(new.prompt_token_ids) + new.params.max_tokens > self.config.max_model_len:
            raise ValueError(f"request {new.request_id!r} exceeds max_model_len {self.config.max_model_len}")
        if new.lora is not None and self.adapters is None:
            raise ValueError(f"Got lora_request {new.lora.name!r} but LoRA is not enabled!")
        request = Request.create(new, arrival_time=now, block_size=self.config.block_size)
        self._requests[new.request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str, *, now: float) -> FinishedStats | None:
        """Stop a request (its client went away); None if it is unknown or already finished."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        self.scheduler.finish(request)
        return _finished_stats(request, "abort", now=now)

    def has_work(self) -> bool:
        """Requests to run, or adapter loads `add_lora` left pending (an idle engine runs them at
        once, as vLLM's engine core runs its `add_lora` between two steps, busy or not)."""
        return self.scheduler.has_work() or self.loads_pending()

    def loads_pending(self) -> bool:
        """Whether an `add_lora` read is waiting for the next step."""
        return bool(self._pending_moves)

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def local_prefix_tokens(
        self, prompt_token_ids: Sequence[int], *, cache_salt: str | None = None, lora: LoRARef | None = None
    ) -> int:
        """Tokens of this prompt the local prefix cache holds now under `cache_salt` and `lora`
        (read-only: nothing is touched); blocks cached under another scope do not count."""
        hashes = prompt_block_hashes(
            prompt_token_ids, self.config.block_size, cache_salt=cache_salt, lora=lora
        )
        hits = self.pool.cached_prefix(hashes, num_tokens=len(prompt_token_ids))
        return len(hits) * self.config.block_size

    def plan_step(self, *, now: float) -> StepPlan:
        """Schedule the next step starting at `now`: the batch, the adapter weights it must move first
        (and those `add_lora` left pending), and its duration."""
        output = self.scheduler.schedule()
        for request in output.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        moves = AdapterMoves()
        if self.adapters is not None and (output.scheduled or self.loads_pending()):
            moves, self._pending_moves = self._pending_moves, AdapterMoves()
            if output.scheduled:
                moves.add(self.adapters.activate(output.adapters()))
        return StepPlan(output, step_time(self.config.profile, output.batch_shape(moves)), now, moves)

    def finish_step(self, plan: StepPlan, *, now: float) -> StepResult:
        """Complete `plan` at `now`: every request that caught up gets one token."""
        admission = plan.output.admission
        iteration = IterationStats(
            num_preemptions=len(plan.output.preempted),
            prefix_queries=admission.prefix_queries,
            prefix_hits=admission.prefix_hits,
            external_queries=admission.external_queries,
            external_hits=admission.external_hits,
            lora_disk_loads=plan.moves.disk_loads,
            lora_host_loads=plan.moves.host_loads,
        )
        outputs = [self._next_token(r, now=now, stats=iteration) for r in self.scheduler.advance(plan.output)]
        return StepResult(outputs, iteration, self.scheduler.stats())

    def _next_token(self, request: Request, *, now: float, stats: IterationStats) -> RequestOutput:
        params = request.params
        index = request.num_output_tokens
        allow_eos = not params.ignore_eos and index >= max(1, params.min_tokens)
        token = sample_token(params.stream_seed, index, allow_eos=allow_eos)
        request.append_token(token)
        _record_token_times(request, now=now, stats=stats)
        reason: FinishReason | None = None
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            reason = "length"
        elif token == EOS_TOKEN_ID:
            reason = "stop"
        new_text = "" if token == EOS_TOKEN_ID else decode([token])
        request.text += new_text
        stop = find_stop(request.text, params.stop, new_chars=len(new_text)) if params.stop else None
        if stop is not None:
            request.text = request.text[: stop[0]]
            reason = "stop"
        visible = visible_length(
            request.text, finished=reason is not None, held_back=stop_buffer(params.stop)
        )
        delta = request.text[request.emitted_chars : visible]
        request.emitted_chars = max(request.emitted_chars, visible)
        if reason is not None:
            self._finish(request, reason, now=now, stats=stats)
        return RequestOutput(
            request_id=request.request_id,
            token_id=token,
            text_delta=delta,
            num_prompt_tokens=request.prompt_len,
            num_output_tokens=request.num_output_tokens,
            finish_reason=reason,
            stop_reason=stop[1] if stop is not None else None,
        )

    def _finish(self, request: Request, reason: FinishReason, *, now: float, stats: IterationStats) -> None:
        request.finish_reason = reason
        self.scheduler.finish(request)
        del self._requests[request.request_id]
        stats.finished.append(_finished_stats(request, reason, now=now))


def _record_token_times(request: Request, *, now: float, stats: IterationStats) -> None:
    """TTFT = first token − arrival (prompt tokens are counted then); ITL = gap since the last token."""
    if request.first_token_time is None:
        request.first_token_time = now
        stats.ttfts_s.append(now - request.arrival_time)
        stats.num_prompt_tokens += request.prompt_len
    elif request.last_token_time is not None:
        stats.itls_s.append(now - request.last_token_time)
    request.last_token_time = now
    stats.num_generation_tokens += 1


def _finished_stats(request: Request, reason: FinishReason, *, now: float) -> FinishedStats:
    scheduled = request.first_scheduled_time if request.first_scheduled_time is not None else now
    return FinishedStats(
        finish_reason=reason,
        e2e_s=now - request.arrival_time,
        queue_s=scheduled - request.arrival_time,
        num_prompt_tokens=request.prompt_len,
        num_generation_tokens=request.num_output_tokens,
    )
