"""The `InferenceService` resource (group `tandem.dev`, version `v1alpha1`) as typed models.

This module is the single source of truth for the resource: the CRD's openAPIV3Schema is generated from
these models, the operator builds children from them, and `tandem up` runs them locally. Field names on
the wire are camelCase (Kubernetes convention); Python attributes are snake_case.

Validation has two layers:
- structural (types, enums, ranges, required fields, defaults): what the CRD schema also enforces;
- cross-field rules (`tandem.core.specrules.check_rules`): what a schema cannot say, e.g. `min <= max`.
`tandem.core.specrules.parse_inference_service` runs both and raises `SpecInvalid` listing every error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from tandem.core.podtemplate import PodTemplate
from tandem.core.tracing import TracingSpec

GROUP = "tandem.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "tisvc"

#: Kubernetes resource quantity, e.g. `32Gi`, `500m`, `1.5`.
QUANTITY_PATTERN = r"^[+]?[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|Ei|K|M|G|T|P|E)?$"
#: DNS-1123 label: names of Kubernetes objects derived from the service name.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
EvictionPolicy = Literal[
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
]
REDIS_EVICTION_POLICIES: tuple[str, ...] = get_args(EvictionPolicy)
DEFAULT_VLLM_IMAGE = "lmcache/vllm-openai:v0.3.9"
#: Engine KV block size in tokens (vLLM's default); the KV pool's chunk size must be a multiple of it.
ENGINE_BLOCK_SIZE = 16

Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class SpecModel(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class ModelSource(SpecModel):
    """Where engine pods find the weights: a PVC (mounted at /models, serving /models/<path>), or a URI the
    engine resolves itself."""

    pvc: str | None = Field(default=None, description="PersistentVolumeClaim holding the weights.")
    path: str | None = Field(default=None, description="Path of the weights inside the volume.")
    uri: str | None = Field(
        default=None, description="Model URI passed to the engine (e.g. hf://org/name) when no PVC."
    )


class TokenizerSource(SpecModel):
    """Where the gateway finds the model's tokenizer files (`tokenizer.json`, `tokenizer_config.json`)
    when the weights' volume cannot be mounted into its pods. A ConfigMap holds at most 1 MiB."""

    config_map: str = Field(
        pattern=DNS_LABEL_PATTERN, description="ConfigMap with tokenizer.json and tokenizer_config.json."
    )


class ModelSpec(SpecModel):
    """The model the engines serve and the name clients use for it."""

    name: str = Field(min_length=1, description="Model identifier, e.g. Qwen/Qwen2.5-7B-Instruct.")
    served_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients use in the `model` field; defaults to `name`.",
    )
    source: ModelSource | None = Field(default=None, description="Where the weights come from.")
    tokenizer: TokenizerSource | None = Field(
        default=None,
        description="The tokenizer files for the gateway (engine.kind vllm), when the weights' PVC is "
        "not to be mounted into the router pods; default: the PVC, read-only.",
    )

    @property
    def public_name(self) -> str:
        """The name clients send in requests."""
        return self.served_name or self.name


class EnvVar(SpecModel):
    """An environment variable for the engine containers."""

    name: str = Field(min_length=1)
    value: str = ""


class SimSpec(SpecModel):
    """Settings of the simulated engine (`engine.kind: sim`)."""

    profile: str = Field(
        default="qwen2.5-7b-h100",
        description="Model/GPU profile of the roofline time model (see `tandem sim --list-profiles`).",
    )
    time_scale: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Simulated seconds per wall-clock second; >1 runs faster than real time.",
    )


