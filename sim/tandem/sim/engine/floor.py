"""The least time to first token each request of a workload could have on a simulated engine.

A bound for routers, not a prediction: request i can get its first token no sooner than the engine
computes the prompt tokens that no earlier request shared with it, alone, in steps of at most
`max_num_batched_tokens` (chunked prefill), on this time model (`timemodel.step_time`):

    shared_i = the longest run of full `block_size` blocks from the start of prompt i that some earlier
               request's prompt (or a warm-up prompt) also began with (vLLM's prefix cache keys
               blocks by their whole prefix)
    novel_i  = max(1, len_i − shared_i)          (an engine always computes the last prompt token)
    floor_i  = Σ over the chunks of novel_i of step_time(1 sequence, chunk tokens, context so far)

It assumes the best any router could do: every request goes where its shared prefix is cached, the
cache keeps everything, nothing else runs in its steps, and no network or gateway time. So a router's
TTFT percentile can sit at the floor's percentile but not below it (within the gateway's own
milliseconds). Example, the `qwen2.5-7b-h100` profile: two requests with one 2,048-token prompt → the
first 64.95 ms (docs of `timemodel`), the second one step of 1 token, 6.57 ms (its
weights and 2,048 tokens of context read once: memory-bound).

Pure: token ids and a profile in, seconds out.
"""

from __future__ import annotations

from collections.abc import Sequence

from tandem.core.blockhash import block_keys
from tandem.sim.engine.profiles import Profile
from tandem.sim.engine.timemodel import BatchShape, step_time


def prefill_seconds(profile: Profile, *, novel: int, cached: int, max_num_batched_tokens: int) -> float:
    """Seconds for one sequence alone to compute `novel` tokens after `cached` ones, in steps of at
    most `max_num_batched_tokens` (module docstring)."""
    if max_num_batched_tokens < 1:
        raise ValueError("max_num_batched_tokens must be at least 1")
    seconds, done = 0.0, cached
    while novel > 0:
        chunk = min(novel, max_num_batched_tokens)
        done += chunk
        novel -= chunk
        seconds += step_time(profile, BatchShape(num_seqs=1, new_tokens=chunk, context_tokens=done)).total_s
    return seconds


def least_ttfts(
    prompts: Sequence[Sequence[int]],
    profile: Profile,
    *,
    block_size: int = 16,
    max_num_batched_tokens: int = 8192,
    warm: Sequence[Sequence[int]] = (),
) -> list[float]:
    """The floor of each prompt's TTFT in seconds, in the order given (arrival order; module
    docstring); `warm`: prompts computed before the first (a warm-up), whose blocks count as shared."""
    if block_size < 1:
        raise ValueError("block_size must be at least 1")
    seen: set[int] = set()  # chained block keys (`tandem.core.blockhash`): each stands for its prefix
    for tokens in warm:
        seen.update(block_keys(tokens, block_size))
    floors: list[float] = []
    for tokens in prompts:
        keys = block_keys(tokens, block_size)
        shared = 0
        for key in keys:
            if key not in seen:
                break
            shared += block_size
        seen.update(keys)
        novel = max(1, len(tokens) - shared)
        floors.append(
            prefill_seconds(
                profile,
                novel=novel,
                cached=len(tokens) - novel,
                max_num_batched_tokens=max_num_batched_tokens,
            )
        )
    return floors
