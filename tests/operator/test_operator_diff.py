"""The merge patch that makes a live object match a desired manifest.

Real: tandem.operator.diff (pure). Faked: nothing; live objects carry the kind of extra fields a
real API server adds (defaults, status, other controllers' annotations).
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.operator.diff import covers, merge_patch, update_patch

DESIRED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d", "namespace": "ns", "labels": {"a": "1"}, "ownerReferences": [{"uid": "u"}]},
    "spec": {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "c", "image": "i:1", "args": ["--x", "1"]}]}},
    },
}
SERVER_DEFAULTED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {
        "name": "d",
        "namespace": "ns",
        "labels": {"a": "1"},
        "annotations": {"deployment.kubernetes.io/revision": "3"},
        "ownerReferences": [{"uid": "u"}, {"uid": "someone-else"}],
        "resourceVersion": "42",
    },
    "spec": {
        "replicas": 2,
        "progressDeadlineSeconds": 600,
        "template": {
            "spec": {
                "containers": [
                    {"name": "c", "image": "i:1", "args": ["--x", "1"], "imagePullPolicy": "IfNotPresent"}
                ],
                "dnsPolicy": "ClusterFirst",
            }
        },
    },
    "status": {"readyReplicas": 2},
}


def with_(base: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    import copy

    result = copy.deepcopy(base)
    node: Any = result
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return result


def test_a_live_object_with_only_server_side_additions_needs_no_patch() -> None:
    assert update_patch(SERVER_DEFAULTED, DESIRED) == {}


@pytest.mark.parametrize(
    ("live", "patch"),
    [
        (with_(SERVER_DEFAULTED, ("spec", "replicas"), 5), {"spec": {"replicas": 2}}),
        (
            with_(SERVER_DEFAULTED, ("spec", "template", "spec", "containers", 0, "args"), ["--x", "2"]),
            {
                "spec": {
                    "template": {"spec": {"containers": DESIRED["spec"]["template"]["spec"]["containers"]}}
                }
            },
        ),
        (
            with_(SERVER_DEFAULTED, ("metadata", "labels"), {"a": "0", "b": "2"}),
            {"metadata": {"labels": {"a": "1"}}},
        ),
    ],
    ids=["scalar", "list element: the whole list is replaced", "label"],
)
def test_only_the_fields_that_differ_are_patched(live: dict[str, Any], patch: dict[str, Any]) -> None:
    assert update_patch(live, DESIRED) == patch


def test_create_only_fields_are_never_patched() -> None:
    live = with_(SERVER_DEFAULTED, ("spec", "replicas"), 7)
    assert update_patch(live, DESIRED, create_only=[("spec", "replicas")]) == {}


INIT = ("spec", "template", "spec", "initContainers")


def test_an_owned_field_the_manifest_leaves_out_is_removed_from_the_live_object() -> None:
    live = with_(SERVER_DEFAULTED, INIT, [{"name": "lmcache-check"}])
    patch = update_patch(live, DESIRED, owned=[INIT])
    assert patch == {"spec": {"template": {"spec": {"initContainers": None}}}}
    assert update_patch(live, DESIRED) == {}  # not owned: extra live fields are left alone


def test_an_owned_field_is_patched_as_usual_when_the_manifest_has_it_and_left_alone_when_neither_has_it() -> (
    None
):
    assert update_patch(SERVER_DEFAULTED, DESIRED, owned=[INIT]) == {}
    wanted = with_(DESIRED, INIT, [{"name": "lmcache-check"}])
    assert update_patch(SERVER_DEFAULTED, wanted, owned=[INIT]) == {
        "spec": {"template": {"spec": {"initContainers": [{"name": "lmcache-check"}]}}}
    }
    assert (
        update_patch(with_(SERVER_DEFAULTED, INIT, [{"name": "lmcache-check"}]), wanted, owned=[INIT]) == {}
    )


def test_owner_references_added_by_others_are_not_patched_away() -> None:
    live = with_(SERVER_DEFAULTED, ("metadata", "ownerReferences"), [{"uid": "someone-else"}])
    assert update_patch(live, DESIRED) == {}


@pytest.mark.parametrize(
    ("live", "desired", "expected"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ([1, 2], [1, 2], True),
        ([1, 2, 3], [1, 2], False),
        ([{"a": 1, "x": 0}], [{"a": 1}], True),
        (True, 1, False),
        (1, 1.0, True),
        ("1", 1, False),
        (None, {}, False),
    ],
)
def test_covers_means_every_desired_field_is_present_with_its_value(
    live: Any, desired: Any, expected: bool
) -> None:
    assert covers(live, desired) is expected


def test_a_missing_key_is_added_even_when_its_value_is_empty() -> None:
    assert merge_patch({}, {"data": {}}) == {"data": {}}
    assert merge_patch({"data": {}}, {"data": {}}) == {}


@pytest.mark.parametrize(
    ("live", "desired", "expected"),
    [
        ("1Gi", "1024Mi", True),
        ("500m", "0.5", True),
        ("1", 1, True),
        ("2Gi", "1Gi", False),
        ("lots", "lots", True),
    ],
)
def test_resource_quantities_compare_by_amount_as_the_api_server_canonicalizes_them(
    live: Any, desired: Any, expected: bool
) -> None:
    path = ("spec", "template", "spec", "containers", "resources", "limits", "memory")
    assert covers(live, desired, path=path) is expected


def test_quantity_like_strings_elsewhere_compare_as_text() -> None:
    assert not covers("1.0", "1", path=("spec", "template", "spec", "containers", "args"))
    canonical = with_(
        SERVER_DEFAULTED,
        ("spec", "template", "spec", "containers", 0, "resources"),
        {"limits": {"memory": "1Gi"}},
    )
    desired = with_(
        DESIRED, ("spec", "template", "spec", "containers", 0, "resources"), {"limits": {"memory": "1024Mi"}}
    )
    assert update_patch(canonical, desired) == {}


def test_an_owned_map_loses_the_live_keys_the_manifest_no_longer_has() -> None:
    selector = ("spec", "selector")
    live = {
        "spec": {
            "selector": {"app": "x", "leaderworkerset.sigs.k8s.io/worker-index": "0"},
            "clusterIP": "None",
        }
    }
    desired = {"spec": {"selector": {"app": "x"}}}
    assert update_patch(live, desired, owned=[selector]) == {
        "spec": {"selector": {"leaderworkerset.sigs.k8s.io/worker-index": None}}
    }
    assert update_patch(live, desired) == {}  # not owned: extra live keys are left alone
