"""Readiness: which of a prompt's chunks are in the KV pool (Redis, LMCache's layout).

This is the question the router's P/D barrier asks ("are this prompt's first N chunks stored?").
Keys are the writers' own (`tandem.kvpool.keys.PoolKeys`): the prompt's full `spec.kvPool.chunkSize`
chunks, chained hashes (Tandem's or LMCache's scheme), `<model>@<world_size>@0@<hash:x>@<dtype>` plus
the `metadata` suffix; a chunk exists when its metadata exists (writers store `kv_bytes` first).
Two questions, one Redis round trip each:

- `cached_prefix_tokens(prompt)`: tokens of the longest run of chunks from chunk 0 in the pool
  (`EXISTS <key>metadata <key>kv_bytes` per chunk in one pipeline: an entry whose bytes were evicted
  is not a hit, as the engines' connector does not offer it either), for the conditional P/D decision.
- `wait_for_prompt(prompt, timeout_s)`: the P/D barrier. After a prefill, wait until every full chunk
  of the prompt is in the pool (one multi-key `EXISTS` per check), polling after 5 ms, then doubling
  up to 100 ms between checks, for at most `timeout_s`. Outcomes: `ok`, `timeout`, `pool_unavailable`;
  the result also says how many chunks it waited for and how many were there at its last check
  (the gateway's self-check of its keys, `tandem.router.pd.keycheck`, reads them).

Every question takes the request's `scope` (`PoolScope`: its `cache_salt` and LoRA adapter; None: the
shared base scope), which roots the chunk hashes of Tandem's keys (`tandem.core.kvkeys.scope_root`;
LMCache's ignore it). Presence is
not proof: the index does not read tags (the engines' connector verifies them on load), so a planted
entry can at worst make the gateway wait for or count a chunk the decode engine then refuses and
recomputes.

Redis failures never raise: the answer is "unavailable" (None / `pool_unavailable`), and for
`retry_after_s` afterwards the pool is not asked at all, so a dead pool costs requests no waiting.
The client is built to fail fast (no retries, short timeouts; `tandem.kvpool.client.connect`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from tandem.kvpool.client import POOL_ERRORS, connect
from tandem.kvpool.keys import KV_BYTES_SUFFIX, METADATA_SUFFIX, PoolKeys, Scope

__all__ = ["BarrierOutcome", "BarrierResult", "KVPoolIndex", "connect"]

log = logging.getLogger(__name__)
FIRST_POLL_S = 0.005
MAX_POLL_S = 0.1

BarrierOutcome = Literal["ok", "timeout", "pool_unavailable"]


@dataclass(frozen=True, slots=True)
class BarrierResult:
    outcome: BarrierOutcome
    waited_s: float  # clock seconds spent waiting
    checks: int  # Redis round trips made
    chunks: int = 0  # the prompt's full chunks waited for
    found: int = 0  # of those, present at the last check (all of them when `ok`)


class KVPoolIndex:
    """Chunk presence in one Redis (module docstring). `clock`: monotonic seconds."""

    def __init__(
        self,
        client: Redis,
        *,
        keys: PoolKeys,
        clock: Callable[[], float],
        alternatives: Sequence[PoolKeys] = (),
        retry_after_s: float = 1.0,
    ) -> None:
        self._client = client
        self.keys = keys
        self.alternatives = tuple(alternatives)
        self.chunk_size = keys.chunk_size
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._down_until: float | None = None

    async def aclose(self) -> None:
        await self._client.aclose()

    def metadata_keys(self, prompt: Sequence[int], *, scope: Scope = None) -> list[str]:
        """The metadata key of every full chunk of `prompt` in `scope`, in order."""
        return self.keys.chunk_keys(prompt, scope=scope)

    async def cached_prefix_tokens(self, prompt: Sequence[int], *, scope: Scope = None) -> int | None:
        """Tokens of `prompt`'s leading chunks present in the pool; None when the pool is unavailable."""
        return await self.cached_prefix(self.metadata_keys(prompt, scope=scope))

    async def cached_prefix(self, keys: Sequence[str]) -> int | None:
        """`cached_prefix_tokens` for a prompt whose `metadata_keys` the caller has already (a P/D step
        that looks up and then waits hashes its prompt once)."""
        if not self._available():
            return None
        if not keys:
            return 0
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:  # both halves: an entry whose bytes were evicted is not a hit
                    pipe.exists(key, key.removesuffix(METADATA_SUFFIX) + KV_BYTES_SUFFIX)
                present = await pipe.execute()
        except POOL_ERRORS as exc:
            self._failed(exc)
            return None
        self._succeeded()
        run = next((i for i, n in enumerate(present) if n != 2), len(keys))
        return run * self.chunk_size

    async def adopt_alternative(self, prompt: Sequence[int], *, scope: Scope = None) -> PoolKeys | None:
        """The first of `alternatives` under which the pool holds any of `prompt`'s full chunks: it
        becomes `keys` for good (and the alternatives are dropped). None when none does, the prompt
        has no full chunk, or the pool did not answer. One EXISTS per alternative."""
        if not self._available():
            return None
        for candidate in self.alternatives:
            names = candidate.chunk_keys(prompt, scope=scope)
            if not names:
                return None
            try:
                found = await self._client.exists(*names)
            except POOL_ERRORS as exc:
                self._failed(exc)
                return None
            self._succeeded()
            if found:
                self.keys, self.alternatives = candidate, ()
                return candidate
        return None

    async def wait_for_prompt(
        self, prompt: Sequence[int], *, timeout_s: float, scope: Scope = None
    ) -> BarrierResult:
        """Wait until every full chunk of `prompt` (in `scope`) is in the pool (module docstring)."""
        return await self.wait_for_keys(self.metadata_keys(prompt, scope=scope), timeout_s=timeout_s)

    async def wait_for_keys(self, keys: Sequence[str], *, timeout_s: float) -> BarrierResult:
        """`wait_for_prompt` for a prompt whose `metadata_keys` the caller has already."""
        started = self._clock()
        if not keys:
            return BarrierResult("ok", 0.0, 0)
        chunks = len(keys)
        if not self._available():
            return BarrierResult("pool_unavailable", 0.0, 0, chunks)
        checks, found, delay = 0, 0, FIRST_POLL_S
        # The deadline is checked between polls, never by cancelling a command in flight: a Redis
        # command cancelled mid-read can leave the client's connection unusable, and the next command
        # or `aclose` then waits forever. Each poll is bounded by the client's own socket timeout.
        loop = asyncio.get_running_loop()  # the deadline in the loop's time, as asyncio.timeout keeps it
        deadline = loop.time() + timeout_s
        try:
            while True:
                checks += 1
                found = await self._client.exists(*keys)
                if found == chunks:
                    self._succeeded()
                    return BarrierResult("ok", self._clock() - started, checks, chunks, found)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._succeeded()  # Redis answered every check; the chunks just did not arrive
                    return BarrierResult("timeout", self._clock() - started, checks, chunks, found)
                await asyncio.sleep(min(delay, remaining))
                delay = min(MAX_POLL_S, delay * 2)
        except POOL_ERRORS as exc:
            self._failed(exc)
            return BarrierResult("pool_unavailable", self._clock() - started, checks, chunks, found)

    def _available(self) -> bool:
        return self._down_until is None or self._clock() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        if self._down_until is None:
            log.warning(
                "kv pool unavailable; readiness answers 'unavailable' (P/D falls back to decode-only)",
                extra={"error": repr(exc)},
            )
        self._down_until = self._clock() + self._retry_after_s

    def _succeeded(self) -> None:
        if self._down_until is not None:
            log.info("kv pool reachable again")
            self._down_until = None