class SecretKeyRef(SpecModel):
    """One key of a Secret in the InferenceService's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Secret name.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret.")


#: Ranks vLLM accepts for `--max-lora-rank` (`vllm/config/lora.py`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
#: An adapter's name: what clients send in `model`, and a directory name under the engines' adapter
#: directory (`/adapters/<name>`), so one path component: no `/`, not `.` or `..` (the first character
#: is a letter or digit), at most 128 characters.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class LoraSpec(SpecModel):
    """LoRA on the engines (vLLM's `--enable-lora`): how many adapters a batch may mix and how large
    they may be. vLLM reserves GPU memory for `maxLoras` adapters of rank `maxRank`, so these are set
    explicitly; absent, the engines run without LoRA."""

    max_loras: int = Field(
        default=1, ge=1, le=1024, description="Adapters in one batch (vLLM --max-loras, default 1)."
    )
    max_rank: LoraRank = Field(
        default=16,
        description="Largest adapter rank the engines accept (vLLM --max-lora-rank); an adapter whose "
        "adapter_config.json says a larger `r` is refused.",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Adapters kept in CPU memory (vLLM --max-cpu-loras, at least maxLoras); default "
        "maxLoras.",
    )


class EngineSpec(SpecModel):
    """Which engine runs the pools, its image, and extra arguments and environment."""

    kind: Literal["vllm", "sim"] = Field(
        default="vllm", description="`vllm`: the real engine; `sim`: Tandem's vLLM-compatible simulator."
    )
    image: str = Field(default=DEFAULT_VLLM_IMAGE, description="Engine container image (kind vllm).")
    args: list[str] = Field(default_factory=list, description="Extra engine command-line arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra engine environment variables.")
    sim: SimSpec = Field(default_factory=SimSpec, description="Simulator settings (kind sim).")
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API key engines require on /v1/* (vLLM's --api-key); only "
        "the gateway is given it. Default: a Secret <name>-engine-key the operator generates once.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Serve LoRA adapters (spec.adapters, spec.adapterCatalog) on both pools; absent: "
        "LoRA off.",
    )
    template: PodTemplate | None = Field(
        default=None,
        description="Pod template merged onto both pools' engine pods (before the pool's own); the "
        "container named `engine` merges onto the engine container (docs/operator.md, Templates).",
    )


class ResourceRequirements(SpecModel):
    """Container resources as in Kubernetes (`cpu`, `memory`, `nvidia.com/gpu`, ...)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def _numbers_as_strings(cls, value: Any) -> Any:
        # Kubernetes accepts `nvidia.com/gpu: 1` (int-or-string); keep one canonical string form.
        if isinstance(value, Mapping):
            return {k: str(v) if isinstance(v, int | float) else v for k, v in value.items()}
        return value


class AutoscalingBehavior(SpecModel):
    """Timing and damping of one pool's autoscaler (Knative KPA windows; formulas in docs/autoscaler.md)."""

    stable_window_seconds: float = Field(
        default=60.0, ge=1, le=3600, description="Window over which demand is averaged for normal decisions."
    )
    panic_window_seconds: float = Field(
        default=6.0, ge=1, le=3600, description="Short window that detects bursts (panic mode)."
    )
    panic_threshold: float = Field(
        default=2.0, ge=1.1, le=100, description="Panic when the panic-window desire ≥ this × ready replicas."
    )
    tolerance: float = Field(
        default=0.1, ge=0, lt=1, description="No change while |desired / ready − 1| ≤ tolerance."
    )
    scale_down_delay_seconds: float = Field(
        default=300.0, ge=0, le=86400, description="Scale down only to the highest desire of this window."
    )
    max_scale_up_step: int | None = Field(
        default=None, ge=1, le=1000, description="Most replicas added in one decision (unlimited if unset)."
    )
    max_scale_down_step: int | None = Field(
        default=None, ge=1, le=1000, description="Most replicas removed in one decision (unlimited if unset)."
    )
    max_metric_age_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Older observations are stale: the autoscaler holds."
    )
    ready_timeout_seconds: float = Field(
        default=600.0,
        ge=10,
        le=86400,
        description="How long requested replicas may stay not ready (e.g. a pod that cannot be scheduled) "
        "before the autoscaler stops waiting for them: it may then scale down again, and says so with a "
        "Warning Event and a ReplicasReady condition in status.autoscaling.",
    )


