"""The autoscaler's `status.autoscaling` block fits the InferenceService's status model and CRD schema,
and the operator's own status patches never name it (so they cannot erase it).

Real: the autoscaler's pure builder, the operator's status model and `as_patch`, the generated CRD
validated with jsonschema (what an API server's structural schema checks, minus defaulting)."""

from __future__ import annotations

from typing import Any

import jsonschema  # type: ignore[import-untyped]

from tandem.autoscaler.cluster import PoolAutoscalingView, autoscaling_status, ready_condition
from tandem.operator.crd import crd_manifest
from tandem.operator.status import InferenceServiceStatus, PoolStatus, as_patch

BLOCK = autoscaling_status(
    {
        "decode": PoolAutoscalingView(
            desired=4,
            ready=2,
            reason="panic: 6s window wants 4",
            panic=True,
            last_scale_time="2026-11-22T06:00:00Z",
            condition=ready_condition(
                ready=False, message="decode: 2 of 4 replicas not ready", since="2026-11-22T06:10:00Z"
            ),
        ),
        "prefill": PoolAutoscalingView(desired=1, ready=1, reason="stable: 60s window wants 1", panic=False),
    }
)


def status_schema() -> dict[str, Any]:
    (version,) = crd_manifest()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_the_block_validates_against_the_status_model_and_the_crd() -> None:
    status = InferenceServiceStatus.model_validate(BLOCK)
    assert status.autoscaling is not None and status.autoscaling.decode is not None
    assert status.autoscaling.decode.last_scale_time == "2026-11-22T06:00:00Z"
    (condition,) = status.autoscaling.decode.conditions
    assert (condition.type, condition.status) == ("ReplicasReady", "False")
    assert condition.reason == "ReplicasNotReady"
    assert status.autoscaling.prefill is not None and status.autoscaling.prefill.last_scale_time is None
    jsonschema.validate(BLOCK, status_schema())


def test_the_operators_status_patch_leaves_the_autoscalers_block_alone() -> None:
    current = {**BLOCK, "phase": "Progressing"}
    mine = InferenceServiceStatus(
        phase="Ready",
        decode=PoolStatus(replicas=4, ready=4, summary="4/4"),
        endpoint="http://demo-router:8080/v1",
    )
    patch = as_patch(mine, current)
    assert "autoscaling" not in patch and patch["phase"] == "Ready"
