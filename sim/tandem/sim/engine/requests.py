"""The data that crosses the engine core's boundary, and the core's own per-request state.

Times are simulated seconds on the engine's clock; token counts are tokens.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tandem.core.kvkeys import chunk_hashes, scope_root
from tandem.sim.engine.lora import LoRARef

FinishReason = Literal["stop", "length", "abort"]
_LORA_ROOT_PERSON = b"tandem-sim-lora"


def block_root(cache_salt: str | None, lora: LoRARef | None = None) -> int:
    """The parent of a sequence's first block: `scope_root(cache_salt)` for the base model; under an
    adapter, a BLAKE2b-64 (its own personalisation, so no salt's root can equal it) of the adapter's
    name and path and the salt. vLLM 0.32 adds `("lora", name, path)` to every block's extra keys
    (`_gen_lora_extra_hash_keys`); a different first hash has the same effect through the chain: the
    same prompt under the base model and two adapters shares no block, and re-pointing a name at
    another path does not reuse the old adapter's KV."""
    if lora is None:
        return scope_root(cache_salt)
    digest = hashlib.blake2b(digest_size=8, person=_LORA_ROOT_PERSON)
    for part in (lora.name, lora.path, cache_salt or ""):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return int.from_bytes(digest.digest(), "big", signed=True)


def prompt_block_hashes(
    token_ids: Sequence[int], block_size: int, *, cache_salt: str | None, lora: LoRARef | None = None
) -> list[int]:
    """The chained hashes of every full block of `token_ids` under `cache_salt` (and `lora`,
    `block_root`).

    The chain is Tandem's unkeyed one (`tandem.core.kvkeys.chunk_hashes`) from the salt's root,
    `scope_root(cache_salt)`: no salt, `NONE_HASH` (the hashes from before salts); a salt, a root of
    its own (a personalised BLAKE2b-64 of the salt). vLLM adds the salt to the first block's extra keys
    instead; either way the salt changes the first hash and, through the chain, every later one, so
    equal prompts under different salts share no block.

    >>> prompt_block_hashes([1, 2], 2, cache_salt=None) == chunk_hashes([1, 2], 2)
    True
    >>> prompt_block_hashes([1, 2], 2, cache_salt="a") != prompt_block_hashes([1, 2], 2, cache_salt="b")
    True
    """
    return chunk_hashes(token_ids, block_size, parent=block_root(cache_salt, lora))


@dataclass(frozen=True)
class SamplingParams:
    """How a request generates. `max_tokens` is already resolved (the API layer fills in the remaining
    context when the client sent none); `stream_seed` selects the request's token stream
    (`generation.stream_seed`); EOS is suppressed for the first `min_tokens` tokens (and the first)."""

    max_tokens: int
    stream_seed: int
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass(frozen=True)
class NewRequest:
    """What the API layer submits. `pool_tokens` is the length of the prompt prefix that the external
    KV pool holds and that the shell has already fetched (None: the pool was not consulted);
    `cache_salt` (vLLM's) scopes the request's prefix cache (`prompt_block_hashes`); `lora` is the
    adapter it runs under (None: the base model), which scopes it too."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    pool_tokens: int | None = None
    cache_salt: str | None = None
    lora: LoRARef | None = None


@dataclass(frozen=True)
class RequestOutput:
    """One step's news for one request: a new token (with the text it made visible) and, on the last
    one, why it finished. `stop_reason` is the stop string that ended it, if any."""

    request_id: str
    token_id: int
    text_delta: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """The engine's mutable state for one request.

    Invariants: `token_ids` = prompt + outputs; `num_computed_tokens` <= len(token_ids);
    `block_hashes` has one chained hash per full block of `token_ids`, from `block_root(cache_salt, lora)`;
    `text` is the output text with
    EOS left out and cut before a stop string; `emitted_chars` <= len(text) chars were already sent.
    """

    request_id: str
    prompt_len: int
    params: SamplingParams
    arrival_time: float
    block_size: int
    pool_tokens: int | None
    token_ids: list[int]
    cache_salt: str | None = None
    lora: LoRARef | None = None
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    status: Status = Status.WAITING
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    text: str = ""
    emitted_chars: int = 0
    finish_reason: FinishReason | None = None

    @classmethod
    def create(cls, new: NewRequest, *, arrival_time: float, block_size: int) -> Request:
        request = cls(
            request_id=new.request_id,
            prompt_len=len(new.prompt_token_ids),
            params=new.params,
            arrival_time=arrival_time,
            block_size=block_size,
            pool_tokens=new.pool_tokens,
            token_ids=list(new.prompt_token_ids),
            cache_salt=new.cache_salt,
            lora=new.lora,
        )
        request._extend_hashes()
        return request

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_token_ids(self) -> Sequence[int]:
        return self.token_ids[self.prompt_len :]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self._extend_hashes()

    def _extend_hashes(self) -> None:
        done = len(self.block_hashes) * self.block_size
        if self.num_tokens - done >= self.block_size:
            parent = self.block_hashes[-1] if self.block_hashes else block_root(self.cache_salt, self.lora)
            self.block_hashes.extend(chunk_hashes(self.token_ids[done:], self.block_size, parent=parent))


@dataclass(frozen=True)
class FinishedStats:
    """Latencies of a finished request, in simulated seconds (vLLM's definitions)."""

    finish_reason: FinishReason
    e2e_s: float
    queue_s: float
    num_prompt_tokens: int
    num_generation_tokens: int


@dataclass
class IterationStats:
    """What one step did, for the metrics (vLLM's `IterationStats` plus the prefix-cache counters).

    Prefix-cache queries and hits are tokens, counted when a request is admitted for the first time
    (re-admissions after preemption are left out, as vLLM does); prompt tokens are counted when a
    request produces its first token."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    lora_disk_loads: int = 0
    lora_host_loads: int = 0
    ttfts_s: list[float] = field(default_factory=list)
    itls_s: list[float] = field(default_factory=list)
    finished: list[FinishedStats] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerStats:
    """The engine's state after a step: request counts and the KV-cache usage fraction in [0, 1].
    `lora_adapters` names every adapter with a waiting or running request, in the order they first
    got one (vLLM 0.32's `LoRARequestStates`). `num_waiting` counts what the last schedule left
    waiting, `num_deferred` those of them the adapter budget deferred (`tandem.sim.engine.scheduler`)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    lora_adapters: tuple[str, ...] = ()
    num_deferred: int = 0