class PrefillAutoscaling(AutoscalingBehavior):
    """Autoscaling of the prefill pool on time to first token against its target."""

    enabled: bool = Field(default=False, description="Let the autoscaler own this pool's replicas.")
    min: int = Field(default=1, ge=0, le=1000, description="Fewest replicas.")
    max: int = Field(default=8, ge=1, le=1000, description="Most replicas.")
    target_ttft_seconds: float = Field(
        default=0.5, gt=0, le=600, description="Target p90 time to first token."
    )
    target_utilization: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Share of a replica's measured prefill capacity (tokens/s) to plan for: prompt "
        "tokens arriving at the gateway ÷ (capacity × this) is the pool's leading demand.",
    )


class DecodeAutoscaling(AutoscalingBehavior):
    """Autoscaling of the decode pool on mean KV-cache utilisation against its target."""

    enabled: bool = Field(default=False, description="Let the autoscaler own this pool's replicas.")
    min: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest replicas; 0 scales to zero (the gateway holds requests while the first starts).",
    )
    max: int = Field(default=16, ge=1, le=1000, description="Most replicas.")
    target_kv_utilization: float = Field(
        default=0.7, gt=0, le=1, description="Target mean KV-cache utilisation (fraction 0-1)."
    )


class PoolEngineSpec(SpecModel):
    """The engine settings of one pool, over `spec.engine`'s."""

    image: str | None = Field(
        default=None, description="Engine image of this pool; default spec.engine.image."
    )
    args: list[str] = Field(
        default_factory=list,
        description="Arguments after spec.engine.args (a later flag wins, as vLLM parses), e.g. "
        "--max-num-batched-tokens on prefill, --max-num-seqs on decode.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment over spec.engine.env.")


class PoolSpec(SpecModel):
    """Size, resources, placement and engine settings of one engine pool."""

    replicas: int = Field(default=1, ge=0, le=1000, description="Engine replicas.")
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    tensor_parallel: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size.")
    engine: PoolEngineSpec = Field(default_factory=PoolEngineSpec)
    template: PodTemplate | None = Field(
        default=None,
        description="Pod template merged onto this pool's engine pods, after spec.engine.template.",
    )
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pods (nodes) one engine spans; >1 renders a LeaderWorkerSet whose leader serves "
        "HTTP and whose workers join it (vLLM data parallel, engine.kind vllm).",
    )
    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="The pool's PodDisruptionBudget: pods that voluntary disruptions (node drains) may "
        "take down at once; 0 blocks them.",
    )

    @property
    def multinode(self) -> bool:
        """Whether one engine spans several pods (a LeaderWorkerSet)."""
        return self.nodes_per_replica > 1


class PrefillSpec(PoolSpec):
    """The prefill pool: engines that compute prompts' KV and write it to the KV pool."""

    autoscaling: PrefillAutoscaling = Field(default_factory=PrefillAutoscaling)


class DecodeSpec(PoolSpec):
    """The decode pool: engines that load prompts' KV from the pool and generate tokens."""

    replicas: int = Field(
        default=2, ge=0, le=1000, description="Engine replicas (0 only with autoscaling from min 0)."
    )
    autoscaling: DecodeAutoscaling = Field(default_factory=DecodeAutoscaling)


class DisaggregationSpec(SpecModel):
    """When a request is prefilled on the prefill pool before it decodes."""

    mode: Literal["always", "auto", "off"] = Field(
        default="auto",
        description="always: every request prefills on the prefill pool; auto: only prompts with at "
        "least `minUncachedTokens` uncached tokens; off: decode pool only.",
    )
    min_uncached_tokens: int = Field(default=512, ge=0, le=1_000_000)
    convertible_decoders: bool = Field(
        default=True,
        description="While the prefill pool is short of capacity (its predicted time to first token "
        "exceeds half the request's TTFT objective and a decode engine would be faster), the request "
        "goes decode-only to a decode engine with room, which computes its own prefill; back to P/D "
        "once the prefill pool has caught up. Not in mode off.",
    )
    late_prefill_binding: bool = Field(
        default=True,
        description="While every prefill engine has more than a quarter of a request's TTFT objective "
        "queued, the request waits in the gateway (first come first served, at most its objective) "
        "and goes to whichever prefill engine frees first or joins, instead of queueing on one.",
    )


