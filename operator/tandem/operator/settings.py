"""The operator's settings, validated once at start-up (from `tandem operator` flags)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from tandem.core.spec import DNS_LABEL_PATTERN

DEFAULT_REDIS_IMAGE = "redis:7.4-alpine"
Namespace = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]


class OperatorSettings(BaseModel):
    """Everything one operator process needs; immutable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[Namespace, ...] = Field(
        default=(), description="Namespaces to watch; empty: every namespace (cluster-wide)."
    )
    metrics_namespaces: tuple[Namespace, ...] = Field(
        default=(),
        description="Namespaces whose pods may reach the engines' and gateways' ports through the "
        "NetworkPolicies the operator renders (for /metrics: the autoscaler's, Prometheus').",
    )
    tandem_image: str = Field(
        min_length=1, description="Image of the router and of simulated engines (`tandem ...`)."
    )
    redis_image: str = Field(default=DEFAULT_REDIS_IMAGE, min_length=1, description="KV pool image.")
    resync_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Period of the level-triggered reconcile of every InferenceService: it repairs "
        "drift and refreshes the status from the children.",
    )
    liveness_endpoint: str | None = Field(
        default=None, description="kopf liveness URL, e.g. http://0.0.0.0:8081/healthz; None: off."
    )
