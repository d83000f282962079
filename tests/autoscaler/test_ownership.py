"""A pool's Deployment is scaled only when it is its InferenceService's: hostile Deployments by name.

Real: the autoscaler's ownership check (`OwnerCheck`), its actuator (`KubePool`), its HTTP client
(`HttpCluster`) and a decode controller. Emulated: the Kubernetes API (kmock with the operator tests'
`StampingEmulator`: server-given uids, the scale subresource landing on the Deployment, owners'
garbage collection); the scrape is a stub reporting a loaded engine, so every round wants a scale-up.
The pure `owners_of` and `scale_patch` are tables.
"""

from __future__ import annotations

import logging
from typing import Any

import kmock as kmock_lib
import pytest
from tests.autoscaler.kube_objects import (
    deployment,
    owned_deployment,
    owner_reference,
    scale_patches,
    service,
)
from tests.operator.cluster_state import NAMESPACE, find, path_of

from tandem.autoscaler.cluster import Owners, ScaleRefused, ServiceRef, owners_of, scale_patch
from tandem.autoscaler.control import PoolController
from tandem.autoscaler.decider import DeciderParams
from tandem.autoscaler.incluster import SCALE_REREAD_S, KubePool
from tandem.autoscaler.kube import HttpCluster
from tandem.autoscaler.ownership import OwnerCheck
from tandem.autoscaler.readings import EngineReading

DEMO = ServiceRef(NAMESPACE, "demo", "s1")


@pytest.mark.parametrize(
    ("references", "owned"),
    [
        ([{"kind": "InferenceService", "uid": "s1", "controller": True}], True),
        ([{"kind": "ReplicaSet", "uid": "r1"}, {"kind": "InferenceService", "uid": "s1"}], True),
        ([], False),
        (None, False),
        ([{"kind": "InferenceService", "uid": "s2", "controller": True}], False),  # another service
        ([{"kind": "Rollout", "uid": "s1"}], False),  # the service's uid under another kind
        ([{"kind": "InferenceService"}], False),  # no uid
        (["InferenceService/s1"], False),  # not a reference at all
    ],
)
def test_only_an_inference_service_reference_with_the_services_uid_owns_a_deployment(
    references: Any, owned: bool
) -> None:
    metadata: dict[str, Any] = {"name": "demo-decode", "uid": "d1"}
    if references is not None:
        metadata["ownerReferences"] = references
    owners = owners_of({"metadata": metadata})
    assert owners.workload_uid == "d1"
    assert owners.include(DEMO) is owned


def test_a_service_without_a_uid_owns_nothing() -> None:
    owners = Owners(workload_uid="d1", services=frozenset({""}))
    assert not owners.include(ServiceRef(NAMESPACE, "demo", ""))


def test_the_scale_patch_names_the_checked_deployment_as_a_precondition() -> None:
    assert scale_patch(4, uid="d1") == {"metadata": {"uid": "d1"}, "spec": {"replicas": 4}}
    assert scale_patch(4) == {"spec": {"replicas": 4}}


def loaded_decode(target: KubePool) -> PoolController:
    """A decode controller whose one engine is full (1 ready at 1.0 against 0.5: wants 2)."""

    async def scrape(urls: Any) -> dict[str, EngineReading | None]:
        return {"http://engine-0": EngineReading(kv_usage=1.0, running=1.0)}

    params = DeciderParams(min=1, max=4, target=0.5, panic_window_s=2.0, stable_window_s=4.0)
    return PoolController(service=target.ref.key, pool="decode", params=params, target=target, scrape=scrape)


def deployment_reads(api: kmock_lib.KubernetesEmulator) -> int:
    """GETs of the demo-decode Deployment itself (not its scale subresource)."""
    path = path_of("Deployment", "demo-decode")
    return sum(1 for r in list(api) if r.method.value == "GET" and str(r.url.path) == path)


def counted(cluster: HttpCluster) -> tuple[list[tuple[str, str]], OwnerCheck]:
    """An ownership check that records each refusal (service, pool), as the metrics count them."""
    refusals: list[tuple[str, str]] = []
    return refusals, OwnerCheck(cluster=cluster, refused=lambda ref, pool: refusals.append((ref.key, pool)))


HOSTILE = ["not owned", "owned by another InferenceService", "the service's uid under another kind"]


