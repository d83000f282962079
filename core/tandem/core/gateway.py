"""One endpoint for many models: the `InferenceGateway` kind, and the gateway file that serves it.

An `InferenceGateway` (group `tandem.dev`, version `v1alpha1`, short name `igw`) owns an OpenAI endpoint
for every InferenceService its `selector` selects: the gateway Deployment and Service, API keys,
tenants (weights, bands, rate limits, cache groups) and the queue bound. Each selected service keeps
its own pools, routing policy, SLO, P/D mode and autoscaling; the gateway routes a request by its
body's `model` to that service's pools. A service no gateway selects keeps its own gateway.

Names a client may send (`served_names`):
- each selected service's `spec.model.servedName` (else `spec.model.name`), and the names of its
  declared adapters (`spec.adapters[].name`; a catalog's adapters are known only to its engines);
- each alias: a client-facing name mapped to one service, or to several with weights (canary, A/B,
  blue/green). The answer's `model` is the name the client sent.

A name that two selected services claim, or an alias that names a served model or another alias,
is refused (`name_conflicts`): the operator reports it on both kinds (a condition and an Event naming
both) and serves neither.

`GatewayFile` is what the operator (a ConfigMap) and `tandem up` hand to `tandem router --config`
when one process fronts several services: the gateway-level settings and, per service, exactly the
`RouterConfig` a single-service gateway reads today. Living in `tandem.core` lets the operator and the
local runtime write it without importing the router.

Example (two versions of a model behind one name, 90/10):

    apiVersion: tandem.dev/v1alpha1
    kind: InferenceGateway
    metadata: {name: fleet}
    spec:
      selector: {matchLabels: {tandem.dev/gateway: fleet}}
      aliases:
        - name: chat
          targets: [{service: qwen-v1, weight: 90}, {service: qwen-v2, weight: 10}]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from tandem.core.routerconfig import RouterConfig
from tandem.core.spec import (
    DNS_LABEL_PATTERN,
    AuthSpec,
    InferenceService,
    InferenceServiceSpec,
    NetworkPolicySpec,
    ObjectMeta,
    RateLimitSpec,
    SpecModel,
    TenantSpec,
)
from tandem.core.specrules import (
    SpecError,
    SpecInvalid,
    access_rules,
    from_pydantic_error,
    parse_inference_service,
)
from tandem.core.tracing import TracingSpec

GATEWAY_KIND = "InferenceGateway"
GATEWAY_PLURAL = "inferencegateways"
GATEWAY_SHORT_NAME = "igw"
#: Longest gateway name: its children are named `<name>-gateway[-keys]`, within 63 characters.
MAX_GATEWAY_NAME = 50

#: A client-facing model name: what OpenAI clients send in `model` (vLLM's served names are free text;
#: these are bounded so that they can be metric label values and Kubernetes status entries).
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,252}$"
#: Most targets an alias may split over (GIE's `InferenceModel.targetModels` bound).
MAX_TARGETS = 10


class LabelSelector(SpecModel):
    """Kubernetes' label selector, `matchLabels` only (every label must match). Empty selects every
    InferenceService in the gateway's namespace."""

    match_labels: dict[str, str] = Field(default_factory=dict)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items())


class AliasTarget(SpecModel):
    """One service an alias sends a share of its requests to."""

    service: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63, description="A selected InferenceService.")
    weight: int = Field(default=1, ge=0, le=1_000_000, description="Share of the alias's requests (0: none).")


class AliasSpec(SpecModel):
    """A client-facing name mapped to one service, or to several with weights. The split is exact over
    time (smooth weighted round robin), and the answer's `model` is the alias."""

    name: str = Field(pattern=MODEL_NAME_PATTERN, description="The name clients send in `model`.")
    targets: list[AliasTarget] = Field(min_length=1, max_length=MAX_TARGETS)

    @model_validator(mode="after")
    def _weights(self) -> AliasSpec:
        services = [t.service for t in self.targets]
        if len(set(services)) != len(services):
            raise ValueError(f"alias {self.name!r} names a service twice")
        if sum(t.weight for t in self.targets) <= 0:
            raise ValueError(f"alias {self.name!r}: the weights sum to 0")
        return self


class InferenceGatewaySpec(SpecModel):
    """The desired state of one multi-model gateway."""

    selector: LabelSelector = Field(default_factory=LabelSelector, description="InferenceServices served.")
    replicas: int = Field(default=2, ge=1, le=100)
    workers: int = Field(default=1, ge=1, le=64, description="Gateway processes per replica.")
    auth: AuthSpec = Field(default_factory=AuthSpec)
    tenants: list[TenantSpec] = Field(
        default_factory=list, description="Weights, bands, limits, cache groups."
    )
    rate_limits: RateLimitSpec = Field(default_factory=RateLimitSpec, description="Per-tenant limits.")
    max_queue: int = Field(
        default=1000, ge=0, le=1_000_000, description="The gateway's queue bound, all models."
    )
    aliases: list[AliasSpec] = Field(default_factory=list, max_length=1000)
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    tracing: TracingSpec | None = Field(
        default=None,
        description="OpenTelemetry traces of the gateway (each service's engines follow their own "
        "spec.tracing).",
    )
    metrics_token: bool = Field(
        default=False,
        description="Require a bearer token on the gateway's diagnostics port (9090, `/metrics`): the "
        "operator generates it into the Secret `<name>-metrics-token`; without it the port is open "
        "only to the operator's metrics namespaces (NetworkPolicy).",
    )

    @model_validator(mode="after")
    def _unique_aliases(self) -> InferenceGatewaySpec:
        names = [a.name for a in self.aliases]
        if len(set(names)) != len(names):
            raise ValueError("alias names must be unique")
        return self


