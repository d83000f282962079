"""The InferenceService's status, derived from what its children report. Pure: no I/O, no clock.

Conditions follow the Kubernetes API conventions: one per type, `status` True/False/Unknown, a
CamelCase `reason`, a human `message`, `lastTransitionTime` changed only when `status` flips, and
`observedGeneration` naming the spec generation they describe. `Ready` is True only when every
component condition is True.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

ConditionType = Literal[
    "Ready",
    "PrefillReady",
    "DecodeReady",
    "KVPoolReady",
    "RouterReady",
    "ReplicasReady",
    "ServedByGateway",
    "AdaptersReady",
]
Phase = Literal["Progressing", "Ready", "Invalid", "Blocked"]
_M = TypeVar("_M", bound="BaseModel")
COMPONENTS: tuple[ConditionType, ...] = ("PrefillReady", "DecodeReady", "KVPoolReady", "RouterReady")


class _StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Condition(_StatusModel):
    """One observation about the InferenceService (Kubernetes condition conventions)."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*$", description="CamelCase machine token.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When `status` last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Spec generation observed.")


class PoolStatus(_StatusModel):
    """Replica counts of one engine pool."""

    replicas: int = Field(ge=0, description="Desired replicas (the Deployment's, so the autoscaler's).")
    ready: int = Field(ge=0, description="Ready replicas.")
    summary: str = Field(description="`ready/desired`, for `kubectl get`.")


# Written by `tandem autoscaler` (a merge patch of `status.autoscaling`), never by the operator, whose
# status patches name only the other keys and so leave this one alone.
class PoolAutoscalingStatus(_StatusModel):
    """What the autoscaler last decided for one pool (written by the autoscaler, not the operator)."""

    desired: int = Field(ge=0, description="Replicas the autoscaler asks for.")
    ready: int = Field(ge=0, description="Ready engines it found (the pool's EndpointSlices).")
    reason: str = Field(default="", description="Why: the decider's reasoning, or why it holds.")
    last_scale_time: str | None = Field(
        default=None, description="When the autoscaler last changed the replicas (RFC 3339)."
    )
    panic: bool = Field(default=False, description="True while the pool is in panic mode (no scale-down).")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="`ReplicasReady`: False once requested replicas stayed not ready past "
        "readyTimeoutSeconds and the autoscaler stopped waiting for them.",
    )


class AutoscalingStatus(_StatusModel):
    """The autoscaler's view of each autoscaled pool."""

    prefill: PoolAutoscalingStatus | None = None
    decode: PoolAutoscalingStatus | None = None


class AdapterStatus(_StatusModel):
    """One declared LoRA adapter as the operator last judged it."""

    name: str = Field(description="The adapter's served name.")
    source: str = Field(description="Its source as declared.")
    state: Literal["Ready", "Pending", "Failed"] = Field(
        description="Ready: the engines can load it; Pending: not yet known or in progress; Failed: "
        "it cannot be served (reason)."
    )
    reason: str = Field(default="", description="Why it is in this state, in one line.")


class InferenceServiceStatus(_StatusModel):
    """What the operator last observed about the InferenceService and its children."""

    observed_generation: int | None = Field(default=None, description="Spec generation reconciled.")
    phase: Phase | None = Field(default=None, description="Summary: Progressing, Ready, Invalid or Blocked.")
    conditions: list[Condition] = Field(default_factory=list)
    prefill: PoolStatus | None = None
    decode: PoolStatus | None = None
    endpoint: str | None = Field(default=None, description="In-cluster OpenAI base URL of the router.")
    gateway: str | None = Field(
        default=None, description="The InferenceGateway serving this model, when one selects it."
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="Written by the autoscaler: its last decision per autoscaled pool."
    )
    adapters: list[AdapterStatus] | None = Field(
        default=None, description="Each adapter of spec.adapters: Ready, Pending or Failed, and why."
    )
    adapter_summary: str | None = Field(
        default=None,
        description="`ready/declared` adapters, and `+N catalog` for a catalog's adapters the gateway "
        "serves besides, for `kubectl get`.",
    )


