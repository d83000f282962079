"""Continuous batching with chunked prefill and preemption by recompute, after vLLM v1's scheduler.

Each step has a budget of `max_num_batched_tokens` new tokens:
1. Running requests, oldest first, each get the tokens they still lack, capped by what is left of
   the budget: one for a decoding request, the next chunk of the prompt for one still in prefill.
   When a request cannot get the KV blocks for them, the most recently admitted running request is
   preempted (all its blocks freed, back to the *front* of the waiting queue, to be recomputed
   later) until it can, or until it is itself the one preempted.
2. If nobody was preempted, waiting requests are admitted in order while the budget lasts and fewer
   than `max_num_seqs` run. An admitted request starts from its longest locally cached prefix, then
   from what the external KV pool holds beyond it (already fetched by the shell), and computes the
   rest; at least one prompt token is always computed. Loaded tokens cost no budget.
   With LoRA (`max_loras` set), a step's batch holds at most `max_loras` distinct adapters: a waiting
   request whose adapter is not in the batch when it already has that many is skipped for this step
   (it keeps its place at the head of the queue) and later requests are still considered, as vLLM
   0.32's scheduler does; such a request is *deferred* until a step admits it.

The counts it reports (`stats`) are vLLM 0.32's: its engine core takes new requests from its input
queue only between two steps and makes its scheduler's stats at the end of a step, so a request that
arrived during a step is not counted until a step has scheduled around it. `num_waiting` is what the
last `schedule` left waiting (requests added since are not in it), and `num_deferred` how many of
those the adapter budget deferred (vLLM's `num_skipped_waiting_reqs`). Example: 2 waiting after a
step, 3 arrive before the next: 2 are reported until the next step ends.

Example (budget 8192): a 20,000-token prompt is prefilled over three steps (8192, 8192, 3616 tokens);
while it does, each running decode request still gets its one token per step first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from tandem.sim.engine.blocks import BlockPool
from tandem.sim.engine.lora import AdapterMoves, LoRARef
from tandem.sim.engine.requests import Request, SchedulerStats, Status
from tandem.sim.engine.timemodel import BatchShape


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one engine (vLLM's flags of the same names). Token counts are tokens; `max_loras`
    is None without `--enable-lora`."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_loras: int | None = None


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: `num_new_tokens` computed, reading `num_context_tokens` of KV
    (those already computed plus the new ones), after loading `num_loaded_tokens` from the pool."""

    request: Request
    num_new_tokens: int
    num_context_tokens: int
    num_loaded_tokens: int = 0


