"""The pure logic of Tandem's vLLM KV connector (`tandem.kvpool.vllm_connector`), testable without vLLM.

- `PoolSettings`: `kv_connector_extra_config` parsed and checked.
- `ChunkNamer`: LMCache's key layout (`tandem.core.kvkeys`) for one shard of a chunk and KV dtype.
- `HeadGrid`, `rank_heads`: the grid a chunk is stored on, one shard per (pipeline stage, KV head of
  the model), whatever the tensor-parallel size; which shards a TP rank holds, and whether it writes
  them (one writer per shard: replicated KV heads and MLA's one latent are written by the first rank
  holding them).
- `prompt_chunk_hashes`: a prompt's chunk hashes in its scope (`PoolScope`: vLLM's `cache_salt` and
  the LoRA adapter's `lora_name`), keyed with the pool key when there is one; `bypasses_pool`: a
  request whose KV depends on more than its tokens, salt and adapter (images, prompt embeddings).
- Lookup arithmetic (`lookup_window`, `matched_tokens`): which chunks a consumer may load. A sync load
  must leave at least one prompt token to compute (vLLM asserts it), so at most
  `(num_tokens - 1) // chunk_size` chunks count, and only chunks past the engine's local prefix hit.
- `plan_loads`: the paged-cache blocks each loaded chunk fills (whole blocks only: CPU blocks are
  packed per ISA, so a block is moved as one unit or not at all).
- `SaveTracker`: on a producer, which full chunks of each prompt became computed in a step, across
  chunked prefill, prefix-cache hits (cached blocks are exported too) and preemption (a resumed
  request gets a fresh block list).
- `FailureMemory`: chunk hashes whose load failed recently, so a broken entry is not tried again and again.
- `PoolHealth`: after a pool failure, stop asking for `retry_after_s`, and say when an outage starts and
  ends (one log line each, not one per request).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tandem.core.engineargs import arg_value
from tandem.kvpool.engine_config import POOL_KEY_ENV
from tandem.kvpool.keys import KV_BYTES_SUFFIX, METADATA_SUFFIX, Scope, TandemHash, chunk_key

DEFAULT_CHUNK_SIZE = 256
DEFAULT_TIMEOUT_S = 2.0

_UNKEYED = TandemHash()

#: torch dtype names (`str(torch.bfloat16)` without "torch.") → LMCache's dtype strings in keys.
_LMCACHE_DTYPE = {"float16": "half", "bfloat16": "bfloat16", "float32": "float", "float64": "double"}


class ConnectorConfigError(ValueError):
    """`kv_connector_extra_config` is missing a setting or has a wrong one."""


@dataclass(frozen=True)
class PoolSettings:
    """The connector's settings (`kv_connector_extra_config`). `pool_key_env` names the variable the
    pool secret is read from (`TANDEM_KV_POOL_KEY` unless set; unset or empty there: an unkeyed pool).
    `kv_layout`: the engine's KV-layout generation (the operator's `tandem.dev/kv-layout` label), put
    in every key's scope (`PoolScope.kv_layout`) so engines of two generations share no chunk."""

    url: str
    model: str
    chunk_size: int = DEFAULT_CHUNK_SIZE
    timeout_s: float = DEFAULT_TIMEOUT_S
    password_env: str | None = None
    pool_key_env: str = POOL_KEY_ENV
    kv_layout: str | None = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object], *, default_model: str) -> PoolSettings:
        """Parse `extra`; `default_model` (vLLM's model name) is used when `model` is absent."""
        url = extra.get("url")
        if not isinstance(url, str) or not url:
            raise ConnectorConfigError("kv_connector_extra_config.url (the Redis URL) is required")
        model = extra.get("model", default_model)
        chunk_size = extra.get("chunk_size", DEFAULT_CHUNK_SIZE)
        timeout_s = extra.get("timeout_s", DEFAULT_TIMEOUT_S)
        password_env = extra.get("password_env")
        pool_key_env = extra.get("pool_key_env", POOL_KEY_ENV)
        kv_layout = extra.get("kv_layout")
        if kv_layout is not None and (not isinstance(kv_layout, str) or not kv_layout):
            raise ConnectorConfigError("kv_connector_extra_config.kv_layout must be a non-empty string")
        if not isinstance(model, str) or not model:
            raise ConnectorConfigError("kv_connector_extra_config.model must be a non-empty string")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ConnectorConfigError(
                f"kv_connector_extra_config.chunk_size must be a positive int, got {chunk_size!r}"
            )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise ConnectorConfigError(
                f"kv_connector_extra_config.timeout_s must be positive, got {timeout_s!r}"
            )
        if password_env is not None and not isinstance(password_env, str):
            raise ConnectorConfigError("kv_connector_extra_config.password_env must be a string")
        if not isinstance(pool_key_env, str) or not pool_key_env:
            raise ConnectorConfigError("kv_connector_extra_config.pool_key_env must be a non-empty string")
        return cls(
            url=url, model=model, chunk_size=chunk_size, timeout_s=float(timeout_s),
            password_env=password_env, pool_key_env=pool_key_env, kv_layout=kv_layout,
        )  # fmt: skip

    def check_block_size(self, block_size: int) -> None:
        """Chunks must be made of whole engine blocks."""
        if block_size <= 0 or self.chunk_size % block_size:
            raise ConnectorConfigError(
                f"chunk_size {self.chunk_size} must be a multiple of the engine block size {block_size} "
                f"(CPU engines use 128: pick 256, 512, ...)"
            )


