"""The worker side of Tandem's vLLM KV connector (`tandem.kvpool.vllm_connector`), and what the
scheduler side hands it each step.

`WorkerSide` runs in each vLLM worker: it places each layer's block axis when the caches are
registered (from the attention backend, else the tensor's shape: `tandem.kvpool.kv_layout`), writes
a step's full prompt chunks to the pool in `wait_for_save` (skipping those already stored; with a
pool key, each metadata value sealed with its tag), and reads chunks into their blocks in
`start_load_kv` (with a pool key, only chunks whose tag verifies: the metadata is read in the same
pipeline as the bytes, so verifying costs no round trip). A chunk is stored per KV head
(`connector_plan.HeadGrid`): a rank writes the heads it holds (`rank_heads`; one writer per head)
and reads the same heads, whatever TP the writer ran, all in one pipelined round trip per request.
Every error stays here: a failed save is skipped and counted, a failed or refused load reports its
blocks invalid so the engine recomputes them (and a broken or refused entry is deleted and its hash
goes back to the scheduler in `TandemWorkerMetadata`). The connector module's docstring has the key
and byte layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, KVConnectorWorkerMetadata
from vllm.logger import init_logger

from tandem.kvpool import kv_blocks
from tandem.kvpool.client import POOL_ERRORS
from tandem.kvpool.connector_plan import (
    ChunkLoad,
    ChunkNamer,
    ChunkSave,
    RankHeads,
    chunk_presence,
    rank_heads,
)
from tandem.kvpool.keys import check_chunk, encode_metadata, seal_metadata
from tandem.kvpool.kv_layout import KVLayout, KVLayoutError, infer_layout, layout_from_backend

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from tandem.kvpool.vllm_connector import TandemConnector

#: The connector's logger (vLLM's handler, format and level).
logger = init_logger("vllm.tandem_kvpool_connector")


# --------------------------------------------------------------------------- data passed between sides


@dataclass
class LoadRequest:
    req_id: str
    chunks: list[ChunkLoad]


@dataclass
class SaveRequest:
    req_id: str
    chunks: list[ChunkSave]


@dataclass
class TandemConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """Scheduler → workers, one per step (picklable: plain dataclasses)."""

    loads: list[LoadRequest] = field(default_factory=list)
    saves: list[SaveRequest] = field(default_factory=list)


@dataclass
class TandemWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Workers → scheduler: chunk hashes whose load failed, so lookups stop offering them."""

    failed_hashes: set[int] = field(default_factory=set)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, TandemWorkerMetadata):
            self.failed_hashes |= other.failed_hashes
        return self


def _tp_position() -> tuple[int, int, int]:
    """This worker's (pipeline stage, TP rank, TP size); (0, 0, 1) outside a distributed setup."""
    from vllm.distributed.parallel_state import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    try:
        return (
            int(get_pp_group().rank_in_group),
            int(get_tensor_model_parallel_rank()),
            int(get_tensor_model_parallel_world_size()),
        )
    except (AssertionError, AttributeError, RuntimeError):
        return 0, 0, 1


def _backend_shape(vllm_config: VllmConfig, layer_name: str) -> Callable[[int], Sequence[int]]:
    """The layer's attention backend's `get_kv_cache_shape` with its block size, KV heads and head size
    bound (layers register themselves in `static_forward_context` under the names `register_kv_caches`
    uses). Raises whatever vLLM raises when that is not there; the caller falls back on the shape."""
    layer = vllm_config.compilation_config.static_forward_context[layer_name]
    backend = layer.get_attn_backend()
    spec = layer.get_kv_cache_spec(vllm_config)
    cache_dtype = str(vllm_config.cache_config.cache_dtype)

    def shape(num_blocks: int) -> Sequence[int]:
        return tuple(
            backend.get_kv_cache_shape(
                num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size, cache_dtype_str=cache_dtype
            )
        )

    return shape