@dataclass
class AdmissionStats:
    """Prefix-cache lookups of the requests admitted in one step, in tokens."""

    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan of one step."""

    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[Request, ...]
    admitted: tuple[Request, ...]
    admission: AdmissionStats

    def adapters(self) -> list[LoRARef]:
        """The distinct adapters of the batch, in batch order."""
        seen: dict[str, LoRARef] = {}
        for item in self.scheduled:
            lora = item.request.lora
            if lora is not None:
                seen.setdefault(lora.name, lora)
        return list(seen.values())

    def batch_shape(self, moves: AdapterMoves | None = None) -> BatchShape:
        adapters = self.adapters()
        return BatchShape(
            num_seqs=len(self.scheduled),
            new_tokens=sum(s.num_new_tokens for s in self.scheduled),
            context_tokens=sum(s.num_context_tokens for s in self.scheduled),
            loaded_tokens=sum(s.num_loaded_tokens for s in self.scheduled),
            num_adapters=len(adapters),
            adapter_bytes=sum(a.nbytes for a in adapters),
            moves=moves or AdapterMoves(),
        )


class Scheduler:
    """Owns the waiting queue and the running batch; allocates through the `BlockPool`."""

    def __init__(self, config: SchedulerConfig, pool: BlockPool) -> None:
        self.config = config
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._adapter_requests: OrderedDict[str, int] = OrderedDict()  # unfinished requests per adapter
        self._unseen: set[str] = set()  # added since the last `schedule` (not yet counted as waiting)
        self._deferred: set[str] = set()  # left waiting by the adapter budget (vLLM's `deferred_waiting`)

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)
        self._unseen.add(request.request_id)
        if request.lora is not None:
            name = request.lora.name
            self._adapter_requests[name] = self._adapter_requests.get(name, 0) + 1

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def stats(self) -> SchedulerStats:
        adapters = tuple(self._adapter_requests)
        waiting = len(self.waiting) - len(self._unseen)
        return SchedulerStats(len(self.running), waiting, self.pool.usage(), adapters, len(self._deferred))

    def schedule(self) -> SchedulerOutput:
        """Plan the next step (module docstring)."""
        self._unseen.clear()
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new, preempted=preempted):
                break  # it was the last one and preempted itself; nothing after it is left
            context = request.num_computed_tokens + num_new
            scheduled.append(ScheduledRequest(request, num_new, context))
            budget -= num_new
            index += 1
        admitted: list[Request] = []
        admission = AdmissionStats()
        if not preempted:
            admitted = self._admit(budget, scheduled=scheduled, stats=admission)
        return SchedulerOutput(tuple(scheduled), tuple(preempted), tuple(admitted), admission)

    def advance(self, output: SchedulerOutput) -> list[Request]:
        """Account a finished step: the scheduled tokens are now computed. Returns the requests that
        caught up with their last token and so produce a new one (aborted ones are skipped)."""
        ready: list[Request] = []
        for item in output.scheduled:
            request = item.request
            if request.status is not Status.RUNNING:
                continue
            request.num_computed_tokens += item.num_new_tokens
            if request.num_computed_tokens >= request.num_tokens:
                ready.append(request)
        return ready

    def finish(self, request: Request) -> None:
        """Drop a request wherever it is and free its blocks."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
            self._unseen.discard(request.request_id)
            self._deferred.discard(request.request_id)
        if request.status is not Status.FINISHED and request.lora is not None:
            name = request.lora.name
            self._adapter_requests[name] -= 1
            if not self._adapter_requests[name]:
                del self._adapter_requests[name]
        request.status = Status.FINISHED
        self.pool.free(request.request_id)

    def _allocate_or_preempt(self, request: Request, num_new: int, *, preempted: list[Request]) -> bool:
        while not self.pool.allocate(
            request.request_id,
            num_tokens=request.num_computed_tokens + num_new,
            token_ids=request.token_ids,
            block_hashes=request.block_hashes,
            cache_salt=request.cache_salt,
            lora=request.lora,
        ):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.pool.free(request.request_id)
        request.status = Status.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _admit(
        self, budget: int, *, scheduled: list[ScheduledRequest], stats: AdmissionStats
    ) -> list[Request]:
        admitted: list[Request] = []
        skipped: list[Request] = []
        loras = {s.request.lora.name for s in scheduled if s.request.lora is not None}
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if self._exceeds_max_loras(request, loras):
                skipped.append(self.waiting.popleft())
                self._deferred.add(request.request_id)
                continue
            hits = self.pool.cached_prefix(request.block_hashes, num_tokens=request.num_tokens)
            local = len(hits) * self.pool.block_size
            external = _external_tokens(request, local)
            num_new = min(request.num_tokens - local - external, budget)
            if not self.pool.allocate(
                request.request_id,
                num_tokens=local + external + num_new,
                token_ids=request.token_ids,
                block_hashes=request.block_hashes,
                computed_blocks=hits,
                cache_salt=request.cache_salt,
                lora=request.lora,
            ):
                break  # the head waits for blocks; later requests wait behind it (FCFS)
            self.waiting.popleft()
            self._deferred.discard(request.request_id)
            request.status = Status.RUNNING
            request.num_computed_tokens = local + external
            self.running.append(request)
            admitted.append(request)
            if request.num_preemptions == 0:
                _record_lookup(stats, request, local=local, external=external)
            scheduled.append(ScheduledRequest(request, num_new, local + external + num_new, external))
            budget -= num_new
            if request.lora is not None:
                loras.add(request.lora.name)
        self.waiting.extendleft(reversed(skipped))
        return admitted

    def _exceeds_max_loras(self, request: Request, loras: set[str]) -> bool:
        """Whether admitting `request` would put more than `max_loras` adapters in the batch."""
        limit = self.config.max_loras
        lora = request.lora
        return limit is not None and lora is not None and lora.name not in loras and len(loras) >= limit


def _external_tokens(request: Request, local: int) -> int:
    """Tokens to load from the pool beyond the `local` cache hit; never the whole sequence.
    Example: pool holds 512 of a 600-token prompt, 256 cached locally → load 256, compute 88."""
    if request.pool_tokens is None:
        return 0
    return max(0, min(request.pool_tokens, request.num_tokens - 1) - local)


def _record_lookup(stats: AdmissionStats, request: Request, *, local: int, external: int) -> None:
    stats.prefix_queries += request.num_tokens
    stats.prefix_hits += local
    if request.pool_tokens is not None:
        stats.external_queries += request.num_tokens
        stats.external_hits += external
