"""Tuning knobs of one gateway process, validated once at start-up.

These are properties of the router process, not of the InferenceService, so they are not in
`RouterConfig`: `tandem router` sets them from flags and tests pass them to `create_app`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
    models_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="Per-engine limit when aggregating /v1/models."
    )


class DisaggregationSettings(_Settings):
    prefill_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Whole prefill request (connect to last byte); on expiry: decode-only fallback.",
    )


class RouterSettings(_Settings):
    rotation: RotationSettings = Field(default_factory=RotationSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    disaggregation: DisaggregationSettings = Field(default_factory=DisaggregationSettings)
