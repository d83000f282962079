"""The router's shared vocabulary: pools, endpoints, routes, SLOs and a token-backed request view.

Pure data; imports nothing from the web or I/O stack so scheduling policies can depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal
from urllib.parse import urlsplit

from tandem.core.blockhash import block_keys, scope_key

Pool = Literal["prefill", "decode"]
POOLS: tuple[Pool, ...] = ("prefill", "decode")


class Route(StrEnum):
    """The generation routes the gateway serves; the value is the HTTP path (also sent upstream)."""

    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine in one pool, identified by its base URL (`http://10.0.0.7:8000`, no trailing slash).

    The same engine listed in both pools is two endpoints: rotation and in-flight counts are per pool.
    `layout`: its KV layout (the `tandem.dev/kv-layout` label of its pod, or the endpoint file's), None
    when unknown; it does not take part in the identity (`kv_compatible` reads it).
    """

    pool: Pool
    url: str
    layout: str | None = field(default=None, compare=False)
    #: `host:port`, used in metric labels, logs and the `x-tandem-*-endpoint` headers (read several
    #: times per request, so split from the URL once).
    name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", endpoint_name(self.url))


def kv_compatible(prefill: str | None, decode: str | None) -> bool:
    """Whether a decode engine of layout `decode` may load KV a prefill engine of layout `prefill`
    wrote: the same layout, or either one unknown (an engine without a layout pairs with anything,
    as before layouts were known). Example: ("a1", "a1") → True; ("a1", "b2") → False; (None, "b2")
    → True."""
    return prefill is None or decode is None or prefill == decode


def endpoint_name(url: str) -> str:
    """An engine's `host:port` from its base URL: `http://10.0.0.7:8000` → `10.0.0.7:8000`."""
    return urlsplit(url).netloc


