"""The gateway's configuration file: what the operator (a ConfigMap) and `tandem up` (a file) hand to
`tandem router --config FILE`.

It carries the InferenceService spec itself (the router reads its `router`, `disaggregation` and `kvPool`
sections) plus where to find the engines. Living in `tandem.core` lets the operator and the local
runtime write it without importing the router.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.core.spec import DNS_LABEL_PATTERN, InferenceServiceSpec, SpecModel

EngineURL = Annotated[str, Field(pattern=r"^https?://[^/\s]+/?$")]


class StaticDiscovery(SpecModel):
    """Fixed engine base URLs, e.g. `http://127.0.0.1:8101`."""

    kind: Literal["static"] = "static"
    prefill: list[EngineURL] = Field(default_factory=list)
    decode: list[EngineURL] = Field(min_length=1)


class KubernetesDiscovery(SpecModel):
    """Engines found through the EndpointSlices of each pool's headless Service."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field(pattern=DNS_LABEL_PATTERN)
    prefill_service: str = Field(pattern=DNS_LABEL_PATTERN)
    decode_service: str = Field(pattern=DNS_LABEL_PATTERN)
    port: int = Field(default=8000, ge=1, le=65535)


class RouterConfig(SpecModel):
    """Everything one gateway process needs besides its listen address."""

    service: str = Field(min_length=1, description="Name of the InferenceService this gateway fronts.")
    spec: InferenceServiceSpec
    discovery: StaticDiscovery | KubernetesDiscovery = Field(discriminator="kind")
    kv_pool_url: str | None = Field(
        default=None, pattern=r"^(redis|rediss|unix)://", description="The KV pool's Redis URL."
    )