class RedisSpec(SpecModel):
    """The Redis behind the KV pool: managed by Tandem (memory, eviction policy) or external (url)."""

    memory: Quantity = Field(default="32Gi", description="maxmemory of the managed Redis.")
    eviction_policy: EvictionPolicy = Field(default="allkeys-lru", description="Redis maxmemory-policy.")
    url: str | None = Field(
        default=None,
        pattern=r"^(redis|rediss|unix)://",
        description="External Redis URL; when set, no Redis is deployed.",
    )
    password_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the Redis password: the managed Redis requires it, and the "
        "engines and router read it from the Secret. Default for the managed Redis: a Secret "
        "<name>-kv-auth the operator generates once.",
    )
    template: PodTemplate | None = Field(
        default=None,
        description="Pod template merged onto the managed Redis pod (container `redis`).",
    )


class KVPoolSpec(SpecModel):
    """The KV pool between prefill and decode (LMCache's Redis layout)."""

    backend: Literal["redis"] = "redis"
    connector: Literal["lmcache", "tandem"] = Field(
        default="lmcache",
        description="vLLM KV connector of the engines: lmcache (LMCacheConnectorV1, GPU images; an init "
        "container refuses images whose vLLM and LMCache are known not to fit) or tandem "
        "(tandem.kvpool.vllm_connector, runs where LMCache cannot, e.g. CPU).",
    )
    redis: RedisSpec = Field(default_factory=RedisSpec)
    chunk_size: int = Field(
        default=256, ge=16, le=8192, description="Tokens per KV chunk in the pool (LMCache chunk_size)."
    )


class ScoringWeights(SpecModel):
    """Weights of the gateway's scorers; each scorer returns a value in [0, 1]."""

    prefix: float = Field(default=3.0, ge=0, le=100, description="Weight of prefix-cache overlap.")
    load: float = Field(default=2.0, ge=0, le=100, description="Weight of queue + running load.")
    kv: float = Field(default=2.0, ge=0, le=100, description="Weight of free KV-cache space.")
    ttft: float = Field(
        default=2.0, ge=0, le=100, description="Weight of predicted time-to-first-token headroom."
    )


class SLOSpec(SpecModel):
    """Default latency objectives; requests may override them with x-slo-ttft-ms / x-slo-tpot-ms."""

    ttft_seconds: float = Field(default=1.0, gt=0, le=3600, description="Default TTFT objective.")
    tpot_seconds: float = Field(default=0.05, gt=0, le=60, description="Default time per output token.")


class ColdStartSpec(SpecModel):
    """Requests that arrive while the decode pool has no engine (scaled to zero, or starting)."""

    max_held_requests: int = Field(
        default=256,
        ge=0,
        le=100_000,
        description="Requests the gateway holds while the decode pool has no engine; beyond, 429. "
        "0: no holding, 503 at once.",
    )
    hold_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Longest a request is held; then 429 with Retry-After.",
    )
    retry_after_seconds: int = Field(
        default=10, ge=1, le=3600, description="Retry-After of a request that was not held or held too long."
    )


class FairnessSpec(SpecModel):
    """Virtual-token-counter fair queuing between tenants."""

    tenant_header: str = Field(default="x-tenant-id", pattern=r"^[A-Za-z0-9-]+$")
    input_weight: float = Field(default=1.0, gt=0, le=1000, description="VTC cost per prompt token.")
    output_weight: float = Field(default=2.0, gt=0, le=1000, description="VTC cost per output token.")


class RateLimitSpec(SpecModel):
    """Per-tenant rate limits (token buckets refilled per minute); unset means unlimited."""

    requests_per_minute: float | None = Field(default=None, gt=0, le=1e9, description="Requests per minute.")
    tokens_per_minute: float | None = Field(
        default=None, gt=0, le=1e12, description="Prompt + completion tokens per minute."
    )


