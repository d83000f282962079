"""The gateway's section of an InferenceService's spec (`spec.router`): routing policy and weights, SLO,
cold start, fairness, tenants, API keys, rate limits, cache isolation, diagnostics (docs/router.md)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from tandem.core.podtemplate import PodTemplate
from tandem.core.specbase import SecretKeyRef, SpecModel


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