def lmcache_dtype(torch_dtype_name: str) -> str:
    """`"torch.bfloat16"` or `"bfloat16"` → LMCache's dtype string (`bfloat16`, `half`, `float`, ...)."""
    name = torch_dtype_name.removeprefix("torch.")
    return _LMCACHE_DTYPE.get(name, name)


def engine_kv_dtype(engine_args: Sequence[str], model_config: Mapping[str, object] | None) -> str:
    """The dtype part of the pool's keys that vLLM started with `engine_args` writes (the connector
    names its KV cache dtype, `--kv-cache-dtype`, else the model dtype), for a reader that cannot
    ask the engine: `--kv-cache-dtype` unless `auto`, else `--dtype` unless `auto`, else the model's
    `config.json` `dtype` (or `torch_dtype`), float32 read as float16 as vLLM's `auto` does, else
    bfloat16. Example: no flags and `"torch_dtype": "bfloat16"` → `bfloat16`; `--dtype half` → `half`."""
    for flag in ("--kv-cache-dtype", "--dtype"):
        value = arg_value(engine_args, flag)
        if value is not None and value != "auto":
            return lmcache_dtype({"half": "float16", "float": "float32"}.get(value, value))
    configured = (model_config or {}).get("dtype") or (model_config or {}).get("torch_dtype")
    if isinstance(configured, str):
        name = configured.removeprefix("torch.")
        return lmcache_dtype("float16" if name == "float32" else name)
    return "bfloat16"


@dataclass(frozen=True, slots=True)
class HeadGrid:
    """The shards of a chunk: one per pipeline stage and KV head of the model (`total_heads`; 1 for MLA,
    whose one latent every rank holds whole). In LMCache's key layout, key field `world_size` is the
    pipeline stages and `worker_id` the shard, `stage * total_heads + head`: keys name heads, not
    ranks, and depend neither on the tensor-parallel size nor on the head count (a reader that knows
    only the model and its pipeline size names shard 0). Example: 8 KV heads, no PP: `m@1@0@..` to
    `m@1@7@..`, written by one TP-8 engine's 8 ranks or one TP-2 engine's 2 ranks (4 each) alike."""

    total_heads: int
    pipeline_stages: int = 1

    def __post_init__(self) -> None:
        if self.total_heads < 1 or self.pipeline_stages < 1:
            raise ConnectorConfigError(
                f"a head grid needs at least one head and stage, got {self.total_heads} and "
                f"{self.pipeline_stages}"
            )

    @property
    def shards(self) -> int:
        return self.total_heads * self.pipeline_stages

    @property
    def key_world_size(self) -> int:
        """The keys' `world_size` field: the pipeline stages."""
        return self.pipeline_stages

    def shard(self, *, stage: int, head: int) -> int:
        return stage * self.total_heads + head


@dataclass(frozen=True, slots=True)
class RankHeads:
    """The KV heads one TP rank holds: global heads `[first, first + count)` of its pipeline stage, as
    its local heads `0 .. count - 1`; `writes`: whether it stores them (the first rank of each head)."""

    stage: int
    first: int
    count: int
    writes: bool

    def shards(self, grid: HeadGrid) -> list[int]:
        """The shard of each local head, in local order."""
        return [grid.shard(stage=self.stage, head=self.first + local) for local in range(self.count)]


