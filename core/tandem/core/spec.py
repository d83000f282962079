"""The `InferenceService` resource (group `tandem.dev`, version `v1alpha1`) as typed models.

This module (with the sections it imports: `specbase`, `routerspec`, `adapterspec`, whose names it
re-exports) is the single source of truth for the resource: the CRD's openAPIV3Schema is generated from
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

from pydantic import ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from tandem.core.adapterspec import (
    ADAPTER_NAME_PATTERN as ADAPTER_NAME_PATTERN,
)
from tandem.core.adapterspec import (
    LORA_RANKS as LORA_RANKS,
)
from tandem.core.adapterspec import (
    AdapterCacheSpec as AdapterCacheSpec,
)
from tandem.core.adapterspec import (
    AdapterCatalogSpec as AdapterCatalogSpec,
)
from tandem.core.adapterspec import (
    AdapterSpec as AdapterSpec,
)
from tandem.core.adapterspec import (
    LoraRank as LoraRank,
)
from tandem.core.adapterspec import (
    LoraSpec as LoraSpec,
)
from tandem.core.podtemplate import PodTemplate
from tandem.core.routerspec import (
    ROUTING_POLICIES as ROUTING_POLICIES,
)
from tandem.core.routerspec import (
    AuthSpec as AuthSpec,
)
from tandem.core.routerspec import (
    ColdStartSpec as ColdStartSpec,
)
from tandem.core.routerspec import (
    FairnessSpec as FairnessSpec,
)
from tandem.core.routerspec import (
    PrefixSourceKind as PrefixSourceKind,
)
from tandem.core.routerspec import (
    RateLimitSpec as RateLimitSpec,
)
from tandem.core.routerspec import (
    RouterSpec as RouterSpec,
)
from tandem.core.routerspec import (
    RoutingPolicy as RoutingPolicy,
)
from tandem.core.routerspec import (
    ScoringWeights as ScoringWeights,
)
from tandem.core.routerspec import (
    SLOSpec as SLOSpec,
)
from tandem.core.routerspec import (
    TenantSpec as TenantSpec,
)
from tandem.core.specbase import (
    DNS_LABEL_PATTERN as DNS_LABEL_PATTERN,
)
from tandem.core.specbase import (
    QUANTITY_PATTERN as QUANTITY_PATTERN,
)
from tandem.core.specbase import (
    Quantity as Quantity,
)
from tandem.core.specbase import (
    SecretKeyRef as SecretKeyRef,
)
from tandem.core.specbase import (
    SpecModel as SpecModel,
)
from tandem.core.tracing import TracingSpec

GROUP = "tandem.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "tisvc"

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