class TenantSpec(SpecModel):
    """One tenant's share and limits; tenants not listed get weight 1 and `router.rateLimits`."""

    name: str = Field(min_length=1, max_length=253, description="Tenant id (header or API key).")
    weight: float = Field(default=1.0, gt=0, le=1000, description="VTC weight: share of service.")
    rate_limits: RateLimitSpec | None = Field(default=None, description="Overrides router.rateLimits.")
    priority: int = Field(
        default=0,
        ge=-10,
        le=10,
        description="Priority band of the tenant's requests: a higher band is always dispatched first.",
    )
    allow_lower_priority: bool = Field(
        default=True,
        description="Whether a request may lower itself below the tenant's band with x-priority "
        "(never raise itself above it).",
    )
    cache_group: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Tenants with the same cache group share cached prompts (e.g. a public system "
        "prompt); a tenant without one shares its cache with nobody (router.cacheIsolation).",
    )


class AuthSpec(SpecModel):
    """API keys at the gateway: each key maps to a tenant; without a valid key requests get 401."""

    enabled: bool = Field(default=False, description="Require an API key (Authorization: Bearer ...).")
    api_keys_secret: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the key table (docs/security.md has the format)."
    )


#: Routing policies the gateway implements; `tandem bench --policy` compares them on the same engines.
#: `tandem`: filters → weighted scorers → picker (docs/routing.md); `prefix`: SGLang-like cache-aware;
#: `least-load`: fewest queued + running; `round-robin`: in turn.
RoutingPolicy = Literal["tandem", "prefix", "least-load", "round-robin"]
ROUTING_POLICIES: tuple[str, ...] = get_args(RoutingPolicy)
#: Where prefix-cache state comes from: the gateway's own routing history, or the engines' KV events
#: (docs/routing.md, "Precise prefix state").
PrefixSourceKind = Literal["approximate", "precise"]


class RouterSpec(SpecModel):
    """The OpenAI-compatible gateway: replicas, routing policy and weights, SLOs, fairness, queue."""

    replicas: int = Field(default=2, ge=1, le=100)
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Gateway processes per replica serving one port (`tandem router --workers`); they "
        "share prefix state and fair-queue counters and split the engines' capacity.",
    )
    policy: RoutingPolicy = Field(default="tandem", description="How the gateway picks engines.")
    prefix_source: PrefixSourceKind = Field(
        default="approximate",
        description="Prefix-cache state: `approximate`, the gateway's routing history; `precise`, the "
        "engines' KV events (the engines publish them over ZMQ, the gateway subscribes to each).",
    )
    scoring: ScoringWeights = Field(default_factory=ScoringWeights)
    slo: SLOSpec = Field(default_factory=SLOSpec)
    fairness: FairnessSpec = Field(default_factory=FairnessSpec)
    max_queue: int = Field(default=1000, ge=0, le=1_000_000, description="Router queue bound.")
    cold_start: ColdStartSpec = Field(default_factory=ColdStartSpec)
    auth: AuthSpec = Field(default_factory=AuthSpec)
    rate_limits: RateLimitSpec = Field(default_factory=RateLimitSpec, description="Per-tenant limits.")
    tenants: list[TenantSpec] = Field(default_factory=list, description="Per-tenant weights and limits.")
    cache_isolation: Literal["tenant", "off"] = Field(
        default="tenant",
        description="`tenant`: each tenant's prompts are cached apart (vLLM's cache_salt, the KV "
        "pool's keys and the gateway's prefix index), shared only within a tenants[].cacheGroup; "
        "`off`: one cache for every tenant.",
    )
    log_prompts: bool = Field(default=False, description="Log prompt and output text.")
    metrics_token: bool = Field(
        default=False,
        description="Require a bearer token on the gateway's diagnostics port (9090, `/metrics`): the "
        "operator generates it into the Secret `<name>-metrics-token`; without it the port is open "
        "only to the operator's metrics namespaces (NetworkPolicy).",
    )
    template: PodTemplate | None = Field(
        default=None,
        description="Pod template merged onto the gateway pods (container `router`); unused while an "
        "InferenceGateway serves the service.",
    )


