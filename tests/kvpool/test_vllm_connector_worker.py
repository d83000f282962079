"""The connector's worker side turns any save or load error into a failed transfer, never an exception;
with a pool key it seals what it writes and loads only chunks whose tag verifies.

Real vLLM and torch (skipped where vLLM is not importable: only `.venv-vllm` has it), real
`WorkerSide`, real `TandemConnectorStats`, real tags (`tandem.kvpool.keys`); the connector around it
and Redis are small fakes (a dict behind a pipeline), and the KV caches are CPU tensors. The attacker
writes straight into that dict, as any client allowed to write the Redis could.
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
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from tandem.kvpool import connector_plan, connector_worker, vllm_connector  # need vLLM, skipped above
from tandem.kvpool.connector_plan import (  # noqa: E402
    ChunkLoad,
    ChunkNamer,
    ChunkSave,
    HeadGrid,
    PoolHealth,
    PoolSettings,
    RankHeads,
)
from tandem.kvpool.connector_stats import TandemConnectorStats  # noqa: E402
from tandem.kvpool.keys import (  # noqa: E402
    MAC_BYTES,
    METADATA_BYTES,
    PoolScope,
    TandemHash,
    check_chunk,
    encode_metadata,
    seal_metadata,
)

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

    def __init__(self, pool_key: bytes | None = None) -> None:
        self.store: dict[str, bytes] = {}
        self.deleted: list[tuple[str, ...]] = []
        self.redis = SimpleNamespace(
            pipeline=lambda transaction: FakePipeline(self.store), delete=self._delete
        )
        self.pool_key = pool_key
        self.scheme = TandemHash(key=pool_key)
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
        self.grid = HeadGrid(total_heads=H)
        self.mla = False

    def _delete(self, *keys: str) -> int:
        self.deleted.append(keys)
        return sum(self.store.pop(key, None) is not None for key in keys)

    def namer(self, shard: int) -> ChunkNamer:
        return ChunkNamer(model="m", world_size=self.grid.key_world_size, worker_id=shard, dtype=self.dtype)


def worker(
    shape: tuple[int, ...] = (2, BLOCKS, N, H, D), *, pool_key: bytes | None = None
) -> tuple[Any, FakeConnector]:
    connector = FakeConnector(pool_key)
    side = connector_worker.WorkerSide(connector, heads=RankHeads(stage=0, first=0, count=H, writes=True))  # type: ignore[arg-type]
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


# --------------------------------------------------------------------------- tags (a keyed pool)

KEY = bytes(range(32))
CHUNK_BLOCKS = (0, 1)
LOAD = ChunkLoad(chunk_index=0, chunk_hash=1, skip_blocks=0, block_ids=(4, 5))


def keyed_pool() -> tuple[Any, FakeConnector]:
    """A producer's chunk 1 (blocks 0 and 1 of a cache filled with a per-block pattern), sealed."""
    side, connector = worker(pool_key=KEY)
    kv = side.layers[0][0]
    for block in range(BLOCKS):
        kv[:, block] = block + 1
    side.save([connector_worker.SaveRequest(req_id="r", chunks=[ChunkSave(0, 1, CHUNK_BLOCKS)])])
    return side, connector


def load(side: Any) -> set[int]:
    side.load([connector_worker.LoadRequest(req_id="r", chunks=[LOAD])])
    return set(side.take_invalid_blocks())


def test_a_keyed_producer_seals_the_metadata_with_a_tag_that_verifies() -> None:
    _, connector = keyed_pool()
    namer = connector.namer(0)
    metadata, value = connector.store[namer.metadata(1)], connector.store[namer.kv_bytes(1)]
    assert len(metadata) == METADATA_BYTES + MAC_BYTES
    assert check_chunk(KEY, name=namer.base(1), metadata=metadata, kv_bytes=value) == "ok"


