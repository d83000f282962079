"""Status derivation: what the Deployments report in, conditions and phase out.

Real: tandem.operator.status (pure). Faked: nothing; the Deployments are dicts as the API returns
them, and `now` is a fixed timestamp.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.operator.status import (
    ConditionType,
    Verdict,
    Workload,
    as_patch,
    derive_status,
    invalid_status,
    judge_workload,
    merge_conditions,
)

T0 = "2026-11-22T03:00:00Z"
T1 = "2026-11-22T03:05:00Z"
NAMES: dict[ConditionType, str] = {
    "PrefillReady": "demo-prefill",
    "DecodeReady": "demo-decode",
    "KVPoolReady": "demo-kv",
    "RouterReady": "demo-router",
}


def deployment(
    replicas: int,
    *,
    ready: int,
    updated: int | None = None,
    total: int | None = None,
    rolled_out: bool = True,
) -> dict[str, Any]:
    status = {
        "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated,
        "replicas": replicas if total is None else total,
        "observedGeneration": 3 if rolled_out else 2,
    }
    return {"metadata": {"generation": 3}, "spec": {"replicas": replicas}, "status": status}


@pytest.mark.parametrize(
    ("observed", "verdict"),
    [
        (None, Verdict("False", "Creating", "Deployment d does not exist yet")),
        (deployment(2, ready=2, rolled_out=False), Verdict("False", "RollingOut", "2/2 replicas updated")),
        (deployment(2, ready=2, updated=1), Verdict("False", "RollingOut", "1/2 replicas updated")),
        (deployment(2, ready=2, total=3), Verdict("False", "RollingOut", "2/2 replicas updated")),
        (deployment(2, ready=1), Verdict("False", "ReplicasNotReady", "1/2 replicas ready")),
        (deployment(0, ready=0), Verdict("True", "ScaledToZero", "0 replicas desired")),
        (deployment(2, ready=2), Verdict("True", "ReplicasReady", "2/2 replicas ready")),
        (
            {"metadata": {}, "spec": {"replicas": 1}},
            Verdict("False", "RollingOut", "0/1 replicas updated"),
        ),
    ],
    ids=[
        "missing",
        "old generation",
        "not updated",
        "old pods left",
        "not ready",
        "zero",
        "ready",
        "no status yet",
    ],
)
def test_a_deployment_is_ready_when_every_desired_replica_is_updated_and_ready(
    observed: dict[str, Any] | None, verdict: Verdict
) -> None:
    assert judge_workload(Workload.observe(observed), kind="Deployment", name="d") == verdict


def status_of(workloads: dict[ConditionType, Workload | None], *, problems: list[str] | None = None) -> Any:
    return derive_status(
        workloads=workloads,
        names=NAMES,
        problems=problems or [],
        endpoint="http://demo-router.ns1.svc:8080/v1",
        generation=3,
        previous={},
        now=T0,
    )


def all_ready() -> dict[ConditionType, Workload | None]:
    return {
        "PrefillReady": Workload.observe(deployment(1, ready=1)),
        "DecodeReady": Workload.observe(deployment(2, ready=2)),
        "KVPoolReady": Workload.observe(deployment(1, ready=1)),
        "RouterReady": Workload.observe(deployment(2, ready=2)),
    }


def test_ready_is_true_only_when_every_component_is() -> None:
    status = status_of(all_ready())
    assert status.phase == "Ready"
    assert [(c.type, c.status) for c in status.conditions] == [
        ("Ready", "True"),
        ("PrefillReady", "True"),
        ("DecodeReady", "True"),
        ("KVPoolReady", "True"),
        ("RouterReady", "True"),
    ]
    assert status.prefill is not None and status.prefill.summary == "1/1"
    assert status.decode is not None and status.decode.summary == "2/2"
    assert all(c.observed_generation == 3 for c in status.conditions)


@pytest.mark.parametrize("component", ["PrefillReady", "DecodeReady", "KVPoolReady", "RouterReady"])
def test_one_component_not_ready_makes_ready_false_and_names_it(component: ConditionType) -> None:
    workloads = all_ready() | {component: Workload.observe(deployment(2, ready=1))}
    status = status_of(workloads)
    ready = status.conditions[0]
    assert (ready.type, ready.status, ready.reason) == ("Ready", "False", "ComponentsNotReady")
    assert ready.message == f"{component}: 1/2 replicas ready"
    assert status.phase == "Progressing"


def test_an_external_redis_counts_as_a_ready_kv_pool() -> None:
    status = status_of(all_ready() | {"KVPoolReady": None})
    kv = next(c for c in status.conditions if c.type == "KVPoolReady")
    assert (kv.status, kv.reason) == ("True", "ExternalRedis")
    assert status.phase == "Ready"


def test_problems_applying_children_block_the_service() -> None:
    status = status_of(all_ready(), problems=["ConfigMap ns1/demo-router exists and is not ours"])
    ready = status.conditions[0]
    assert (ready.status, ready.reason) == ("False", "ApplyBlocked")
    assert "demo-router" in ready.message
    assert status.phase == "Blocked"


def test_last_transition_time_moves_only_when_the_status_flips() -> None:
    first = merge_conditions([], {"Ready": Verdict("False", "ComponentsNotReady", "a")}, generation=1, now=T0)
    previous = [c.model_dump(by_alias=True) for c in first]
    same = merge_conditions(
        previous, {"Ready": Verdict("False", "ComponentsNotReady", "b")}, generation=2, now=T1
    )
    flipped = merge_conditions(
        previous, {"Ready": Verdict("True", "AllComponentsReady")}, generation=2, now=T1
    )
    assert same[0].last_transition_time == T0
    assert same[0].message == "b"
    assert flipped[0].last_transition_time == T1


def test_an_invalid_spec_sets_ready_false_and_keeps_what_was_observed() -> None:
    before = status_of(all_ready()).model_dump(mode="json", by_alias=True, exclude_none=True)
    status = invalid_status(
        errors=["spec.decode.autoscaling.min: must be <= spec.decode.autoscaling.max (9 > 4)"],
        generation=4,
        previous=before,
        now=T1,
    )
    ready = status.conditions[0]
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert "spec.decode.autoscaling.min" in ready.message
    assert ready.last_transition_time == T1
    assert status.phase == "Invalid"
    assert status.observed_generation == 4
    assert [c.model_dump() for c in status.conditions[1:]] == [
        c.model_dump() for c in status_of(all_ready()).conditions[1:]
    ]
    assert status.decode is not None and status.decode.summary == "2/2"


def test_a_previous_status_not_of_our_making_is_ignored() -> None:
    status = invalid_status(
        errors=["x: bad"],
        generation=1,
        previous={"decode": "nonsense", "conditions": [{"type": "Ready"}]},
        now=T0,
    )
    assert status.decode is None
    assert [c.type for c in status.conditions] == ["Ready"]


def test_the_status_patch_holds_only_changed_fields() -> None:
    status = status_of(all_ready())
    current = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert as_patch(status, current) == {}
    current["endpoint"] = "http://elsewhere"
    assert as_patch(status, current) == {"endpoint": "http://demo-router.ns1.svc:8080/v1"}
