"""The worker side of Tandem's vLLM KV connector (`tandem.kvpool.vllm_connector`), and what the
scheduler side hands it each step.

`WorkerSide` runs in each vLLM worker: it places each layer's block axis when the caches are
registered (from the attention backend, else the tensor's shape: `tandem.kvpool.kv_layout`), writes
a step's full prompt chunks to the pool in `wait_for_save` (skipping those already stored; with a
pool key, each metadata value sealed with its tag), and reads chunks into their blocks in
`start_load_kv` (with a pool key, only chunks whose tag verifies: the metadata is read in the same
pipeline as the bytes, so verifying costs no round trip). Every error stays here: a failed save is
skipped and counted, a failed or refused load reports its blocks invalid so the engine recomputes
them (and a broken or refused entry is deleted and its hash goes back to the scheduler in
`TandemWorkerMetadata`). The connector module's
docstring has the key and byte layout.
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
from tandem.kvpool.connector_plan import ChunkLoad, ChunkNamer, ChunkSave, chunk_presence
from tandem.kvpool.keys import check_chunk, encode_metadata, seal_metadata
from tandem.kvpool.kv_layout import KVLayout, infer_layout, layout_from_backend

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


def _worker_rank() -> int:
    """This worker's index among world_size ranks (TP rank within its PP stage)."""
    from vllm.distributed.parallel_state import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    try:
        return int(
            int(get_pp_group().rank_in_group) * get_tensor_model_parallel_world_size()
            + get_tensor_model_parallel_rank()
        )
    except (AssertionError, AttributeError, RuntimeError):
        return 0


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

    def __init__(self, connector: TandemConnector) -> None:
        self.c = connector
        self.layers: list[kv_blocks.Layer] = []
        self._backend_unreadable_logged = False
        self.invalid_blocks: set[int] = set()
        self.failed_hashes: set[int] = set()
        self._namer: ChunkNamer | None = None

    @property
    def namer(self) -> ChunkNamer:
        if self._namer is None:
            self._namer = self.c.namer(_worker_rank())
        return self._namer

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Place each layer's block axis; a layout that cannot be placed stops the engine at start-up
        (`KVLayoutError`, naming the shape) rather than failing every transfer later."""
        layouts = {name: self._layout(name, kv) for name, kv in sorted(kv_caches.items())}
        self.layers = [(kv_caches[name], layout) for name, layout in layouts.items()]
        kv, layout = self.layers[0]
        logger.info(
            "TandemConnector: %d layers, KV tensor %s %s, block axis %d (read from the %s), %d B per block",
            len(self.layers), layout.shape, kv.dtype, layout.block_axis,
            "attention backend" if layout.source == "backend" else "tensor's shape", self._block_bytes(),
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

    def _block_bytes(self) -> int:
        return kv_blocks.block_bytes(self.layers)

    def _hidden(self) -> int:
        return self.layers[0][1].hidden(self.c.block_size)

    # -- save (producer)

    def save(self, saves: list[SaveRequest]) -> None:
        if not self.layers or not self.c.health.usable():
            return
        chunks = {chunk.chunk_hash: chunk for request in saves for chunk in request.chunks}
        try:
            missing = self._missing(list(chunks))
            pipe = self.c.redis.pipeline(transaction=False)
            written = 0
            for chunk_hash in missing:
                value = kv_blocks.gather(self.layers, chunks[chunk_hash].block_ids)
                pipe.set(self.namer.kv_bytes(chunk_hash), value)
                pipe.set(self.namer.metadata(chunk_hash), self._metadata(chunk_hash, value))
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

    def _missing(self, hashes: list[int]) -> list[int]:
        """The chunks not stored whole: an entry whose bytes were evicted is written again."""
        pipe = self.c.redis.pipeline(transaction=False)
        for chunk_hash in hashes:
            pipe.exists(self.namer.metadata(chunk_hash))
            pipe.exists(self.namer.kv_bytes(chunk_hash))
        found = chunk_presence(pipe.execute(), num_chunks=len(hashes), world_size=1)
        return [h for h, whole in zip(hashes, found.present, strict=True) if not whole]

    def _metadata(self, chunk_hash: int, value: bytes) -> bytes:
        """LMCache's 28-byte header for `value`, sealed with its tag when the pool is keyed."""
        header = encode_metadata(
            length=len(value),
            dtype=self.c.dtype,
            layers=len(self.layers),
            tokens=self.c.settings.chunk_size,
            hidden=self._hidden(),
        )
        if self.c.pool_key is None:
            return header
        return seal_metadata(
            self.c.pool_key, name=self.namer.base(chunk_hash), metadata=header, kv_bytes=value
        )

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
        keyed = self.c.pool_key is not None
        pipe = self.c.redis.pipeline(transaction=False)
        for chunk in request.chunks:
            pipe.get(self.namer.kv_bytes(chunk.chunk_hash))
            if keyed:  # the tag rides in the metadata: same round trip
                pipe.get(self.namer.metadata(chunk.chunk_hash))
        answers = pipe.execute()
        self.c.pool_ok()
        step = 2 if keyed else 1
        per_chunk = self.c.settings.chunk_size // self.c.block_size
        expected = self._block_bytes() * per_chunk
        for position, chunk in enumerate(request.chunks):
            raw, header = answers[step * position], answers[step * position + 1] if keyed else None
            value = self._loadable(chunk.chunk_hash, raw, header, expected=expected)
            if value is None:
                self._fail(request.chunks[position:], broken=True)
                return
            try:
                kv_blocks.scatter(
                    self.layers,
                    value,
                    chunk.block_ids,
                    blocks_per_chunk=per_chunk,
                    skip_blocks=chunk.skip_blocks,
                )
            except Exception as exc:  # noqa: BLE001 -- boundary: a tensor error; this chunk and the rest recompute
                self.c.connector_failed("load", exc)
                self._fail(request.chunks[position:], broken=False)
                return
            self.c.stats.add("chunks_loaded")
            self.c.stats.add("bytes_loaded", len(value))

    def _loadable(self, chunk_hash: int, value: object, header: object, *, expected: int) -> bytes | None:
        """The chunk's bytes when they may be loaded, else None after deleting the entry: bytes missing
        or of the wrong size (evicted, or the metadata evicted since the lookup) are broken; with a pool
        key, a chunk whose tag does not verify (`tandem.kvpool.keys.check_chunk`) is refused and counted
        (it can only be an attacker's, a corruption or a write under another key; deleting it lets a
        producer write the true chunk again)."""
        key = self.c.pool_key
        if not isinstance(value, bytes) or len(value) != expected or (key is not None and header is None):
            self._drop_broken(chunk_hash)
            return None
        if key is None:
            return value
        name = self.namer.base(chunk_hash)
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
            self.c.redis.delete(self.namer.metadata(chunk_hash), self.namer.kv_bytes(chunk_hash))
        return None

    def _drop_broken(self, chunk_hash: int) -> None:
        """Delete an entry whose bytes are missing or of the wrong size, so it is rewritten later."""
        logger.warning(
            "KV pool chunk %s is incomplete; deleting it and recomputing", self.namer.base(chunk_hash)
        )
        with contextlib.suppress(*POOL_ERRORS):
            self.c.redis.delete(self.namer.metadata(chunk_hash), self.namer.kv_bytes(chunk_hash))

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