def test_a_keyed_consumer_loads_a_chunk_whose_tag_verifies() -> None:
    side, connector = keyed_pool()
    assert load(side) == set()
    kv = side.layers[0][0]
    assert torch.equal(kv[:, 4], kv[:, 0]) and torch.equal(kv[:, 5], kv[:, 1])
    assert connector.stats.data["chunks_loaded"] == 1
    assert (
        connector.stats.data["chunks_rejected_mac"] == connector.stats.data["chunks_rejected_untagged"] == 0
    )


def tamper(connector: FakeConnector, how: str) -> None:
    """What an attacker (or a fault) leaves at chunk 1's key names."""
    namer = connector.namer(0)
    metadata_key, bytes_key = namer.metadata(1), namer.kv_bytes(1)
    header, value = connector.store[metadata_key][:METADATA_BYTES], connector.store[bytes_key]
    planted = bytes(len(value))  # KV of the right size the attacker wants the engine to use
    if how == "untagged":  # an attacker without the key writes LMCache's plain 28 bytes
        connector.store[bytes_key], connector.store[metadata_key] = planted, header
    elif how == "forged":  # ... or guesses a tag
        connector.store[bytes_key], connector.store[metadata_key] = planted, header + bytes(MAC_BYTES)
    elif how == "corrupted":  # one byte of the stored KV flipped
        connector.store[bytes_key] = bytes([value[0] ^ 1]) + value[1:]
    elif how == "short":  # the tag cut short
        connector.store[metadata_key] = connector.store[metadata_key][:-1]
    elif how == "another-key":  # sealed by a writer holding another key
        connector.store[bytes_key] = planted
        connector.store[metadata_key] = seal_metadata(
            b"not the key", name=namer.base(1), metadata=header, kv_bytes=planted
        )
    elif how == "replayed":  # a valid chunk of another name copied here
        other = namer.base(2)
        connector.store[bytes_key] = planted
        connector.store[metadata_key] = seal_metadata(KEY, name=other, metadata=header, kv_bytes=planted)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("untagged", "untagged"),
        ("forged", "mac"),
        ("corrupted", "mac"),
        ("short", "mac"),
        ("another-key", "mac"),
        ("replayed", "mac"),
    ],
)
def test_a_chunk_planted_or_damaged_at_the_right_name_is_not_loaded_but_recomputed_counted_and_deleted(
    how: str, reason: str
) -> None:
    side, connector = keyed_pool()
    kv = side.layers[0][0]
    before = kv.clone()
    tamper(connector, how)
    assert load(side) == {4, 5}  # the engine recomputes these blocks
    assert torch.equal(kv, before)  # nothing of the planted bytes reached the cache
    assert connector.stats.data[f"chunks_rejected_{reason}"] == 1
    assert connector.stats.data["load_failures"] == 1
    assert connector.stats.data["chunks_loaded"] == 0
    assert side.take_failed_hashes().failed_hashes == {1}  # the scheduler stops offering it
    namer = connector.namer(0)
    assert namer.metadata(1) not in connector.store and namer.kv_bytes(1) not in connector.store


def test_a_refused_chunk_fails_the_rest_of_the_request_too() -> None:
    side, connector = worker(pool_key=KEY)
    chunks = [ChunkSave(0, 1, CHUNK_BLOCKS), ChunkSave(1, 2, (2, 3))]
    side.save([connector_worker.SaveRequest(req_id="r", chunks=chunks)])
    connector.store[connector.namer(0).metadata(1)] = encode_metadata(
        length=1, dtype="bfloat16", layers=1, tokens=1, hidden=1
    )  # chunk 1 untagged: chunk 2 follows it in the prefix, so it cannot be used either
    loads = [LOAD, ChunkLoad(chunk_index=1, chunk_hash=2, skip_blocks=0, block_ids=(6, 7))]
    side.load([connector_worker.LoadRequest(req_id="r", chunks=loads)])
    assert side.take_invalid_blocks() == {4, 5, 6, 7}
    assert connector.stats.data["chunks_rejected_untagged"] == 1
    assert connector.stats.data["load_failures"] == 2


