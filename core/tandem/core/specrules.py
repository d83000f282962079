"""What a spec's schema cannot say, and reading a whole document.

- `SpecError` / `SpecInvalid`: problems with their dotted field paths.
- `check_rules`: the InferenceService's cross-field rules, e.g. `autoscaling.min <= autoscaling.max`;
  `access_rules`, the gateway's part, shared with the InferenceGateway (`tandem.core.gateway`).
- `parse_inference_service`: structure (`tandem.core.spec`), then the rules; raises `SpecInvalid`
  listing every error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tandem.core.spec import (
    ENGINE_BLOCK_SIZE,
    AuthSpec,
    DecodeSpec,
    InferenceService,
    InferenceServiceSpec,
    PrefillSpec,
    RouterSpec,
    TenantSpec,
    max_prefill_replicas,
)


@dataclass(frozen=True)
class SpecError:
    """One problem in a document: a dotted field path (`spec.decode.autoscaling.max`) and a message."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecInvalid(ValueError):
    """The document is not a valid InferenceService; `errors` lists every problem found."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def check_rules(spec: InferenceServiceSpec) -> list[SpecError]:
    """Cross-field rules that a structural schema cannot express. Pure; empty list when valid."""
    errors: list[SpecError] = []
    pools: tuple[tuple[str, PrefillSpec | DecodeSpec], ...] = (
        ("prefill", spec.prefill),
        ("decode", spec.decode),
    )
    for pool_name, pool in pools:
        scaling = pool.autoscaling
        base = f"spec.{pool_name}.autoscaling"
        if scaling.panic_window_seconds > scaling.stable_window_seconds:
            errors.append(
                SpecError(
                    f"{base}.panicWindowSeconds",
                    f"must be <= {base}.stableWindowSeconds "
                    f"({scaling.panic_window_seconds:g} > {scaling.stable_window_seconds:g})",
                )
            )
        if scaling.min > scaling.max:
            errors.append(SpecError(f"{base}.min", f"must be <= {base}.max ({scaling.min} > {scaling.max})"))
        elif scaling.enabled and not scaling.min <= pool.replicas <= scaling.max:
            errors.append(
                SpecError(
                    f"spec.{pool_name}.replicas",
                    f"must lie within autoscaling bounds [{scaling.min}, {scaling.max}] "
                    f"when autoscaling is enabled (got {pool.replicas})",
                )
            )
    if spec.decode.replicas == 0 and not spec.decode.autoscaling.enabled:
        errors.append(
            SpecError(
                "spec.decode.replicas",
                "0 decode replicas needs decode.autoscaling.enabled (scale from zero with min 0)",
            )
        )
    if spec.disaggregation.mode == "always" and max_prefill_replicas(spec) == 0:
        errors.append(
            SpecError(
                "spec.prefill.replicas",
                "disaggregation.mode 'always' needs at least one prefill replica",
            )
        )
    if spec.kv_pool.chunk_size % ENGINE_BLOCK_SIZE:
        errors.append(
            SpecError(
                "spec.kvPool.chunkSize",
                f"must be a multiple of the engine block size {ENGINE_BLOCK_SIZE} "
                f"(got {spec.kv_pool.chunk_size})",
            )
        )
    errors.extend(_router_rules(spec.router))
    return errors


def _router_rules(router: RouterSpec) -> list[SpecError]:
    return access_rules(router.auth, router.tenants, at="spec.router")


def access_rules(auth: AuthSpec, tenants: Sequence[TenantSpec], *, at: str) -> list[SpecError]:
    """A gateway's API keys need their Secret, and a tenant is listed once (`at`: where the two
    fields are, `spec.router` for an InferenceService, `spec` for an InferenceGateway)."""
    errors: list[SpecError] = []
    if auth.enabled and auth.api_keys_secret is None:
        errors.append(SpecError(f"{at}.auth.apiKeysSecret", "is required when auth.enabled is true"))
    seen: set[str] = set()
    for i, tenant in enumerate(tenants):
        if tenant.name in seen:
            errors.append(SpecError(f"{at}.tenants[{i}].name", f"duplicate tenant {tenant.name!r}"))
        seen.add(tenant.name)
    return errors


def parse_inference_service(document: Mapping[str, Any]) -> InferenceService:
    """Validate a whole document (structure, then cross-field rules); raise `SpecInvalid` on errors."""
    try:
        isvc = InferenceService.model_validate(document)
    except ValidationError as exc:
        raise SpecInvalid([from_pydantic_error(err) for err in exc.errors()]) from None
    errors = check_rules(isvc.spec)
    if errors:
        raise SpecInvalid(errors)
    return isvc


def from_pydantic_error(err: Mapping[str, Any]) -> SpecError:
    """A pydantic error as a `SpecError` with a dotted field path (`spec.decode.replicas`)."""
    parts = [str(p) for p in err["loc"]]
    # Pydantic appends the tag of a failed union/literal choice; the field path is what users need.
    path = ".".join(p if not p.isdigit() else f"[{p}]" for p in parts).replace(".[", "[")
    message = str(err["msg"])
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    return SpecError(path or "<document>", _readable(message))


def _readable(message: str) -> str:
    return re.sub(r"^Value error, ", "", message)
