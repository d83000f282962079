"""Tuning knobs of one gateway process, validated once at start-up.

These are properties of the router process, not of the InferenceService, so they are not in
`RouterConfig`: `tandem router` sets them from flags and tests pass them to `create_app`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RotationSettings(_Settings):
    """Passive health: an endpoint that fails `failure_threshold` times in a row leaves rotation for
    `cooldown_seconds`, then gets traffic again; its next failure takes it out again at once."""

    failure_threshold: int = Field(default=3, ge=1, le=1000)
    cooldown_seconds: float = Field(default=10.0, gt=0, le=3600)


class ProxySettings(_Settings):
    """Upstream HTTP behaviour. Timeouts in seconds; `read_timeout_seconds` is the longest silence
    allowed between two bytes of an engine's response (a non-streaming generation is one silence)."""

    connect_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    read_timeout_seconds: float = Field(default=600.0, gt=0, le=86_400)
    retries: int = Field(default=1, ge=0, le=5, description="Other endpoints tried before the first byte.")
    client_write_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A client that takes nothing of its stream this long loses it.",
    )
    adapter_hold_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Longest a request for a declared LoRA adapter waits for an engine that can load it.",
    )
    adapter_warmup_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="At start-up, longest GET /health says 503 (warming) while the declared LoRA "
        "adapters are loaded onto the engines ahead of their first requests; 0: ready at once.",
    )
    models_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="Per-engine limit when aggregating /v1/models."
    )
    engine_api_key: str | None = Field(
        default=None,
        min_length=1,
        repr=False,
        description="Sent as `Authorization: Bearer <key>` on every call to an engine's /v1/* (engines "
        "started with vLLM's --api-key); `tandem router` reads it from $TANDEM_ENGINE_API_KEY.",
    )


class DisaggregationSettings(_Settings):
    prefill_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Whole prefill request (connect to last byte); on expiry: decode-only fallback.",
    )
    kv_barrier_timeout_seconds: float = Field(
        default=2.0,
        ge=0,
        le=600,
        description="Wait after a prefill for the prompt's chunks in the KV pool; then decode-only.",
    )
    kv_pool_timeout_seconds: float = Field(
        default=0.5, gt=0, le=60, description="Connect and per-command timeout of the KV pool client."
    )