@pytest.mark.parametrize("case", HOSTILE)
async def test_a_deployment_with_the_pools_name_that_is_not_the_services_is_never_scaled(
    api: kmock_lib.KubernetesEmulator,
    cluster: HttpCluster,
    case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ref = await service(api, "demo")
    other = await service(api, "other")
    owners = {
        "not owned": None,
        "owned by another InferenceService": [owner_reference(other.uid, name="other")],
        "the service's uid under another kind": [owner_reference(ref.uid, kind="Rollout", name="demo")],
    }[case]
    await deployment(api, "demo-decode", 1, owners=owners)
    refusals, check = counted(cluster)
    now = [0.0]
    target = KubePool(cluster=cluster, ref=ref, pool="decode", owners=check, clock=lambda: now[0])
    control = loaded_decode(target)

    with caplog.at_level(logging.WARNING, logger="tandem.autoscaler.ownership"):
        for step in range(4):  # every round wants 2 replicas; none may be asked of this Deployment
            now[0] = 10.0 + step
            with pytest.raises(ScaleRefused):
                await control.step(now=now[0])

    assert scale_patches(api) == []
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 1
    assert refusals == [(f"{NAMESPACE}/demo", "decode")] * 4
    warned = [r for r in caplog.records if r.getMessage().startswith("deployment not owned")]
    assert len(warned) == 4
    assert {(r.__dict__["service"], r.__dict__["deployment"]) for r in warned} == {
        (f"{NAMESPACE}/demo", "demo-decode")
    }
    assert deployment_reads(api) == 1  # the verdict is kept for this Deployment's uid


async def test_a_deployment_the_service_owns_is_scaled_and_read_whole_once(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    ref = await service(api, "demo")
    await owned_deployment(api, ref, "decode", 1)
    refusals, check = counted(cluster)
    target = KubePool(cluster=cluster, ref=ref, pool="decode", owners=check)

    assert await target.requested() == 1
    for replicas in (2, 3, 2):
        await target.scale(replicas, reason="test")

    assert scale_patches(api) == [{"replicas": 2}, {"replicas": 3}, {"replicas": 2}]
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 2
    assert refusals == [] and deployment_reads(api) == 1
    # Each patch carries the checked Deployment's uid: a Deployment replaced in between is refused (409).
    uid = (find(api, "Deployment", "demo-decode") or {})["metadata"]["uid"]
    patches = [r.data for r in list(api) if r.method.value == "PATCH" and str(r.url.path).endswith("/scale")]
    assert {p["metadata"]["uid"] for p in patches} == {uid}


async def test_a_deployment_replaced_under_the_same_name_is_checked_again_and_refused(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    ref = await service(api, "demo")
    await owned_deployment(api, ref, "decode", 1)
    refusals, check = counted(cluster)
    now = [100.0]
    target = KubePool(cluster=cluster, ref=ref, pool="decode", owners=check, clock=lambda: now[0])
    assert await target.requested() == 1
    await target.scale(2, reason="test")
    assert deployment_reads(api) == 1

    # Someone deletes it and creates their own under the same name.
    response = await api.delete(path_of("Deployment", "demo-decode"))
    assert response.status == 200, await response.text()
    await deployment(api, "demo-decode", 1)
    now[0] += SCALE_REREAD_S + 0.1  # the scale subresource is read again: another uid
    assert await target.requested() == 1
    with pytest.raises(ScaleRefused):
        await target.scale(3, reason="test")

    assert deployment_reads(api) == 2
    assert refusals == [(f"{NAMESPACE}/demo", "decode")]
    assert scale_patches(api) == [{"replicas": 2}]
    assert (find(api, "Deployment", "demo-decode") or {})["spec"]["replicas"] == 1


async def test_a_service_made_again_under_the_same_name_does_not_inherit_the_old_verdict(
    api: kmock_lib.KubernetesEmulator, cluster: HttpCluster
) -> None:
    """The verdict is about owners' uids, not names: a service with the old name and a new uid owns
    nothing its namesake owned."""
    ref = await service(api, "demo")
    await owned_deployment(api, ref, "decode", 1)
    refusals, check = counted(cluster)
    first = KubePool(cluster=cluster, ref=ref, pool="decode", owners=check)
    assert await first.requested() == 1
    await first.scale(2, reason="test")

    impostor = ServiceRef(NAMESPACE, "demo", "not-" + ref.uid)
    second = KubePool(cluster=cluster, ref=impostor, pool="decode", owners=check)
    assert await second.requested() == 2
    with pytest.raises(ScaleRefused):
        await second.scale(3, reason="test")
    assert scale_patches(api) == [{"replicas": 2}]
    assert refusals == [(f"{NAMESPACE}/demo", "decode")]