@dataclass(frozen=True)
class Workload:
    """What one Deployment (or an engine pool's LeaderWorkerSet, whose status has the same counts,
    in groups) reports, reduced to what readiness needs."""

    exists: bool
    desired: int = 0
    ready: int = 0
    updated: int = 0
    total: int = 0
    rolled_out: bool = False

    @classmethod
    def observe(cls, deployment: Mapping[str, Any] | None) -> Workload:
        """Read a Deployment as the API returns it (None: it does not exist)."""
        if deployment is None:
            return cls(exists=False)
        status = deployment.get("status") or {}
        generation = deployment.get("metadata", {}).get("generation", 0)
        return cls(
            exists=True,
            desired=int(deployment.get("spec", {}).get("replicas", 1)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            total=int(status.get("replicas", 0)),
            rolled_out=int(status.get("observedGeneration", 0)) >= int(generation)
            or _unversioned(deployment),
        )

    def pool_status(self) -> PoolStatus:
        return PoolStatus(replicas=self.desired, ready=self.ready, summary=f"{self.ready}/{self.desired}")


def _unversioned(workload: Mapping[str, Any]) -> bool:
    """A LeaderWorkerSet older than v0.9 reports no observedGeneration: its counts are taken as
    they are (the updated and ready replicas still say whether the rollout is done)."""
    status = workload.get("status") or {}
    return workload.get("kind") == "LeaderWorkerSet" and bool(status) and "observedGeneration" not in status


@dataclass(frozen=True)
class Verdict:
    """A condition's content before time and generation are stamped on it."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


def judge_workload(workload: Workload, *, kind: str, name: str) -> Verdict:
    """Readiness of one Deployment, as kstatus judges it: the newest generation is observed, every
    desired replica runs the newest template and is ready, and no old replica is left."""
    if not workload.exists:
        return Verdict("False", "Creating", f"{kind} {name} does not exist yet")
    if not workload.rolled_out or workload.updated < workload.desired or workload.total > workload.desired:
        return Verdict("False", "RollingOut", f"{workload.updated}/{workload.desired} replicas updated")
    if workload.ready < workload.desired:
        return Verdict("False", "ReplicasNotReady", f"{workload.ready}/{workload.desired} replicas ready")
    if workload.desired == 0:
        return Verdict("True", "ScaledToZero", "0 replicas desired")
    return Verdict("True", "ReplicasReady", f"{workload.ready}/{workload.desired} replicas ready")


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    verdicts: Mapping[ConditionType, Verdict],
    *,
    generation: int | None,
    now: str,
) -> list[Condition]:
    """Previous conditions updated by `verdicts`; `lastTransitionTime` moves only on a flip.

    Conditions without a verdict are kept as they were. Order: Ready first, then components.
    """
    return merge_typed(Condition, ("Ready", *COMPONENTS), previous, verdicts, generation=generation, now=now)


def merge_typed(
    model: type[_M],
    types: Sequence[str],
    previous: Sequence[Mapping[str, Any]],
    verdicts: Mapping[Any, Verdict],
    *,
    generation: int | None,
    now: str,
) -> list[_M]:
    """`merge_conditions` for any kind's condition `model` and its condition `types`, in that order."""
    old = {c.get("type"): c for c in previous}
    result: list[_M] = []
    for ctype in types:
        verdict, before = verdicts.get(ctype), old.get(ctype)
        if verdict is None:
            kept = _kept(model, before)
            if kept is not None:
                result.append(kept)
            continue
        flipped = before is None or before.get("status") != verdict.status
        since = now if flipped or before is None else str(before.get("lastTransitionTime", now))
        fields = {
            "type": ctype,
            "status": verdict.status,
            "reason": verdict.reason,
            "message": verdict.message,
            "last_transition_time": since,
            "observed_generation": generation,
        }
        result.append(model.model_validate(fields))
    return result


def derive_status(
    *,
    workloads: Mapping[ConditionType, Workload | None],
    names: Mapping[ConditionType, str],
    problems: Sequence[str],
    endpoint: str,
    generation: int | None,
    previous: Mapping[str, Any],
    now: str,
    overrides: Mapping[ConditionType, Verdict] | None = None,
) -> InferenceServiceStatus:
    """Status of a valid InferenceService from its Deployments.

    `workloads` maps each component condition to its Deployment (None for a KV pool that is an
    external Redis); `names` gives the Deployment names for messages; `problems` are reasons the
    operator could not apply the desired state (a child owned by someone else, an API error), which
    make Ready False with phase Blocked; `overrides` replace component verdicts (a router that an
    InferenceGateway replaces).
    """
    verdicts: dict[ConditionType, Verdict] = {}
    for ctype in COMPONENTS:
        workload = workloads.get(ctype)
        if overrides and ctype in overrides:
            verdicts[ctype] = overrides[ctype]
        elif workload is None:
            verdicts[ctype] = Verdict("True", "ExternalRedis", "the KV pool is spec.kvPool.redis.url")
        else:
            verdicts[ctype] = judge_workload(workload, kind="Deployment", name=names[ctype])
    waiting = [f"{t}: {v.message}" for t, v in verdicts.items() if v.status != "True"]
    if problems:
        verdicts["Ready"] = Verdict("False", "ApplyBlocked", "; ".join(problems))
        phase: Phase = "Blocked"
    elif waiting:
        verdicts["Ready"] = Verdict("False", "ComponentsNotReady", "; ".join(waiting))
        phase = "Progressing"
    else:
        verdicts["Ready"] = Verdict("True", "AllComponentsReady", "every component is ready")
        phase = "Ready"
    pools = {
        t: (workloads.get(t) or Workload(exists=False)).pool_status() for t in ("PrefillReady", "DecodeReady")
    }
    return InferenceServiceStatus(
        observed_generation=generation,
        phase=phase,
        conditions=merge_conditions(previous.get("conditions", []), verdicts, generation=generation, now=now),
        prefill=pools["PrefillReady"],
        decode=pools["DecodeReady"],
        endpoint=endpoint,
    )


def invalid_status(
    *,
    errors: Sequence[str],
    generation: int | None,
    previous: Mapping[str, Any],
    now: str,
    reason: str = "InvalidSpec",
    phase: Phase = "Invalid",
) -> InferenceServiceStatus:
    """Status of a spec the operator will not apply: Ready=False with `reason` (InvalidSpec: the model
    rejects it, phase Invalid; SecretRefused: it names a Secret it may not use, phase Blocked) and the
    errors as message; component conditions, replica counts and adapters stay as last observed (no
    child was changed)."""
    conditions = merge_conditions(
        previous.get("conditions", []),
        {"Ready": Verdict("False", reason, "; ".join(errors))},
        generation=generation,
        now=now,
    )
    kept = [c for c in previous.get("conditions", []) if c.get("type") == "AdaptersReady"]
    adapters = [_kept(AdapterStatus, a) for a in previous.get("adapters") or []]
    return InferenceServiceStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conditions + [c for c in (_kept(Condition, k) for k in kept) if c is not None],
        prefill=_kept(PoolStatus, previous.get("prefill")),
        decode=_kept(PoolStatus, previous.get("decode")),
        endpoint=previous.get("endpoint"),
        adapters=[a for a in adapters if a is not None] or None,
        adapter_summary=previous.get("adapterSummary"),
    )


def _kept(model: type[_M], value: Any) -> _M | None:
    """A status part as previously written, or None when absent or not of our making."""
    try:
        return model.model_validate(value) if value is not None else None
    except ValidationError:
        return None


#: Top-level status fields the operator removes when its status has none (merge patch: null).
CLEARED = ("gateway", "adapters", "adapterSummary")


def as_patch(status: BaseModel, current: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status fields whose value differs from `current` (empty: nothing to write);
    a `CLEARED` field the status no longer has is removed."""
    desired = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch: dict[str, Any] = {key: value for key, value in desired.items() if current.get(key) != value}
    patch |= {key: None for key in CLEARED if key in current and key not in desired}
    return patch