class AdmissionSettings(_Settings):
    """The router's queue and fair sharing (docs/router.md, "Admission and the fair queue").

    The gateway sends each engine at most its concurrency plus `lookahead` of it (rounded; default
    none), this process's share (`tandem.router.discovery.capacity`): the concurrency starts at
    `engine_capacity` (default: `--max-num-seqs` in `spec.engine.args`, else 256), is never above a
    declared one, and is learned and held from the engine's running and waiting counts;
    `max_in_flight_per_endpoint` caps it. Optional extra
    checks on the engine's scraped numbers (`max_waiting_per_endpoint`, `max_kv_usage`; off by
    default) hold new requests while an engine reports that much. While every decode endpoint is
    full, requests wait in the router's fair queue (`spec.router.maxQueue` places) for at most
    `max_queue_wait_seconds` or their own TTFT deadline.

    Between gateway replicas (`replicas`: how many gateways send to the same engines; in a cluster
    `spec.router.replicas`), capacity is split and the fair queue's counters are shared through the
    KV pool's Redis (`shared_counters`: `auto` = when there is more than one replica and a pool,
    `redis` = always, start-up fails without a pool; `off`), synced every `counter_sync_seconds`.
    """

    fairness: Literal["vtc", "fcfs"] = Field(
        default="vtc", description="Order of waiting requests: vtc (fair between tenants) or fcfs."
    )
    engine_capacity: int | None = Field(default=None, ge=1, le=65_536)
    lookahead: float = Field(default=0.0, ge=0, le=1)
    max_in_flight_per_endpoint: int = Field(default=65_536, ge=1, le=65_536)
    max_waiting_per_endpoint: int | None = Field(default=None, ge=0, le=100_000)
    max_kv_usage: float | None = Field(default=None, gt=0, le=1)
    max_queue_wait_seconds: float = Field(default=60.0, gt=0, le=3600)
    tenant_weights: dict[str, Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=dict, description="VTC weight per tenant (default 1): service shares are weighted."
    )
    max_tenant_labels: int = Field(
        default=50, ge=0, le=10_000, description="Tenants named in metric labels; the rest are 'other'."
    )
    poll_seconds: float = Field(
        default=0.25, gt=0, le=10, description="How often waiting requests re-check capacity."
    )
    handover_tokens: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Give a stream's slot to the next request this many tokens "
        "before its max_tokens (0: off).",
    )
    handover_lead: Literal["on", "off"] = Field(
        default="off",
        description="Hand a stream's slot over earlier by the time the next request takes to reach "
        "its decode engine (a prefill elsewhere first), learned from the requests: more throughput "
        "from disaggregated decode engines, requests queued in them for a moment.",
    )
    preemption: Literal["on", "off"] = Field(
        default="on",
        description="With vtc fairness: a tenant with nothing running may take a slot from a tenant "
        "over its share; the stopped stream is continued later.",
    )
    preemption_swap: Literal["on", "off"] = Field(
        default="off",
        description="With a prefill pool: a pre-empting request goes to the decode engine of the "
        "stream it stopped, computed there (short prompts) or decoded there after its prefill.",
    )
    prefill_ahead: float = Field(
        default=1.0,
        ge=0,
        le=4,
        description="With a prefill pool: while no decode slot is free, the next requests in fair "
        "order (at most this share of the capacity) are prefilled as they wait (0: off).",
    )
    recall: Literal["on", "off"] = Field(
        default="on",
        description="Take back requests an engine queues beyond its learned capacity (none started) "
        "to wait in the fair queue again.",
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Gateway replicas in front of the same engines (default: "
        "spec.router.replicas in a cluster, else 1).",
    )
    shared_counters: Literal["auto", "redis", "off"] = Field(
        default="auto", description="Share VTC counters between replicas through the KV pool's Redis."
    )
    counter_sync_seconds: float = Field(
        default=0.1, ge=0.01, le=10, description="Seconds between syncs of the shared VTC counters."
    )


class DiscoverySettings(_Settings):
    kube_api_server: str | None = Field(
        default=None,
        pattern=r"^https?://[^/\s]+/?$",
        description="Kubernetes API URL used without credentials (kubectl proxy); default: in-cluster.",
    )


class CollectorSettings(_Settings):
    """The endpoint metrics collector: every `interval_seconds` each engine's `/metrics` is read (at
    most `timeout_seconds` each). Its numbers are marked stale after `stale_after` failed scrapes in
    a row; an engine that cannot be reached `unreachable_after` times in a row leaves rotation until a
    scrape succeeds. While an engine's capacity is being learned (`EngineCapacity.learning`) that
    engine is read every `learning_interval_seconds` as well. `enabled: false` schedules on the router's
    own counts only."""

    enabled: bool = True
    interval_seconds: float = Field(default=1.0, gt=0, le=3600)
    learning_interval_seconds: float = Field(default=0.25, gt=0, le=3600)
    timeout_seconds: float = Field(default=1.0, gt=0, le=600)
    stale_after: int = Field(default=3, ge=1, le=1000)
    unreachable_after: int = Field(default=3, ge=1, le=1000)


class KVEventsAddress(_Settings):
    events: str = Field(pattern=r"^(tcp|ipc)://", description="The engine's KV-event PUB address.")
    replay: str | None = Field(default=None, pattern=r"^(tcp|ipc)://", description="Its replay address.")


class KVEventsSettings(_Settings):
    """Where engines publish KV events (`prefix_source: precise`): `tcp://<engine host>:<port>`
    (vLLM's default port 5557; replay off unless `replay_port`), or per engine URL in `endpoints`."""

    port: int = Field(default=5557, ge=1, le=65535)
    replay_port: int | None = Field(default=None, ge=1, le=65535)
    topic: str = ""
    endpoints: dict[str, KVEventsAddress] = Field(default_factory=dict)


class SchedulingSettings(_Settings):
    """Tuning of the scheduler (docs/routing.md); the scorer weights are `spec.router.scoring`.

    `prefix_source`: `approximate` (the router's own routing history) or `precise` (the engines' KV
    events); None: `spec.router.prefixSource`. With `precise`, a routed prompt's blocks count as
    cached on its engine until its first token and `pending_ttl_seconds` after (the events lag).
    Imbalance guard: an endpoint is skipped while its load exceeds the least loaded one's by more
    than `imbalance_abs_threshold` requests and `imbalance_rel_threshold` times (SGLang: 64, 1.5).
    `cache_threshold`: the prompt share cached somewhere below which a prompt counts as new (SGLang:
    0.3; the prefix scorer spreads new prompts, the `prefix` policy goes least-loaded). TTFT
    predictor: `prior_tokens_per_second` until a rate is observed, `rate_smoothing` the EWMA weight.
    Approximate index: block size and capacity per engine until `vllm:cache_config_info` says."""

    prefix_source: Literal["approximate", "precise"] | None = None
    pending_ttl_seconds: float = Field(default=2.0, ge=0, le=600)
    imbalance_abs_threshold: float = Field(default=64.0, ge=0, le=1_000_000)
    imbalance_rel_threshold: float = Field(default=1.5, ge=1, le=1000)
    cache_threshold: float = Field(default=0.3, gt=0, le=1)
    prior_tokens_per_second: float = Field(default=8192.0, gt=0, le=1e9)
    rate_smoothing: float = Field(default=0.2, gt=0, le=1)
    default_block_size: int = Field(default=16, ge=1, le=1024)
    default_index_blocks: int = Field(default=31_250, ge=1, le=100_000_000)
    kv_events: KVEventsSettings = Field(default_factory=KVEventsSettings)


#: vLLM request extensions an engine acts on beyond sampling: refused unless enabled
#: (`tandem.router.request.limits`).
EngineExtension = Literal[
    "vllm_xargs",
    "chat_template",
    "prompt_embeds",
    "logits_processors",
    "mm_processor_kwargs",
    "media_io_kwargs",
]


class AccessSettings(_Settings):
    """Who may call the gateway and how much (docs/security.md, "API keys and rate limits").

    The key file itself is `RouterConfig.apiKeysFile` (or `--api-keys-file`); here is how often it is
    checked for changes. `max_rate_limited_tenants` bounds the tenants whose buckets are kept.
    `log_prompts` adds prompt and output text to the request log line (also on with
    `spec.router.logPrompts`). `max_request_bytes`: larger request bodies are refused with 413;
    `max_reading_bytes`: the bytes all requests may be reading and parsing at once (429 beyond);
    `body_seconds`: the time a client has to send its whole body (408); `header_seconds`: the time it
    has to send a request's line and headers (408, then the connection is closed); `max_connections`:
    the client connections one gateway process (each worker) serves at once, more are answered 503
    and closed (`tandem.cli.connections`). The shape limits and the opt-in engine extensions are
    `tandem.router.request.limits`'s. `metrics_port`: `/metrics` moves to this port, behind a token
    (`tandem.router.http.diagnostics`).
    """

    api_keys_reload_seconds: float = Field(default=2.0, gt=0, le=3600)
    max_rate_limited_tenants: int = Field(default=10_000, ge=1, le=10_000_000)
    log_prompts: bool = False
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1 << 34)
    max_reading_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, le=1 << 36)
    body_seconds: float = Field(default=60.0, gt=0, le=3600)
    header_seconds: float = Field(default=10.0, gt=0, le=3600)
    max_connections: int = Field(default=4096, ge=1, le=1_000_000)
    max_json_elements: int = Field(default=262_144, ge=16, le=100_000_000)
    max_messages: int = Field(default=2048, ge=1, le=1_000_000)
    max_content_parts: int = Field(default=4096, ge=1, le=1_000_000)
    max_sequences: int = Field(default=16, ge=1, le=4096)
    allowed_extensions: list[EngineExtension] = Field(
        default_factory=list, description="vLLM request extensions clients may use."
    )
    allow_media_urls: bool = Field(
        default=False, description="Let clients name media by URL (the engine fetches it)."
    )
    topology_headers: bool = Field(
        default=False,
        description="Name the engines that served a request in x-tandem-* response headers (diagnostics).",
    )
    #: The diagnostics port (`tandem.router.http.diagnostics`): `/metrics` is served there, behind
    #: `metrics_token`, and no longer on the client port; None: `/metrics` on the client port.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    #: The token the diagnostics port asks for, from `TANDEM_METRICS_TOKEN`, never a flag; empty: none.
    metrics_token: SecretStr = Field(default=SecretStr(""), exclude=True)
    #: The key of the tenants' cache salts (`tandem.router.identity.cachescope`), from
    #: `TANDEM_CACHE_KEY`, never a flag; empty: a random key for this process's life.
    cache_key: SecretStr = Field(default=SecretStr(""), exclude=True)


