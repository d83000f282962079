"""The least time to first token each request of a workload could have on a simulated engine.

A bound for routers, not a prediction: request i can get its first token no sooner than the engine
computes the prompt tokens that no earlier request shared with it, alone, in steps of at most
`max_num_batched_tokens` (chunked prefill), on this time model (`timemodel.step_time`), and no sooner
than the shared tokens themselves exist:

    ready(k)  = the earliest engine second block k's KV can exist anywhere: −∞ for a warm-up prompt's
                blocks, else the end of the step in which the earliest request that has it could
                compute it (below)
    t_s       = max(ready of the prompt's first s blocks)       (t_0 = −∞)
    floor_i   = min over s of  max(0, t_s − arrival_i) + prefill(len_i − s·B tokens after s·B cached)
                for s from 0 to the longest run of full `block_size` blocks from the start of prompt i
                that some earlier request's prompt (or a warm-up prompt) also began with (vLLM's prefix
                cache keys blocks by their whole prefix), and at most len_i − 1 tokens (an engine
                always computes the last prompt token)
    prefill   = Σ over chunks of at most `max_num_batched_tokens` of step_time(1 sequence, chunk,
                context so far); a block is ready at the end of the step that computes its last token

So a request that arrives 10 ms after the first request with the same 6,000-token system prompt waits
for that prompt's prefill (or computes it again itself): its floor is about the first one's less 10 ms,
not one step of its own question. Without arrival times (`arrivals=None`) every earlier prompt counts
as computed before the next arrives: the bound of requests spaced far apart.

It assumes the best any router could do: every request goes where its shared prefix is cached, the
cache keeps everything, nothing else runs in its steps, and no network or gateway time. So a router's
TTFT percentile can sit at the floor's percentile but not below it (within the gateway's own
milliseconds). Example, the `qwen2.5-7b-h100` profile: two requests with one 2,048-token prompt, far
apart → the first 64.95 ms (docs of `timemodel`), the second one step of its last 16-token block,
6.57 ms (its weights and 2,048 tokens of context read once: memory-bound); the second 20 ms after the
first → 44.95 ms of waiting, then that step.

Pure: token ids, arrival times and a profile in, seconds out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.core.blockhash import block_keys
from tandem.sim.engine.profiles import Profile
from tandem.sim.engine.timemodel import BatchShape, step_time


def prefill_steps(
    profile: Profile, *, novel: int, cached: int, max_num_batched_tokens: int
) -> list[tuple[int, float]]:
    """The steps of one sequence alone computing `novel` tokens after `cached` ones, in chunks of at
    most `max_num_batched_tokens`: (tokens computed once the step ends, seconds since the first began)."""
    if max_num_batched_tokens < 1:
        raise ValueError("max_num_batched_tokens must be at least 1")
    steps: list[tuple[int, float]] = []
    seconds, done = 0.0, cached
    while novel > 0:
        chunk = min(novel, max_num_batched_tokens)
        done += chunk
        novel -= chunk
        seconds += step_time(profile, BatchShape(num_seqs=1, new_tokens=chunk, context_tokens=done)).total_s
        steps.append((done, seconds))
    return steps


def prefill_seconds(profile: Profile, *, novel: int, cached: int, max_num_batched_tokens: int) -> float:
    """Seconds for one sequence alone to compute `novel` tokens after `cached` ones, in steps of at
    most `max_num_batched_tokens` (module docstring)."""
    steps = prefill_steps(profile, novel=novel, cached=cached, max_num_batched_tokens=max_num_batched_tokens)
    return steps[-1][1] if steps else 0.0


def least_ttfts(
    prompts: Sequence[Sequence[int]],
    profile: Profile,
    *,
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    warm: Sequence[Sequence[int]] = (),
    arrivals: Sequence[float] | None = None,
) -> list[float]:
    """The floor of each prompt's TTFT in seconds, in the order given (module docstring); `warm`:
    prompts computed before the first (a warm-up), whose blocks count as shared; `arrivals`: each
    prompt's arrival in engine seconds (a bench workload's offsets are), None: far apart."""
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    if arrivals is not None and len(arrivals) != len(prompts):
        raise ValueError(f"{len(arrivals)} arrival times for {len(prompts)} prompts")
    ready: dict[int, float] = {}  # chained block key (`tandem.core.blockhash`) → when its KV can exist
    for tokens in warm:
        ready.update(dict.fromkeys(block_keys(tokens, block_size), -math.inf))
    floors: list[float] = []
    for i, tokens in enumerate(prompts):
        at = None if arrivals is None else arrivals[i]
        keys = block_keys(tokens, block_size)
        floor, soonest = _least(
            [ready[k] for k in keys if k in ready], len(tokens), at, profile,
            block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
        )  # fmt: skip
        floors.append(floor)
        for key, when in zip(keys, soonest, strict=True):
            ready[key] = min(ready.get(key, math.inf), when)
    return floors


def _least(
    shared: Sequence[float],
    length: int,
    at: float | None,
    profile: Profile,
    *,
    block_size: int,
    max_num_batched_tokens: int,
) -> tuple[float, list[float]]:
    """One prompt of `length` tokens whose first blocks are ready at `shared`'s times, arriving `at`
    (None: all of them ready): its floor, and the soonest each of its full blocks is ready through
    it (−∞ when `at` is None, since only the order counts then)."""
    usable = min(len(shared), (length - 1) // block_size)
    since, plans = -math.inf, [(0, -math.inf)]  # (blocks taken from the cache, when all of them are ready)
    for s in range(usable):
        since = max(since, shared[s])
        if s + 1 == usable or shared[s + 1] > since:
            plans.append((s + 1, since))
    if at is None:
        plans = plans[-1:]
    floor, soonest = math.inf, [math.inf] * (length // block_size)
    for taken, when in plans:
        wait = 0.0 if at is None else max(0.0, when - at)
        steps = prefill_steps(
            profile, novel=length - taken * block_size, cached=taken * block_size,
            max_num_batched_tokens=max_num_batched_tokens,
        )  # fmt: skip
        floor = min(floor, wait + steps[-1][1])
        if at is None:
            continue
        block = taken
        for done, seconds in steps:
            while block < len(soonest) and (block + 1) * block_size <= done:
                soonest[block] = min(soonest[block], at + wait + seconds)
                block += 1
    if at is None:
        soonest = [-math.inf] * len(soonest)
    return floor, soonest