def rank_heads(
    *, total_heads: int, tp_size: int, tp_rank: int, stage: int = 0, mla: bool = False
) -> RankHeads:
    """Which KV heads TP rank `tp_rank` of `tp_size` holds, as vLLM 0.32 shards them
    (`QKVParallelLinear`): `total_heads / tp_size` consecutive heads each when TP divides the heads;
    when TP exceeds them, each head replicated on `tp_size / total_heads` consecutive ranks
    (`tp_rank // replicas`), written by the first. MLA: one latent, on every rank, written by rank 0.
    Examples: 8 heads, TP 2, rank 1 → heads 4..7; 2 heads, TP 4, rank 3 → head 1, not written."""
    if mla:
        return RankHeads(stage=stage, first=0, count=1, writes=tp_rank == 0)
    if tp_size <= total_heads:
        if total_heads % tp_size:
            raise ConnectorConfigError(f"{total_heads} KV heads do not split over tensor parallel {tp_size}")
        per_rank = total_heads // tp_size
        return RankHeads(stage=stage, first=tp_rank * per_rank, count=per_rank, writes=True)
    if tp_size % total_heads:
        raise ConnectorConfigError(f"tensor parallel {tp_size} is not a multiple of {total_heads} KV heads")
    replicas = tp_size // total_heads
    return RankHeads(stage=stage, first=tp_rank // replicas, count=1, writes=tp_rank % replicas == 0)


@dataclass(frozen=True)
class ChunkNamer:
    """Redis keys of one shard of a chunk (`HeadGrid`):
    `{model}@{world_size}@{worker_id}@{hash:x}@{dtype}` + suffix, with `world_size` the pipeline
    stages (`HeadGrid.key_world_size`) and `worker_id` the shard."""

    model: str
    world_size: int
    worker_id: int
    dtype: str

    def base(self, chunk_hash: int) -> str:
        return chunk_key(
            model=self.model,
            chunk_hash=chunk_hash,
            world_size=self.world_size,
            worker_id=self.worker_id,
            dtype=self.dtype,
        )

    def kv_bytes(self, chunk_hash: int) -> str:
        return self.base(chunk_hash) + KV_BYTES_SUFFIX

    def metadata(self, chunk_hash: int) -> str:
        return self.base(chunk_hash) + METADATA_SUFFIX


def prompt_chunk_hashes(
    prompt_token_ids: Sequence[int],
    chunk_size: int,
    *,
    scheme: TandemHash = _UNKEYED,
    scope: Scope = None,
) -> list[int]:
    """The chained hash of every full chunk of the prompt in `scope` (`PoolScope(cache_salt=...,
    lora_name=...)` of the request; None: the shared base scope), with `scheme` (`TandemHash(key=pool
    key)`; unkeyed by default): the same for every process and machine holding the key, whatever
    PYTHONHASHSEED is, and the same the simulator and the gateway compute for that scope."""
    return scheme.chunk_hashes(prompt_token_ids, chunk_size, scope=scope)


def bypasses_pool(*, multimodal: bool, prompt_embeds: bool) -> bool:
    """Whether a request's KV depends on more than its token ids, its salt and its LoRA adapter (images,
    prompt embeddings), which the chunk hash does not cover: such requests neither load nor save. A
    `cache_salt` or an adapter does not bypass: both scope the request's chunk hashes (`PoolScope`)."""
    return multimodal or prompt_embeds


def lookup_window(*, num_computed_tokens: int, num_tokens: int, num_chunks: int, chunk_size: int) -> range:
    """Chunk indexes worth asking the pool for: past the local hit (`num_computed_tokens`, block
    aligned), within the prompt's full chunks, and leaving at least one token to compute."""
    last = min(num_chunks, max(num_tokens - 1, 0) // chunk_size)
    first = num_computed_tokens // chunk_size
    return range(first, max(first, last))


@dataclass(frozen=True, slots=True)
class Presence:
    """What one lookup round trip found: per chunk, whether every shard's entry is whole (`metadata`
    and `kv_bytes`), and the (chunk index, shard) entries that are broken: `metadata` without
    `kv_bytes`, as after an eviction of the bytes (a producer writes the bytes first)."""

    present: list[bool]
    broken: list[tuple[int, int]]


def chunk_presence(answers: Sequence[object], *, num_chunks: int, world_size: int) -> Presence:
    """Read a pipeline of `EXISTS metadata`, `EXISTS kv_bytes` per chunk and shard (chunk-major, shard
    inner; `world_size`: the shards per chunk). Only whole entries count as present: offering a
    chunk whose bytes are gone sends the engine through vLLM's load-failure recovery, which vLLM 0.26
    with asynchronous scheduling (its CUDA default) gets wrong (docs/vllm.md)."""
    if len(answers) != 2 * num_chunks * world_size:
        raise ValueError(f"expected {2 * num_chunks * world_size} answers, got {len(answers)}")
    present: list[bool] = []
    broken: list[tuple[int, int]] = []
    for chunk in range(num_chunks):
        whole = True
        for rank in range(world_size):
            at = 2 * (chunk * world_size + rank)
            has_metadata, has_bytes = bool(answers[at]), bool(answers[at + 1])
            whole = whole and has_metadata and has_bytes
            if has_metadata and not has_bytes:
                broken.append((chunk, rank))
        present.append(whole)
    return Presence(present=present, broken=broken)


def matched_tokens(
    *, window: range, present: Sequence[bool], num_computed_tokens: int, chunk_size: int
) -> int:
    """Tokens beyond `num_computed_tokens` that the pool can supply: the run of present chunks from the
    window's start. `present[i]` says whether chunk `window[i]` is stored (for every rank)."""
    run = 0
    for is_present in present:
        if not is_present:
            break
        run += 1
    end = (window.start + run) * chunk_size
    return max(0, end - num_computed_tokens)


@dataclass(frozen=True)
class ChunkLoad:
    """One chunk to load: `block_ids` receive the chunk's blocks from index `skip_blocks` on (the
    first blocks of a chunk may already be in the engine's local prefix cache)."""

    chunk_index: int
    chunk_hash: int
    skip_blocks: int
    block_ids: tuple[int, ...]


def plan_loads(
    *,
    start_token: int,
    num_tokens: int,
    hashes: Sequence[int],
    block_ids: Sequence[int],
    chunk_size: int,
    block_size: int,
) -> list[ChunkLoad]:
    """The chunk loads covering tokens `[start_token, start_token + num_tokens)` of a request whose
    blocks (in token order) are `block_ids`. Both ends must fall on block boundaries and the end on a
    chunk boundary (the lookup only ever matches whole chunks)."""
    end = start_token + num_tokens
    if start_token % block_size or end % chunk_size or num_tokens <= 0:
        raise ValueError(f"load range [{start_token}, {end}) is not block/chunk aligned")
    per_chunk = chunk_size // block_size
    loads: list[ChunkLoad] = []
    for index in range(start_token // chunk_size, end // chunk_size):
        first_block = max(index * per_chunk, start_token // block_size)
        blocks = tuple(block_ids[first_block : (index + 1) * per_chunk])
        if len(blocks) != (index + 1) * per_chunk - first_block:
            needed = (index + 1) * per_chunk
            raise ValueError(f"chunk {index} needs blocks up to {needed}, the request has {len(block_ids)}")
        loads.append(ChunkLoad(index, hashes[index], first_block - index * per_chunk, blocks))
    return loads


@dataclass(frozen=True)
class ChunkSave:
    """One full chunk of a prompt, computed and ready to store: its hash and its blocks."""

    chunk_index: int
    chunk_hash: int
    block_ids: tuple[int, ...]


@dataclass
class _Progress:
    hashes: list[int]
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0


class SaveTracker:
    """A producer's per-request progress: which of a prompt's full chunks were handed out for saving.

    `start` when a request is first scheduled (its prompt hashes and the blocks it has, cached prefix
    included), `advance` every step it is scheduled with the blocks added and the tokens computed by
    the end of that step; each call returns the chunks that became complete. A chunk is handed out
    once; after preemption the blocks are replaced (`resumed=True`) and saving continues where it
    stopped (chunks already stored are content-addressed, so they stay valid).
    """

    def __init__(self, *, chunk_size: int, block_size: int) -> None:
        self._chunk_size = chunk_size
        self._per_chunk = chunk_size // block_size
        self._requests: dict[str, _Progress] = {}

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._requests

    def start(
        self, req_id: str, *, hashes: list[int], block_ids: Sequence[int], computed_tokens: int
    ) -> list[ChunkSave]:
        if not hashes:
            return []
        self._requests[req_id] = _Progress(hashes=hashes)
        return self.advance(req_id, new_block_ids=block_ids, computed_tokens=computed_tokens)

    def advance(
        self, req_id: str, *, new_block_ids: Sequence[int] | None, computed_tokens: int, resumed: bool = False
    ) -> list[ChunkSave]:
        progress = self._requests.get(req_id)
        if progress is None:
            return []
        if resumed:
            progress.block_ids = list(new_block_ids or ())
        elif new_block_ids:
            progress.block_ids.extend(new_block_ids)
        ready = min(computed_tokens // self._chunk_size, len(progress.hashes))
        ready = min(ready, len(progress.block_ids) // self._per_chunk)
        saves = [
            ChunkSave(
                i,
                progress.hashes[i],
                tuple(progress.block_ids[i * self._per_chunk : (i + 1) * self._per_chunk]),
            )
            for i in range(progress.saved, ready)
        ]
        progress.saved = max(progress.saved, ready)
        if progress.saved == len(progress.hashes):
            del self._requests[req_id]
        return saves

    def finish(self, req_id: str) -> None:
        self._requests.pop(req_id, None)


class FailureMemory:
    """Chunk hashes whose load failed, remembered for `ttl_s` (at most `capacity`, oldest dropped)."""

    def __init__(self, *, clock: Callable[[], float], ttl_s: float = 60.0, capacity: int = 4096) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._capacity = capacity
        self._until: OrderedDict[int, float] = OrderedDict()

    def add(self, chunk_hash: int) -> None:
        self._until.pop(chunk_hash, None)
        self._until[chunk_hash] = self._clock() + self._ttl_s
        while len(self._until) > self._capacity:
            self._until.popitem(last=False)

    def __contains__(self, chunk_hash: object) -> bool:
        until = self._until.get(chunk_hash) if isinstance(chunk_hash, int) else None
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[chunk_hash]  # type: ignore[arg-type]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)


class PoolHealth:
    """Whether to ask the pool now. After a failure the pool is skipped for `retry_after_s`;
    `failed` returns True only for the first failure of an outage and `succeeded` True only for the
    first success after one, so callers log each outage once."""

    def __init__(self, *, clock: Callable[[], float], retry_after_s: float = 1.0) -> None:
        self._clock = clock
        self._retry_after_s = retry_after_s
        self._down_until: float | None = None
        self._in_outage = False

    def usable(self) -> bool:
        return self._down_until is None or self._clock() >= self._down_until

    def failed(self) -> bool:
        self._down_until = self._clock() + self._retry_after_s
        first = not self._in_outage
        self._in_outage = True
        return first

    def succeeded(self) -> bool:
        self._down_until = None
        recovered = self._in_outage
        self._in_outage = False
        return recovered


#: The connector's counters (Prometheus `tandem_kvpool_connector_<name>_total`), in one flat dict.
COUNTER_HELP = {
    "lookups": "Consumer lookups that asked the KV pool.",
    "lookup_hit_tokens": "Prompt tokens the KV pool could supply at lookup.",
    "lookup_failures": "Lookups answered as a miss because the KV pool failed (recompute).",
    "lookup_broken": "Entries found at lookup with metadata but no bytes (evicted); deleted, recomputed.",
    "chunks_loaded": "Chunks loaded from the KV pool into the paged KV cache.",
    "bytes_loaded": "Bytes loaded from the KV pool.",
    "load_failures": "Chunk loads that failed (missing, wrong size, rejected, pool or connector error); "
    "recomputed.",
    "chunks_rejected_untagged": "Chunks a keyed reader refused because their metadata had no tag; "
    "deleted, recomputed.",
    "chunks_rejected_mac": "Chunks a keyed reader refused because their tag did not verify (forged, "
    "corrupted or written with another key); deleted, recomputed.",
    "chunks_saved": "Chunks written to the KV pool by a producer.",
    "chunks_already_stored": "Chunks a producer found already stored and did not write again.",
    "bytes_saved": "Bytes written to the KV pool.",
    "save_failures": "Chunks a producer could not write (pool or connector error).",
    "transfer_errors": "Saves and loads failed by an error of the connector (a tensor copy), not the pool.",
}


def empty_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTER_HELP, 0)