class WorkersSettings(_Settings):
    """`tandem router --workers N`: N processes serve one port. `index`, `key` and `token` are set by
    the parent for each worker (`key` names this run's bus sockets, `token` is the secret a worker
    presents to its siblings: `tandem.router.workers.peer`); a single process has count 1."""

    count: int = Field(default=1, ge=1, le=64)
    index: int = Field(default=0, ge=0, le=63)
    key: str = Field(default="solo", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    token: SecretStr = Field(default=SecretStr(""))


class TracingSettings(_Settings):
    """Traces from flags (`--otlp-traces-endpoint`, `--otlp-traces-protocol`, `--trace-sampling-ratio`):
    each one set wins over the `OTEL_*` variables and the spec's `tracing` (`tandem.core.tracing`)."""

    endpoint: str | None = Field(default=None, min_length=1, max_length=2048)
    protocol: Literal["grpc", "http/protobuf"] | None = None
    sampling_ratio: float | None = Field(default=None, ge=0.0, le=1.0)


class RouterSettings(_Settings):
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    rotation: RotationSettings = Field(default_factory=RotationSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    disaggregation: DisaggregationSettings = Field(default_factory=DisaggregationSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    collector: CollectorSettings = Field(default_factory=CollectorSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    workers: WorkersSettings = Field(default_factory=WorkersSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