def test_metadata_gone_between_lookup_and_load_is_a_broken_entry_not_a_rejection() -> None:
    side, connector = keyed_pool()
    del connector.store[connector.namer(0).metadata(1)]
    assert load(side) == {4, 5}
    assert (
        connector.stats.data["chunks_rejected_untagged"] == connector.stats.data["chunks_rejected_mac"] == 0
    )
    assert connector.stats.data["load_failures"] == 1


def test_an_unkeyed_pool_writes_lmcaches_28_bytes_and_reads_without_verifying() -> None:
    side, connector, _ = saved_chunk()
    assert len(connector.store[connector.namer(0).metadata(1)]) == METADATA_BYTES
    connector.store[connector.namer(0).metadata(1)] += bytes(MAC_BYTES)  # a tag nobody checks
    assert load(side) == set()
    assert connector.stats.data["chunks_loaded"] == 1


def test_the_scheduler_hashes_a_request_in_its_salt_and_adapters_scope() -> None:
    connector = FakeConnector(pool_key=KEY)
    scheduler = vllm_connector._SchedulerSide(connector)  # type: ignore[arg-type]
    chunk = connector.settings.chunk_size
    tokens = list(range(3 * chunk))

    def request(**extra: Any) -> Any:
        fields = {"prompt_token_ids": tokens, "lora_request": None, "mm_features": None, "cache_salt": None}
        return SimpleNamespace(**{**fields, **extra})

    def scope(salt: str | None = None, adapter: str | None = None) -> list[int]:
        return TandemHash(key=KEY).chunk_hashes(tokens, chunk, scope=PoolScope(salt, adapter))

    salted = scheduler._prompt(request(cache_salt="t1-a"))
    assert salted.hashes == TandemHash(key=KEY).chunk_hashes(tokens, chunk, scope="t1-a") == scope("t1-a")
    assert salted.hashes != scheduler._prompt(request()).hashes
    assert salted.hashes != scheduler._prompt(request(cache_salt="t1-b")).hashes
    sql = LoRARequest(lora_name="sql", lora_int_id=1, lora_path="/adapters/sql")
    assert scheduler._prompt(request(lora_request=sql, cache_salt="t1-a")).hashes == scope("t1-a", "sql")
    assert scheduler._prompt(request(lora_request=sql)).hashes == scope(None, "sql") != scope()
    assert scheduler._prompt(request(mm_features=[object()])).hashes == []
    assert scheduler._prompt(request(prompt_embeds=object())).hashes == []


def vllm_request(req_id: str, tokens: list[int], *, adapter: str | None = None, path: str = "/a") -> Any:
    """vLLM 0.32's own `Request`, as the scheduler hands it to the connector."""
    lora = LoRARequest(lora_name=adapter, lora_int_id=1, lora_path=f"{path}/{adapter}") if adapter else None
    return Request(req_id, tokens, SamplingParams(max_tokens=1), None, lora_request=lora, cache_salt="t1-a")


def test_an_adapters_chunks_saved_by_a_producer_are_found_under_that_adapter_only() -> None:
    """Save (producer) and look-up (consumer) on real vLLM requests: the chunks of a prompt under
    adapter `sql` are found for `sql` (whatever path the consumer loaded it from: the pool names
    adapters by `lora_name`), never for the base model or adapter `chat`."""
    side, connector = worker(pool_key=KEY)
    connector.produces, connector.consumes = True, True  # type: ignore[attr-defined]
    scheduler = vllm_connector._SchedulerSide(connector)  # type: ignore[arg-type]
    chunk = connector.settings.chunk_size
    tokens = list(range(3 * chunk))  # 3 chunks of 2 blocks
    produced = vllm_request("p", tokens, adapter="sql")
    scheduler.on_new_request(produced)
    out = SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id="p", num_computed_tokens=0, block_ids=([0, 1, 2, 3, 4, 5],))
        ],
        num_scheduled_tokens={"p": len(tokens)},
        scheduled_cached_reqs=SimpleNamespace(req_ids=[]),
    )
    side.save(scheduler.build_meta(out).saves)
    stored = sorted(k for k in connector.store if k.endswith("metadata"))
    hashes = TandemHash(key=KEY).chunk_hashes(tokens, chunk, scope=PoolScope("t1-a", "sql"))
    assert stored == sorted(connector.namer(head).metadata(h) for h in hashes for head in range(H))

    def matched(request: Any) -> int:
        return scheduler.num_new_matched_tokens(request, 0)

    found = 2 * chunk  # the last chunk is left for the engine to compute (one token must be)
    assert matched(vllm_request("c1", tokens, adapter="sql", path="/elsewhere")) == found
    assert matched(vllm_request("c2", tokens, adapter="chat")) == 0
    assert matched(vllm_request("c3", tokens)) == 0