class WorkerSide:
    """Moves whole blocks between the paged KV cache and Redis; runs in each worker."""

    def __init__(self, connector: TandemConnector, *, heads: RankHeads | None = None) -> None:
        self.c = connector
        self.layers: list[kv_blocks.Layer] = []
        self._backend_unreadable_logged = False
        self.invalid_blocks: set[int] = set()
        self.failed_hashes: set[int] = set()
        self._heads = heads

    @property
    def heads(self) -> RankHeads:
        """The KV heads this rank holds (asked of vLLM's parallel state once it is up)."""
        if self._heads is None:
            stage, tp_rank, tp_size = _tp_position()
            self._heads = rank_heads(
                total_heads=self.c.grid.total_heads, tp_size=tp_size, tp_rank=tp_rank, stage=stage,
                mla=self.c.mla,
            )  # fmt: skip
        return self._heads

    def _namers(self) -> list[ChunkNamer]:
        """The key namer of each local head's shard, in local order."""
        return [self.c.namer(shard) for shard in self.heads.shards(self.c.grid)]

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Place each layer's block axis; a layout that cannot be placed stops the engine at start-up
        (`KVLayoutError`, naming the shape) rather than failing every transfer later."""
        layouts = {name: self._layout(name, kv) for name, kv in sorted(kv_caches.items())}
        self.layers = [(kv_caches[name], layout) for name, layout in layouts.items()]
        kv, layout = self.layers[0]
        heads = self.heads
        if any(layer.num_heads != heads.count for _, layer in self.layers):
            raise KVLayoutError(
                f"KV tensor of shape {layout.shape} holds {layout.num_heads} KV heads, but this rank "
                f"should hold {heads.count} of the model's {self.c.grid.total_heads}"
            )
        logger.info(
            "TandemConnector: %d layers, KV tensor %s %s, block axis %d (read from the %s), %d B per head "
            "and block; KV heads %d..%d of %d (shards %s, %s)",
            len(self.layers), layout.shape, kv.dtype, layout.block_axis,
            "attention backend" if layout.source == "backend" else "tensor's shape", self._head_block_bytes(),
            heads.first, heads.first + heads.count - 1, self.c.grid.total_heads, heads.shards(self.c.grid),
            "this rank writes them when producing" if heads.writes else "another rank writes them",
        )  # fmt: skip

    def _layout(self, layer_name: str, kv: torch.Tensor) -> KVLayout:
        shape = tuple(kv.shape)
        try:
            return layout_from_backend(shape, backend_shape=_backend_shape(self.c.vllm_config, layer_name))
        except Exception as exc:  # noqa: BLE001 -- boundary: vLLM internals, the backend's code; use the shape
            if not self._backend_unreadable_logged:
                self._backend_unreadable_logged = True
                logger.info(
                    "TandemConnector: the attention backend's KV layout for %s is not readable (%s: %s); "
                    "placing the block axis from the tensor's shape",
                    layer_name, type(exc).__name__, exc,
                )  # fmt: skip
        config = self.c.kv_cache_config
        num_blocks = int(config.num_blocks) if config is not None else None
        return infer_layout(shape, block_size=self.c.block_size, num_blocks=num_blocks)

    def _head_block_bytes(self) -> int:
        return kv_blocks.head_block_bytes(self.layers)

    def _hidden(self) -> int:
        """LMCache's metadata `hidden` of one stored head: the head size (MLA: the latent's)."""
        layout = self.layers[0][1]
        return layout.head_block_elements // (self.c.block_size * layout.kv_count)

    # -- save (producer)

    def save(self, saves: list[SaveRequest]) -> None:
        if not self.layers or not self.heads.writes or not self.c.health.usable():
            return
        chunks = {chunk.chunk_hash: chunk for request in saves for chunk in request.chunks}
        namers = self._namers()
        try:
            missing = self._missing(list(chunks), namers)
            pipe = self.c.redis.pipeline(transaction=False)
            written = 0
            local_heads = list(range(len(namers)))
            for chunk_hash in missing:
                values = kv_blocks.gather_heads(self.layers, chunks[chunk_hash].block_ids, local_heads)
                for namer, value in zip(namers, values, strict=True):
                    pipe.set(namer.kv_bytes(chunk_hash), value)
                    pipe.set(namer.metadata(chunk_hash), self._metadata(namer, chunk_hash, value))
                    written += len(value)
            if missing:
                pipe.execute()
        except POOL_ERRORS as exc:
            self.c.stats.add("save_failures", len(chunks))
            self.c.pool_failed("save", exc)
            return
        except Exception as exc:  # noqa: BLE001 -- boundary: an escaping error kills the engine; skip the save
            self.c.stats.add("save_failures", len(chunks))
            self.c.connector_failed("save", exc)
            return
        self.c.pool_ok()
        self.c.stats.add("chunks_saved", len(missing))
        self.c.stats.add("chunks_already_stored", len(chunks) - len(missing))
        self.c.stats.add("bytes_saved", written)

    def _missing(self, hashes: list[int], namers: list[ChunkNamer]) -> list[int]:
        """The chunks not stored whole for every head of this rank: an entry whose bytes were evicted
        is written again (with the rank's other heads: one chunk, one decision)."""
        pipe = self.c.redis.pipeline(transaction=False)
        for chunk_hash in hashes:
            for namer in namers:
                pipe.exists(namer.metadata(chunk_hash))
                pipe.exists(namer.kv_bytes(chunk_hash))
        found = chunk_presence(pipe.execute(), num_chunks=len(hashes), world_size=len(namers))
        return [h for h, whole in zip(hashes, found.present, strict=True) if not whole]

    def _metadata(self, namer: ChunkNamer, chunk_hash: int, value: bytes) -> bytes:
        """LMCache's 28-byte header for one head's `value`, sealed with its tag when the pool is keyed
        (the tag binds the shard's key name, so a head's bytes never pass as another head's)."""
        header = encode_metadata(
            length=len(value),
            dtype=self.c.dtype,
            layers=len(self.layers),
            tokens=self.c.settings.chunk_size,
            hidden=self._hidden(),
        )
        if self.c.pool_key is None:
            return header
        return seal_metadata(self.c.pool_key, name=namer.base(chunk_hash), metadata=header, kv_bytes=value)

    # -- load (consumer)

    def load(self, loads: list[LoadRequest]) -> None:
        for request in loads:
            try:
                self._load_request(request)
            except POOL_ERRORS as exc:
                self.c.pool_failed("load", exc)
                self._fail(request.chunks, broken=False)
            except Exception as exc:  # noqa: BLE001 -- boundary: an escaping error kills the engine; recompute
                self.c.connector_failed("load", exc)
                self._fail(request.chunks, broken=False)

    def _load_request(self, request: LoadRequest) -> None:
        """Every local head of every chunk of the request, in one pipelined round trip."""
        keyed = self.c.pool_key is not None
        namers = self._namers()
        pipe = self.c.redis.pipeline(transaction=False)
        for chunk in request.chunks:
            for namer in namers:
                pipe.get(namer.kv_bytes(chunk.chunk_hash))
                if keyed:  # the tag rides in the metadata: same round trip
                    pipe.get(namer.metadata(chunk.chunk_hash))
        answers = iter(pipe.execute())
        self.c.pool_ok()
        per_chunk = self.c.settings.chunk_size // self.c.block_size
        expected = self._head_block_bytes() * per_chunk
        for position, chunk in enumerate(request.chunks):
            values: list[bytes] = []
            for namer in namers:
                raw = next(answers)
                header = next(answers) if keyed else None
                value = self._loadable(namer, chunk.chunk_hash, raw, header, expected=expected)
                if value is None:
                    self._fail(request.chunks[position:], broken=True)
                    return
                values.append(value)
            try:
                for head, value in enumerate(values):
                    kv_blocks.scatter_head(
                        self.layers,
                        value,
                        chunk.block_ids,
                        head=head,
                        blocks_per_chunk=per_chunk,
                        skip_blocks=chunk.skip_blocks,
                    )
            except Exception as exc:  # noqa: BLE001 -- boundary: a tensor error; this chunk and the rest recompute
                self.c.connector_failed("load", exc)
                self._fail(request.chunks[position:], broken=False)
                return
            self.c.stats.add("chunks_loaded")
            self.c.stats.add("bytes_loaded", sum(len(value) for value in values))

    def _loadable(
        self, namer: ChunkNamer, chunk_hash: int, value: object, header: object, *, expected: int
    ) -> bytes | None:
        """One head's bytes when they may be loaded, else None after deleting the entry: bytes missing
        or of the wrong size (evicted, or the metadata evicted since the lookup) are broken; with a pool
        key, a chunk whose tag does not verify (`tandem.kvpool.keys.check_chunk`) is refused and counted
        (it can only be an attacker's, a corruption or a write under another key; deleting it lets a
        producer write the true chunk again)."""
        key = self.c.pool_key
        if not isinstance(value, bytes) or len(value) != expected or (key is not None and header is None):
            self._drop_broken(namer, chunk_hash)
            return None
        if key is None:
            return value
        name = namer.base(chunk_hash)
        raw = header if isinstance(header, bytes) else b""
        verdict = check_chunk(key, name=name, metadata=raw, kv_bytes=value)
        if verdict == "ok":
            return value
        self.c.stats.add(f"chunks_rejected_{verdict}")
        logger.warning(
            "KV pool chunk %s refused (%s); deleting it and recomputing",
            name, "no tag" if verdict == "untagged" else "its tag does not verify",
        )  # fmt: skip
        with contextlib.suppress(*POOL_ERRORS):
            self.c.redis.delete(namer.metadata(chunk_hash), namer.kv_bytes(chunk_hash))
        return None

    def _drop_broken(self, namer: ChunkNamer, chunk_hash: int) -> None:
        """Delete an entry whose bytes are missing or of the wrong size, so it is rewritten later."""
        logger.warning("KV pool chunk %s is incomplete; deleting it and recomputing", namer.base(chunk_hash))
        with contextlib.suppress(*POOL_ERRORS):
            self.c.redis.delete(namer.metadata(chunk_hash), namer.kv_bytes(chunk_hash))

    def _fail(self, chunks: list[ChunkLoad], *, broken: bool) -> None:
        """Report the chunks' blocks as not loaded (the engine recomputes them); a broken entry's
        hash goes back to the scheduler, which stops offering it for a while."""
        self.c.stats.add("load_failures", len(chunks))
        for chunk in chunks:
            self.invalid_blocks.update(chunk.block_ids)
        if broken and chunks:
            self.failed_hashes.add(chunks[0].chunk_hash)

    def take_invalid_blocks(self) -> set[int]:
        blocks, self.invalid_blocks = self.invalid_blocks, set()
        return blocks

    def take_failed_hashes(self) -> TandemWorkerMetadata | None:
        if not self.failed_hashes:
            return None
        meta = TandemWorkerMetadata(failed_hashes=self.failed_hashes)
        self.failed_hashes = set()
        return meta