class InferenceGateway(SpecModel):
    """A whole `InferenceGateway` document (apiVersion, kind, metadata, spec)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    api_version: Literal["tandem.dev/v1alpha1"]
    kind: Literal["InferenceGateway"]
    metadata: ObjectMeta
    spec: InferenceGatewaySpec


def parse_document(document: Mapping[str, Any]) -> InferenceService | InferenceGateway:
    """An InferenceGateway or InferenceService document, by its `kind`, validated; raises
    `SpecInvalid` (a multi-document file holds both kinds: `tandem render`, `tandem up`)."""
    if document.get("kind") == GATEWAY_KIND:
        return parse_inference_gateway(document)
    return parse_inference_service(document)


def parse_inference_gateway(document: Mapping[str, Any]) -> InferenceGateway:
    """Validate a whole InferenceGateway document; raise `SpecInvalid` listing every error with its
    field path (`spec.aliases[0].targets`)."""
    try:
        gateway = InferenceGateway.model_validate(document)
    except ValidationError as exc:
        raise SpecInvalid([from_pydantic_error(err) for err in exc.errors()]) from None
    errors = check_gateway_rules(gateway)
    if errors:
        raise SpecInvalid(errors)
    return gateway


def check_gateway_rules(gateway: InferenceGateway) -> list[SpecError]:
    """Rules a structural schema cannot express. Pure; empty when valid."""
    errors: list[SpecError] = []
    if len(gateway.metadata.name) > MAX_GATEWAY_NAME:
        errors.append(SpecError("metadata.name", f"at most {MAX_GATEWAY_NAME} characters for a gateway"))
    errors.extend(access_rules(gateway.spec.auth, gateway.spec.tenants, at="spec"))
    return errors


def service_env(base: str, service: str) -> str:
    """The environment variable holding one service's copy of a credential in a gateway serving
    several: `service_env("TANDEM_KV_POOL_KEY", "qwen-v1")` is `TANDEM_KV_POOL_KEY_QWEN_V1` (service
    names are DNS labels, so `-` → `_` keeps them apart)."""
    return f"{base}_{re.sub(r'[^A-Za-z0-9]', '_', service).upper()}"


class GatewayService(SpecModel):
    """One selected service as the gateway process reads it.

    Each service has its own credentials (its pool key, its Redis password, its engines' API key),
    so a gateway serving several reads each from the variable named here; unset: the single-service
    variable (`TANDEM_KV_POOL_KEY`, `TANDEM_KVPOOL_PASSWORD`, `TANDEM_ENGINE_API_KEY`), which is what
    `tandem up` sets for every service of a run.
    """

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=63)
    config: RouterConfig
    pool_key_env: str | None = Field(
        default=None, pattern=r"^[A-Z_][A-Z0-9_]*$", description="Variable holding this service's pool key."
    )
    kv_pool_password_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Variable holding this service's Redis password (none: the pool has no password).",
    )
    engine_api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="Variable holding the key this service's engines require.",
    )


class GatewayFile(SpecModel):
    """`tandem router --config FILE` for a gateway in front of several services (module docstring)."""

    kind: Literal["gateway"] = "gateway"
    gateway: str = Field(min_length=1, max_length=253, description="The InferenceGateway's name.")
    spec: InferenceGatewaySpec
    services: list[GatewayService] = Field(min_length=1)
    api_keys_file: str | None = Field(
        default=None,
        min_length=1,
        description="The gateway's API key table (`spec.auth`: the mounted apiKeysSecret); the services' "
        "own `config.apiKeysFile` is unset, since keys and tenants are the gateway's.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GatewayFile:
        conflicts = name_conflicts(
            {s.name: service_names(s.config.spec) for s in self.services}, self.spec.aliases
        )
        if conflicts:
            raise ValueError("; ".join(conflicts))
        known = {s.name for s in self.services}
        for alias in self.spec.aliases:
            missing = [t.service for t in alias.targets if t.service not in known]
            if missing:
                raise ValueError(f"alias {alias.name!r} targets services not served: {', '.join(missing)}")
        return self


def served_names(models: Mapping[str, str], aliases: Iterable[AliasSpec]) -> list[str]:
    """Every name a client may send: the services' served names (`models`: service → name), then the
    aliases', in order."""
    return [*models.values(), *(a.name for a in aliases)]


def service_names(spec: InferenceServiceSpec) -> tuple[str, ...]:
    """The names a service serves in a gateway: its public model name, then its declared adapters'."""
    return (spec.model.public_name, *(a.name for a in spec.adapters))


def name_conflicts(models: Mapping[str, str | Sequence[str]], aliases: Iterable[AliasSpec]) -> list[str]:
    """Why these names cannot be served together, one line per conflict ([] when they can).
    `models`: service → its served name, or every name it serves (`service_names`: adapters too).

    >>> name_conflicts({"a": "qwen", "b": "qwen"}, [])
    ["model name 'qwen' is claimed by services a and b"]
    >>> name_conflicts({"a": ("qwen", "sql"), "b": ("llama", "sql")}, [])
    ["model name 'sql' is claimed by services a and b"]
    """
    out: list[str] = []
    owners: dict[str, list[str]] = {}
    for service, names in models.items():
        for name in dict.fromkeys([names] if isinstance(names, str) else names):
            owners.setdefault(name, []).append(service)
    for name, services in owners.items():
        if len(services) > 1:
            out.append(f"model name {name!r} is claimed by services {' and '.join(sorted(services))}")
    for alias in aliases:
        if alias.name in owners:
            out.append(f"alias {alias.name!r} is the model name of service {sorted(owners[alias.name])[0]}")
    return out
