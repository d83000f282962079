"""The connector's worker side turns any save or load error into a failed transfer, never an exception.

Real vLLM and torch (skipped where vLLM is not importable: only `.venv-vllm` has it), real
`WorkerSide`, real `TandemConnectorStats`; the connector around it and Redis are small fakes
(a dict behind a pipeline), and the KV caches are CPU tensors.
"""

from __future__ import annotations

import time
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

with warnings.catch_warnings():  # torch's own modules, imported by vLLM's, use deprecated torch.jit APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from tandem.kvpool import connector_worker, vllm_connector  # need vLLM, skipped above without it
from tandem.kvpool.connector_plan import ChunkLoad, ChunkNamer, ChunkSave, PoolHealth, PoolSettings  # noqa: E402
from tandem.kvpool.connector_stats import TandemConnectorStats  # noqa: E402

BLOCKS, N, H, D = 8, 16, 2, 8


class FakePipeline:
    def __init__(self, store: dict[str, bytes]) -> None:
        self.store, self.ops = store, []  # type: ignore[var-annotated]

    def exists(self, key: str) -> None:
        self.ops.append(lambda: int(key in self.store))

    def get(self, key: str) -> None:
        self.ops.append(lambda: self.store.get(key))

    def set(self, key: str, value: bytes) -> None:
        self.ops.append(lambda: self.store.__setitem__(key, value))

    def execute(self) -> list[Any]:
        return [op() for op in self.ops]


class FakeConnector:
    """What `WorkerSide` uses of `TandemConnector`, with the real failure methods."""

    connector_failed = vllm_connector.TandemConnector.connector_failed
    pool_failed = vllm_connector.TandemConnector.pool_failed
    pool_ok = vllm_connector.TandemConnector.pool_ok

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.redis = SimpleNamespace(
            pipeline=lambda transaction: FakePipeline(self.store), delete=lambda *k: 0
        )
        self.settings = PoolSettings.from_extra_config(
            {"url": "redis://x", "chunk_size": 2 * N}, default_model="m"
        )
        self.block_size = N
        self.dtype = "bfloat16"
        self.stats = TandemConnectorStats()
        self.health = PoolHealth(clock=time.monotonic)
        self._errors_logged: set[tuple[str, str]] = set()
        self.vllm_config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context={}))
        self.kv_cache_config = None

    def namer(self, worker_id: int) -> ChunkNamer:
        return ChunkNamer(model="m", world_size=1, worker_id=worker_id, dtype=self.dtype)


def worker(shape: tuple[int, ...] = (2, BLOCKS, N, H, D)) -> tuple[Any, FakeConnector]:
    connector = FakeConnector()
    side = connector_worker.WorkerSide(connector)  # type: ignore[arg-type]
    side.register({"layer.0": torch.ones(shape, dtype=torch.bfloat16)})
    return side, connector


def test_a_layout_the_backend_cannot_report_is_read_from_the_shape() -> None:
    side, _ = worker()
    assert [(layout.block_axis, layout.source) for _, layout in side.layers] == [(1, "shape")]


def test_a_tensor_error_in_a_save_is_a_counted_skipped_save() -> None:
    side, connector = worker()
    side.layers = [(torch.ones(3), side.layers[0][1])]  # a cache the layout does not fit
    side.save(
        [
            connector_worker.SaveRequest(
                req_id="r", chunks=[ChunkSave(chunk_index=0, chunk_hash=1, block_ids=(0, 1))]
            )
        ]
    )
    assert connector.stats.data["save_failures"] == 1
    assert connector.stats.data["transfer_errors"] == 1
    assert connector.store == {}


def test_a_tensor_error_in_a_load_reports_the_blocks_for_recompute() -> None:
    side, connector = worker()
    side.save(
        [
            connector_worker.SaveRequest(
                req_id="r", chunks=[ChunkSave(chunk_index=0, chunk_hash=1, block_ids=(0, 1))]
            )
        ]
    )
    assert connector.stats.data["chunks_saved"] == 1
    kv, layout = side.layers[0]
    side.layers = [(kv[:, :1], layout)]  # one block left: block id 5 is out of range
    chunk = ChunkLoad(chunk_index=0, chunk_hash=1, skip_blocks=0, block_ids=(4, 5))
    side.load([connector_worker.LoadRequest(req_id="r", chunks=[chunk])])
    assert side.take_invalid_blocks() == {4, 5}
    assert connector.stats.data["load_failures"] == 1
    assert connector.stats.data["transfer_errors"] == 1


def saved_chunk() -> tuple[Any, FakeConnector, str]:
    side, connector = worker()
    chunk = ChunkSave(chunk_index=0, chunk_hash=1, block_ids=(0, 1))
    side.save([connector_worker.SaveRequest(req_id="r", chunks=[chunk])])
    return side, connector, connector.namer(0).kv_bytes(1)


def test_a_producer_writes_again_an_entry_whose_bytes_were_evicted() -> None:
    side, connector, kv_bytes = saved_chunk()
    value = connector.store.pop(kv_bytes)
    side.save(
        [
            connector_worker.SaveRequest(
                req_id="r2", chunks=[ChunkSave(chunk_index=0, chunk_hash=1, block_ids=(0, 1))]
            )
        ]
    )
    assert connector.store[kv_bytes] == value
    assert connector.stats.data["chunks_saved"] == 2
    assert connector.stats.data["chunks_already_stored"] == 0


def test_bytes_gone_between_lookup_and_load_are_reported_for_recompute_and_the_entry_deleted() -> None:
    side, connector, kv_bytes = saved_chunk()
    deleted: list[tuple[str, ...]] = []

    def delete(*keys: str) -> int:
        deleted.append(keys)
        return 0

    connector.redis.delete = delete
    del connector.store[kv_bytes]
    chunk = ChunkLoad(chunk_index=0, chunk_hash=1, skip_blocks=0, block_ids=(4, 5))
    side.load([connector_worker.LoadRequest(req_id="r", chunks=[chunk])])
    assert side.take_invalid_blocks() == {4, 5}
    assert connector.stats.data["load_failures"] == 1
    assert connector.stats.data["transfer_errors"] == 0
    assert deleted == [(connector.namer(0).metadata(1), kv_bytes)]
