"""The KV pool adapter: real Redis I/O in LMCache's layout (`tandem.sim.engine.kvlayout`).

Chunks are named in the request's scope (`PoolScope`: its `cache_salt` and LoRA adapter; another
salt's or another adapter's chunks are other keys) and, with a pool key, keyed and tagged as Tandem's
connector writes them.
- `store(prompt, scope=)` (producer): for each full chunk whose metadata is absent, `SET <key>kv_bytes`
  then `SET <key>metadata` (sealed with the chunk's tag when keyed), in that order on one connection,
  so a reader that sees the metadata finds the bytes. Chunks already present are skipped.
- `lookup(prompt, skip_tokens, scope=)` (consumer): the longest run of consecutive chunks from chunk 0
  whose metadata exists, then GET of the chunks past the `skip_tokens` the engine holds locally,
  verifying each `kv_bytes` against its metadata (and, keyed, its tag); a missing or short value ends
  the run, and so does a chunk a keyed reader refuses (no tag, or a wrong one): counted in
  `tandem_sim_kv_pool_chunks_rejected_total{reason}`, logged and deleted (so a producer can write the
  true chunk again), and the engine computes it. Returns the tokens available, or None when the pool
  could not be asked. `read` says the same and how many of the chunks loaded another KV generation
  wrote (`PoolLayout.foreign`; `tandem_sim_kv_pool_foreign_chunks_total`).

When Redis fails (unreachable, timeouts, errors) the adapter logs once, counts the error and the
fallback, and answers "nothing" for `retry_after_s` wall seconds before trying again, so a dead pool
costs requests no waiting; the first success afterwards is logged too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from tandem.kvpool.client import POOL_ERRORS, connect
from tandem.kvpool.keys import Scope
from tandem.sim.engine.kvlayout import ChunkRef, PoolLayout
from tandem.sim.metrics import SimMetrics

__all__ = ["KVPool", "PoolRead", "connect"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoolRead:
    """What a look-up found: `tokens` of the prompt's prefix available from the pool, and how many of
    the chunks it loaded were written by another KV generation (`foreign_chunks`)."""

    tokens: int
    foreign_chunks: int = 0


class KVPool:
    """Stores and finds prompt chunks in one Redis (module docstring)."""

    def __init__(
        self,
        client: Redis,
        *,
        layout: PoolLayout,
        metrics: SimMetrics,
        retry_after_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.layout = layout
        self._metrics = metrics
        self._retry_after_s = retry_after_s
        self._monotonic = monotonic
        self._down_until: float | None = None  # wall seconds; None while healthy

    async def aclose(self) -> None:
        await self._client.aclose()

    async def store(self, prompt_token_ids: Sequence[int], *, scope: Scope = None) -> None:
        """Write the prompt's missing full chunks in `scope`; never raises for pool failures."""
        chunks = self.layout.chunks(prompt_token_ids, scope=scope)
        if not chunks:
            return
        if not self._available():
            self._metrics.pool_fallback("store")
            return
        try:
            written, nbytes = await self._store(chunks)
        except POOL_ERRORS as exc:
            self._failed("store", exc)
            return
        self._succeeded()
        self._metrics.pool_stored(written=written, skipped=len(chunks) - written, nbytes=nbytes)

    async def lookup(
        self, prompt_token_ids: Sequence[int], *, skip_tokens: int = 0, scope: Scope = None
    ) -> int | None:
        """Tokens of the prompt's prefix held by the pool in `scope` and fetched (the first
        `skip_tokens` are only checked for presence); None if the pool is unavailable."""
        found = await self.read(prompt_token_ids, skip_tokens=skip_tokens, scope=scope)
        return None if found is None else found.tokens

    async def read(
        self, prompt_token_ids: Sequence[int], *, skip_tokens: int = 0, scope: Scope = None
    ) -> PoolRead | None:
        """`lookup`, with the foreign chunks among those loaded."""
        chunks = self.layout.chunks(prompt_token_ids, scope=scope)
        if not self._available():
            self._metrics.pool_fallback("lookup")
            return None
        try:
            found, foreign = await self._lookup(chunks, skip_tokens=skip_tokens)
        except POOL_ERRORS as exc:
            self._failed("lookup", exc)
            return None
        self._succeeded()
        return PoolRead(found * self.layout.chunk_size, foreign)

    async def _store(self, chunks: list[ChunkRef]) -> tuple[int, int]:
        async with self._client.pipeline(transaction=False) as pipe:
            for chunk in chunks:
                pipe.exists(chunk.metadata_key)
            present = await pipe.execute()
        missing = [chunk for chunk, exists in zip(chunks, present, strict=True) if not exists]
        if not missing:
            return 0, 0
        nbytes = 0
        async with self._client.pipeline(transaction=False) as pipe:
            for chunk in missing:
                payload = self.layout.payload(chunk)
                metadata = self.layout.metadata(chunk, payload)
                nbytes += len(payload) + len(metadata)
                pipe.set(chunk.kv_bytes_key, payload)  # bytes first: metadata marks a complete chunk
                pipe.set(chunk.metadata_key, metadata)
            await pipe.execute()
        return len(missing), nbytes

    async def _lookup(self, chunks: list[ChunkRef], *, skip_tokens: int) -> tuple[int, int]:
        """The number of leading chunks present and (past `skip_tokens`) verified, and how many of
        those fetched another generation wrote."""
        if not chunks:
            return 0, 0
        async with self._client.pipeline(transaction=False) as pipe:
            for chunk in chunks:
                pipe.exists(chunk.metadata_key)
            present = await pipe.execute()
        run = next((i for i, exists in enumerate(present) if not exists), len(chunks))
        first_fetch = min(run, skip_tokens // self.layout.chunk_size)
        to_fetch = chunks[first_fetch:run]
        if not to_fetch:
            return run, 0
        async with self._client.pipeline(transaction=False) as pipe:
            for chunk in to_fetch:
                pipe.get(chunk.metadata_key)
                pipe.get(chunk.kv_bytes_key)
            values = await pipe.execute()
        verified, nbytes, foreign = 0, 0, 0
        for chunk, metadata, kv_bytes in zip(to_fetch, values[::2], values[1::2], strict=True):
            verdict = self.layout.check(chunk, metadata, kv_bytes)
            if verdict != "ok":
                if verdict != "incomplete":
                    await self._refuse(chunk, verdict)
                break
            verified += 1
            nbytes += len(kv_bytes) + len(metadata)
            foreign += self.layout.foreign(chunk, kv_bytes)
        self._metrics.pool_read(chunks=verified, nbytes=nbytes, foreign=foreign)
        return first_fetch + verified, foreign

    async def _refuse(self, chunk: ChunkRef, verdict: str) -> None:
        """Count, log and delete a chunk a keyed reader refused, as Tandem's connector does: it can only
        be forged, corrupted or written under another key, and deleting it lets a producer write the
        true chunk again. A failed delete is left for the next reader."""
        self._metrics.pool_rejected(verdict)
        reason = "no tag" if verdict == "untagged" else "its tag does not verify"
        logger.warning(
            "kv pool chunk refused; deleting it and recomputing",
            extra={"chunk": chunk.name, "reason": reason},
        )
        with contextlib.suppress(*POOL_ERRORS):
            await self._client.delete(chunk.metadata_key, chunk.kv_bytes_key)

    def _available(self) -> bool:
        return self._down_until is None or self._monotonic() >= self._down_until

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._metrics.pool_error(operation)
        self._metrics.pool_fallback(operation)
        if self._down_until is None:
            logger.warning(
                "kv pool unavailable; computing prompts locally until it is back",
                extra={"operation": operation, "error": f"{type(exc).__name__}: {exc}"},
            )
        self._down_until = self._monotonic() + self._retry_after_s

    def _succeeded(self) -> None:
        if self._down_until is not None:
            logger.info("kv pool reachable again")
            self._down_until = None