# --------------------------------------------------------------------------- prefill TP != decode TP

#: One model's whole KV for 4 blocks, vLLM 0.32's CPU layout (B, H, N, K|V), H = 2 KV heads.
TP_BLOCKS = 4


def model_kv() -> Any:
    shape = (TP_BLOCKS, H, N, 2 * D)
    return (
        torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).to(torch.bfloat16)
    )


def engine(
    tp: int, store: dict[str, bytes], *, kv: Any, pool_key: bytes | None
) -> list[tuple[Any, FakeConnector]]:
    """The worker sides of one TP-`tp` engine's ranks (heads as vLLM shards them), sharing `store`;
    rank r's cache is its heads' slice of `kv`."""
    ranks = []
    for rank in range(tp):
        connector = FakeConnector(pool_key)
        connector.store = store
        heads = connector_plan.rank_heads(total_heads=H, tp_size=tp, tp_rank=rank)
        side = connector_worker.WorkerSide(connector, heads=heads)  # type: ignore[arg-type]
        side.register({"layer.0": kv[:, heads.first : heads.first + heads.count].clone()})
        ranks.append((side, connector))
    return ranks


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2), (1, 1), (2, 2)])
@pytest.mark.parametrize("pool_key", [None, KEY], ids=["unkeyed", "keyed"])
def test_a_decode_engine_of_another_tp_loads_exactly_its_heads_of_the_prefills_kv(
    prefill_tp: int, decode_tp: int, pool_key: bytes | None
) -> None:
    """Prefill ranks save chunk 1 (blocks 0 and 1); the consumer's scheduler finds it whole (every
    head); decode ranks load it into blocks 2 and 3: byte-exact against the prefill's pages of their
    heads, the same bytes in total and one round trip per rank whatever the two TPs."""
    store: dict[str, bytes] = {}
    prefill = engine(prefill_tp, store, kv=model_kv(), pool_key=pool_key)
    for side, _ in prefill:
        side.save([connector_worker.SaveRequest(req_id="p", chunks=[ChunkSave(0, 1, (0, 1))])])
    assert sorted(k for k in store if k.endswith("metadata")) == [
        f"m@1@{h}@1@bfloat16metadata" for h in range(H)
    ]

    consumer = FakeConnector(pool_key)
    consumer.store = store
    assert vllm_connector._SchedulerSide(consumer)._present([1]) == [True]  # type: ignore[arg-type]

    decode = engine(
        decode_tp, store, kv=torch.zeros(TP_BLOCKS, H, N, 2 * D, dtype=torch.bfloat16), pool_key=pool_key
    )
    chunk = ChunkLoad(chunk_index=0, chunk_hash=1, skip_blocks=0, block_ids=(2, 3))
    for side, connector in decode:
        trips = count_round_trips(connector)
        side.load([connector_worker.LoadRequest(req_id="d", chunks=[chunk])])
        assert side.take_invalid_blocks() == set() and trips() == 1
        heads = side.heads
        expected = model_kv()[[0, 1], heads.first : heads.first + heads.count]
        assert torch.equal(side.layers[0][0][[2, 3]], expected)
    loaded = sum(c.stats.data["bytes_loaded"] for _, c in decode)
    saved = sum(c.stats.data["bytes_saved"] for _, c in prefill)
    assert loaded == saved == model_kv()[[0, 1]].numel() * 2  # every head once, whatever the TPs