class NetworkPolicySpec(SpecModel):
    """The NetworkPolicies the operator renders for the service (docs/security.md, Network policies)."""

    enabled: bool = Field(
        default=True,
        description="Render NetworkPolicies: only the documented paths between the gateway, the engines "
        "and Redis are open; off: none are created (bring your own).",
    )
    client_namespaces: list[Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]] = Field(
        default_factory=list,
        description="Namespaces whose pods may reach the gateway's port, besides the service's own.",
    )


class AdapterSpec(SpecModel):
    """One LoRA adapter of the model, served under its own name (clients send it in `model`)."""

    name: str = Field(
        pattern=ADAPTER_NAME_PATTERN,
        description="The adapter's served name: one path component (letters, digits, `.`, `_`, `-`; "
        "starting with a letter or digit), at most 128 characters.",
    )
    source: str = Field(
        min_length=1,
        max_length=4096,
        description="Where the adapter's files are: `pvc://claim/path`, `hf://org/repo[@revision]`, "
        "`s3://bucket/prefix`, or a local directory for `tandem up` (relative to the file).",
    )


class AdapterCatalogSpec(SpecModel):
    """A directory of adapters: every subdirectory holding an `adapter_config.json` is an adapter
    named after the subdirectory."""

    source: str = Field(
        min_length=1,
        max_length=4096,
        description="`pvc://claim/path`, or a local directory for `tandem up` (relative to the file).",
    )


class AdapterCacheSpec(SpecModel):
    """Where the engines' adapter directory lives: a ReadWriteMany claim the pods of a pool share,
    instead of an emptyDir per pod."""

    pvc: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63, description="PersistentVolumeClaim (RWX).")


class InferenceServiceSpec(SpecModel):
    """The desired state of one disaggregated inference service."""

    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    prefill: PrefillSpec = Field(default_factory=PrefillSpec)
    decode: DecodeSpec = Field(default_factory=DecodeSpec)
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    kv_pool: KVPoolSpec = Field(default_factory=KVPoolSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=1000,
        description="LoRA adapters of the model, each served under its name (needs engine.lora).",
    )
    adapter_catalog: AdapterCatalogSpec | None = Field(
        default=None, description="A directory of adapters, each subdirectory one (needs engine.lora)."
    )
    adapter_cache: AdapterCacheSpec | None = Field(
        default=None,
        description="The engines' adapter directory (/adapters) on a shared RWX claim; default an "
        "emptyDir per pod.",
    )
    tracing: TracingSpec | None = Field(
        default=None,
        description="OpenTelemetry traces of the gateway and the engines (absent: off unless OTEL_* "
        "variables say otherwise).",
    )


class ObjectMeta(SpecModel):
    """The part of Kubernetes metadata Tandem reads; everything else is kept but not modelled."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=52, pattern=DNS_LABEL_PATTERN)
    namespace: str = Field(default="default", pattern=DNS_LABEL_PATTERN)


class InferenceService(SpecModel):
    """A whole `InferenceService` document (apiVersion, kind, metadata, spec)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    api_version: Literal["tandem.dev/v1alpha1"]
    kind: Literal["InferenceService"]
    metadata: ObjectMeta
    spec: InferenceServiceSpec


#: The PYTHONHASHSEED every engine gets (in a cluster and locally): LMCache and vLLM derive prefix-chunk
#: keys from Python's `hash()`, so producer and consumer must agree on it or the consumer never finds a
#: chunk; `engine.env` may set another.
ENGINE_HASH_SEED = "0"


def engine_hash_seed(spec: InferenceServiceSpec) -> str:
    """The PYTHONHASHSEED every engine runs with: the last `engine.env` entry of that name (engine
    environments apply `engine.env` last), else `ENGINE_HASH_SEED`."""
    told = [var.value for var in spec.engine.env if var.name == "PYTHONHASHSEED"]
    return told[-1] if told else ENGINE_HASH_SEED


def max_prefill_replicas(spec: InferenceServiceSpec) -> int:
    """The most prefill engines the spec can run: the autoscaler's `max` when it owns the pool, else
    `replicas` (0: every request is decode-only)."""
    scaling = spec.prefill.autoscaling
    return scaling.max if scaling.enabled else spec.prefill.replicas