@dataclass(slots=True, kw_only=True, eq=False)
class EndpointSnapshot:
    """What the router knows about an endpoint; the input of scheduling policies.

    The registry keeps one per endpoint and updates it in place as requests start and end, failures
    come and go and scrapes arrive (building 64 copies per decision cost more than the decision).
    Read-only to everyone else; a decision reads it without awaiting, so what it sees is consistent.

    `in_flight`: upstream requests the router has open to it now (>= 0).
    `finishing`: those of them handed over (a few tokens from their end: their slot is as good as
    free and may be given to the next request; `tandem.router.pipeline.meter`), <= `in_flight`.
    `consecutive_failures`: failures since its last success.
    `in_rotation`: False while it cools down after `failure_threshold` consecutive failures, or while
    the metrics collector cannot reach it.
    `engine`: the engine's own numbers from the metrics collector (None: no good scrape yet).
    """

    endpoint: Endpoint
    in_flight: int
    consecutive_failures: int
    in_rotation: bool
    engine: EngineReading | None = None
    finishing: int = 0

    @property
    def occupied(self) -> int:
        """Slots the router holds on it: requests in flight less those handed over."""
        return self.in_flight - self.finishing


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterLoad:
    """An engine's LoRA adapters in use, from `vllm:lora_requests_info`: `running` and `waiting` (the
    names of the `running_lora_adapters` and `waiting_lora_adapters` labels; in vLLM 0.32 both name
    every adapter with a request, running or waiting) and `max_loras` (`max_lora`: most adapters in
    one batch; None if the label is missing or not a positive integer)."""

    running: frozenset[str]
    waiting: frozenset[str]
    max_loras: int | None

    @property
    def active(self) -> frozenset[str]:
        """Every adapter with a request on the engine."""
        return self.running | self.waiting


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """What one scrape of an engine's `/metrics` said (vLLM names; summed over data-parallel engines).

    `running`/`waiting`: `vllm:num_requests_running`/`_waiting`; `kv_usage`: `vllm:kv_cache_usage_perc`
    (0..1, mean over engines; None if absent); `block_size`/`num_gpu_blocks`: the labels of
    `vllm:cache_config_info` (None if absent); `tokens`: `vllm:prompt_tokens_total` +
    `vllm:generation_tokens_total`, which grow only when the engine steps (None if absent); `served`:
    `vllm:request_success_total`, the requests it has finished since it started (None if absent);
    `started`: when it started, Unix seconds (the `_created` time of that counter; None if absent);
    `preemptions`: `vllm:num_preemptions_total`, running requests it sent back to waiting because its
    KV cache ran out (None if absent); `adapters`: its LoRA adapters in use (None: no
    `vllm:lora_requests_info` series: LoRA off, or no request since the engine started); `deferred`: of
    `waiting`, those a transient constraint such as the LoRA adapter budget holds out of a batch
    (`vllm:num_requests_waiting_by_reason{reason="deferred"}`, vLLM 0.32; None if absent).
    `served` and `started` say whether an engine is new to everyone, not only to this gateway, and
    whether it restarted since the last reading.
    """

    running: int
    waiting: int
    kv_usage: float | None
    block_size: int | None
    num_gpu_blocks: int | None
    tokens: float | None = None
    served: float | None = None
    started: float | None = None
    preemptions: float | None = None
    adapters: AdapterLoad | None = None
    deferred: int | None = None

    def restarted_since(self, earlier: EngineStats, /) -> bool:
        """Whether the engine restarted between `earlier` and this reading: another start time, or
        counters that went backwards (an engine without the `_created` series). Example: served 90
        then 3 → True; started 1000.0 then 1000.0 with served 90 then 95 → False."""
        if (
            self.started is not None
            and earlier.started is not None
            and abs(self.started - earlier.started) > 1e-3
        ):
            return True
        return any(
            now is not None and before is not None and now < before
            for now, before in ((self.served, earlier.served), (self.tokens, earlier.tokens))
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineReading:
    """The last good `EngineStats` of an endpoint, when it was scraped (`scraped_at`, clock seconds),
    and whether it is `stale`: the scrapes since then failed `stale_after` times in a row. Policies
    must treat stale numbers as unknown, not as current. `sent`: how many upstream requests this
    process had begun to the engine when the scrape was recorded (None where not counted): between two
    readings, the requests sent in between are the only ones that can be waiting merely for the
    engine's next step."""

    stats: EngineStats
    scraped_at: float
    stale: bool
    sent: int | None = None

    def age_s(self, now: float) -> float:
        """Seconds since the scrape."""
        return max(0.0, now - self.scraped_at)

    @property
    def fresh(self) -> EngineStats | None:
        """`stats` unless stale."""
        return None if self.stale else self.stats


@dataclass(frozen=True, slots=True, kw_only=True)
class SLO:
    """A request's latency objectives in seconds: time to first token, time per output token."""

    ttft_s: float
    tpot_s: float


DEFAULT_SLO = SLO(ttft_s=1.0, tpot_s=0.05)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts from an engine's `usage` object (None where absent or malformed)."""

    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(slots=True, kw_only=True)
class RequestView:
    """A request with known prompt tokens, as scheduling, admission and P/D see one: what the
    gateway's own `RequestContext` provides lazily, built here from a token list (tools, tests).

    `tenant` is the fairness header's value or "default"; `priority` the band (higher first); `slo`
    the objectives; `deadline_s` the client's own TTFT deadline (None: none); `kv_loaded` whether a
    prefill succeeded (the decode engine loads the KV); `cache_salt` and `lora_name` (the LoRA
    adapter) root the prompt's block keys (`tandem.core.blockhash.scope_key`).
    """

    request_id: str
    route: Route = Route.COMPLETIONS
    tenant: str = "default"
    prompt_token_ids: tuple[int, ...] = ()
    priority: int = 0
    slo: SLO = DEFAULT_SLO
    deadline_s: float | None = None
    kv_loaded: bool = False
    cache_salt: str | None = None
    lora_name: str | None = None
    _keys: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def prompt_tokens(self) -> Sequence[int]:
        return self.prompt_token_ids

    def prompt_length(self) -> int:
        return len(self.prompt_token_ids)

    def prompt_size(self) -> int:
        return len(self.prompt_token_ids)

    def block_keys(self, block_size: int) -> Sequence[int]:
        keys = self._keys.get(block_size)
        if keys is None:
            root = scope_key(lora_name=self.lora_name, cache_salt=self.cache_salt)
            keys = self._keys[block_size] = block_keys(self.prompt_token_ids, block_size, parent=root)
        return keys