def count_round_trips(connector: FakeConnector) -> Any:
    """Count the pipelines `connector` executes from now on."""
    executed = [0]
    make = connector.redis.pipeline

    def pipeline(transaction: bool) -> Any:
        pipe = make(transaction)
        run = pipe.execute

        def execute() -> list[Any]:
            executed[0] += 1
            answers: list[Any] = run()
            return answers

        pipe.execute = execute
        return pipe

    connector.redis.pipeline = pipeline
    return lambda: executed[0]


def test_a_head_replicated_over_ranks_is_written_once_and_read_by_each() -> None:
    """TP 4 over 2 KV heads: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1 (vLLM replicates);
    only ranks 0 and 2 write, and a TP-1 reader gets both heads."""
    store: dict[str, bytes] = {}
    prefill = engine(4, store, kv=model_kv(), pool_key=KEY)
    assert [(s.heads.first, s.heads.writes) for s, _ in prefill] == [
        (0, True),
        (0, False),
        (1, True),
        (1, False),
    ]
    for side, _ in prefill:
        side.save([connector_worker.SaveRequest(req_id="p", chunks=[ChunkSave(0, 1, (0, 1))])])
    assert [c.stats.data["chunks_saved"] for _, c in prefill] == [1, 0, 1, 0]
    ((reader, _),) = engine(
        1, store, kv=torch.zeros(TP_BLOCKS, H, N, 2 * D, dtype=torch.bfloat16), pool_key=KEY
    )
    reader.load([connector_worker.LoadRequest(req_id="d", chunks=[ChunkLoad(0, 1, 0, (2, 3))])])
    assert reader.take_invalid_blocks() == set()
    assert torch.equal(reader.layers[0][0][[2, 3]], model_kv()[[0, 1]])


def test_a_chunk_missing_one_head_is_not_offered_and_a_head_gone_before_the_load_is_recomputed() -> None:
    store: dict[str, bytes] = {}
    (rank0, _), (rank1, _) = engine(2, store, kv=model_kv(), pool_key=KEY)
    rank0.save([connector_worker.SaveRequest(req_id="p", chunks=[ChunkSave(0, 1, (0, 1))])])
    consumer = FakeConnector(KEY)
    consumer.store = store
    scheduler = vllm_connector._SchedulerSide(consumer)  # type: ignore[arg-type]
    assert scheduler._present([1]) == [False]  # head 1's rank has not written yet
    rank1.save([connector_worker.SaveRequest(req_id="p", chunks=[ChunkSave(0, 1, (0, 1))])])
    assert scheduler._present([1]) == [True]
    del store[consumer.namer(1).kv_bytes(1)]
    ((reader, _),) = engine(
        1, store, kv=torch.zeros(TP_BLOCKS, H, N, 2 * D, dtype=torch.bfloat16), pool_key=KEY
    )
    reader.load([connector_worker.LoadRequest(req_id="d", chunks=[ChunkLoad(0, 1, 0, (2, 3))])])
    assert reader.take_invalid_blocks() == {2, 3}


def test_one_heads_bytes_under_another_heads_name_are_refused() -> None:
    """The tag binds the shard's name: head 0's sealed bytes copied to head 1's keys do not verify."""
    store: dict[str, bytes] = {}
    for side, _ in engine(2, store, kv=model_kv(), pool_key=KEY):
        side.save([connector_worker.SaveRequest(req_id="p", chunks=[ChunkSave(0, 1, (0, 1))])])
    namer = FakeConnector(KEY).namer
    store[namer(1).kv_bytes(1)] = store[namer(0).kv_bytes(1)]
    store[namer(1).metadata(1)] = store[namer(0).metadata(1)]
    ((reader, connector),) = engine(
        1, store, kv=torch.zeros(TP_BLOCKS, H, N, 2 * D, dtype=torch.bfloat16), pool_key=KEY
    )
    reader.load([connector_worker.LoadRequest(req_id="d", chunks=[ChunkLoad(0, 1, 0, (2, 3))])])
    assert reader.take_invalid_blocks() == {2, 3}
    assert connector.stats.data["chunks_rejected_mac"] == 1
