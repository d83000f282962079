"""The InferenceGateway's status, and what an InferenceService's status says about the gateway serving
it. Pure: no I/O, no clock.

A gateway's conditions are `Ready` and `NamesConflict`, with the conventions of `tandem.operator.status`
(one per type, `lastTransitionTime` moves only when `status` flips, `observedGeneration`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from tandem.operator.status import Condition, Verdict, _StatusModel, merge_typed

GatewayConditionType = Literal["Ready", "NamesConflict"]
GATEWAY_CONDITIONS: tuple[GatewayConditionType, ...] = ("Ready", "NamesConflict")


class GatewayCondition(_StatusModel):
    """One observation about the InferenceGateway (Kubernetes condition conventions)."""

    type: GatewayConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*$", description="CamelCase machine token.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When `status` last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation observed.")


class GatewayServiceStatus(_StatusModel):
    """One InferenceService the gateway serves."""

    name: str = Field(description="The InferenceService.")
    model: str = Field(description="Its served name (spec.model.servedName, else spec.model.name).")
    ready: bool = Field(description="Whether its Ready condition is True.")


class InferenceGatewayStatus(_StatusModel):
    """What the operator last observed about the InferenceGateway."""

    observed_generation: int | None = Field(default=None, description="Spec generation reconciled.")
    conditions: list[GatewayCondition] = Field(default_factory=list)
    models: list[str] = Field(
        default_factory=list, description="Every name a client may send: served names, then aliases."
    )
    model_names: str | None = Field(default=None, description="`models`, comma-separated, for `kubectl get`.")
    services: list[GatewayServiceStatus] = Field(
        default_factory=list, description="The InferenceServices it serves, each ready or not."
    )
    ready_services: str | None = Field(default=None, description="`ready/served`, for `kubectl get`.")
    endpoint: str | None = Field(default=None, description="In-cluster OpenAI base URL of the gateway.")


def gateway_conditions(
    previous: Sequence[Mapping[str, Any]],
    verdicts: Mapping[GatewayConditionType, Verdict],
    *,
    generation: int | None,
    now: str,
) -> list[GatewayCondition]:
    """Previous conditions updated by `verdicts` (`lastTransitionTime` moves only on a flip); a type
    without a verdict is kept as it was."""
    kinds = GATEWAY_CONDITIONS
    return merge_typed(GatewayCondition, kinds, previous, verdicts, generation=generation, now=now)


def served_by_condition(
    previous: Sequence[Mapping[str, Any]], *, gateway: str, endpoint: str, generation: int | None, now: str
) -> Condition:
    """An InferenceService's `ServedByGateway` condition: the gateway `gateway` serves its model."""
    before = next((c for c in previous if c.get("type") == "ServedByGateway"), None)
    same = before is not None and before.get("status") == "True"
    return Condition(
        type="ServedByGateway",
        status="True",
        reason="SelectedByGateway",
        message=f"InferenceGateway {gateway} serves this model at {endpoint}",
        last_transition_time=str(before.get("lastTransitionTime", now)) if same and before else now,
        observed_generation=generation,
    )
