"""Per-adapter status: each declared adapter Ready, Pending or Failed with a reason, the
`AdaptersReady` condition, the `ready/declared` count, and an Event per transition; the adapter
sidecar the engine pods get, and its credentials Secret.

Real: tandem.operator.reconcile, tandem.operator.adapterstatus, tandem.operator.sidecars (which pods
are read), the builders and the status derivation. Faked: the Kubernetes API, by `ListingCluster`
(the in-memory cluster of test_operator_reconcile.py that also lists); the pods' statuses, written as
the kubelet writes them; and each sidecar's `/adapters` report (`Reports`, in place of HTTP). Over
HTTP, with the operator process, the emulated API server and served reports:
test_adapter_lifecycle.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.operator.specs import IMAGES, OWNER, spec_of
from tests.operator.test_operator_reconcile import NOW, MemoryCluster, body, run, status_dict

from tandem.operator.cluster import ClusterError
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Outcome, reconcile
from tandem.operator.resources import desired_children
from tandem.operator.resources.meta import Role, selector_labels
from tandem.operator.resources.secrets import USABLE_LABEL
from tandem.operator.sidecars import SidecarError
from tandem.operator.status import as_patch

LORA: dict[str, Any] = {"engine": {"kind": "sim", "lora": {"maxRank": 16}}}
HUB = {"name": "sql", "source": "hf://org/sql-lora@v2"}
BUCKET = {"name": "chat", "source": "s3://loras/chat"}
CLAIM = {"name": "legal", "source": "pvc://legal-loras/v1"}


class ListingCluster(MemoryCluster):
    """`MemoryCluster` that lists a kind in a namespace (or refuses to, with `list_status`)."""

    def __init__(self, *, list_status: int | None = None) -> None:
        super().__init__()
        self.list_status = list_status

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        self.calls.append(("list", kind))
        if self.list_status is not None:
            raise ClusterError(self.list_status, "pods is forbidden")
        return [
            copy.deepcopy(o)
            for r, o in self.objects.items()
            if (r.api_version, r.kind, r.namespace) == (api_version, kind, namespace)
        ]


def spec(*adapters: dict[str, str], **more: Any) -> dict[str, Any]:
    return LORA | {"adapters": list(adapters)} | more


def engine_pod(cluster: MemoryCluster, name: str, *, role: Role = Role.DECODE, started: bool = True) -> None:
    """An engine pod with an IP whose adapters-sync sidecar has (or has not yet) started."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": OWNER.namespace, "labels": selector_labels(OWNER, role)},
        "spec": {
            "initContainers": [
                {"name": "adapters-sync", "ports": [{"name": "adapter-sync", "containerPort": 8095}]}
            ],
            "containers": [],
        },
        "status": {
            "podIP": "10.0.0.7",
            "initContainerStatuses": [
                {"name": "adapters-sync", "started": started, "state": {"running": {}}}
            ],
        },
    }
    cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, name)] = pod


def entry(source: str, state: str, reason: str = "") -> dict[str, str]:
    """One adapter in a sidecar's report."""
    return {"source": source, "state": state, "reason": reason, "revision": "abc" if state == "Ready" else ""}


class Reports(dict[str, Any]):
    """Each pod's sidecar report by pod name (a string: the pod does not answer, with that reason);
    `read` is the `ReportReader` the reconcile is given, and records whom it read."""

    def __init__(self) -> None:
        super().__init__()
        self.read_pods: list[str] = []

    def read(self, pod: Any) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        self.read_pods.append(name)
        found = self.get(name)
        if found is None or isinstance(found, str):
            raise SidecarError(found or f"http://10.0.0.7:8095/adapters: connection refused ({name})")
        return {"digest": "d", "passes": 1, "listError": "", "adapters": found}


def run_reading(cluster: MemoryCluster, document: dict[str, Any], reports: Reports) -> Outcome:
    return reconcile(document, cluster=cluster, images=IMAGES, now=NOW, read_report=reports.read)


def claim(cluster: MemoryCluster, name: str, phase: str) -> None:
    cluster.objects[ObjectRef("v1", "PersistentVolumeClaim", OWNER.namespace, name)] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": OWNER.namespace},
        "status": {"phase": phase},
    }


def adapters_of(outcome: Outcome) -> list[tuple[str, str, str]]:
    return [(a.name, a.state, a.reason) for a in outcome.status.adapters or []]


def adapters_condition(outcome: Outcome) -> tuple[str, str, str]:
    [found] = [c for c in outcome.status.conditions if c.type == "AdaptersReady"]
    return found.status, found.reason, found.message


def test_a_remote_adapter_is_pending_until_a_pods_sidecar_has_installed_it() -> None:
    cluster, reports = ListingCluster(), Reports()
    first = run_reading(cluster, body(spec(HUB)), reports)
    assert adapters_of(first) == [("sql", "Pending", "no engine pod is running yet")]
    assert adapters_condition(first)[:2] == ("False", "AdaptersPending")
    assert first.status.adapter_summary == "0/1"
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "AdapterPending")]

    engine_pod(cluster, "d-1")
    engine_pod(cluster, "old")
    reports["d-1"] = {}  # its sidecar has not seen the new list yet
    reports["old"] = {"sql": entry("hf://org/sql-lora@v1", "Ready")}  # another source: does not count
    unseen = run_reading(cluster, body(spec(HUB), status=status_dict(first)), reports)
    assert adapters_of(unseen) == [
        (
            "sql",
            "Pending",
            "no engine pod's sidecar lists it yet (the kubelet updates their list within a minute)",
        )
    ]

    reports["d-1"] = {"sql": entry("hf://org/sql-lora@v2", "Pending")}
    running = run_reading(cluster, body(spec(HUB), status=status_dict(unseen)), reports)
    assert adapters_of(running) == [("sql", "Pending", "being installed on 1 engine pods")]
    assert running.events == [], "no transition, no event"

    reports["d-1"] = {"sql": entry("hf://org/sql-lora@v2", "Ready", "fetched")}
    done = run_reading(cluster, body(spec(HUB), status=status_dict(running)), reports)
    assert adapters_of(done) == [("sql", "Ready", "installed on 1/2 engine pods")]
    assert adapters_condition(done) == ("True", "AdaptersReady", "1/1 ready")
    assert done.status.adapter_summary == "1/1"
    assert [(e.type, e.reason, e.message) for e in done.events] == [
        ("Normal", "AdapterReady",
         "adapter 'sql' (hf://org/sql-lora@v2) is Ready: installed on 1/2 engine pods"),
    ]  # fmt: skip
    assert status_dict(done)["adapters"] == [
        {"name": "sql", "source": "hf://org/sql-lora@v2", "state": "Ready",
         "reason": "installed on 1/2 engine pods"},
    ]  # fmt: skip


def test_a_failure_a_sidecar_reports_fails_that_adapter_only_with_a_warning() -> None:
    cluster, reports = ListingCluster(), Reports()
    engine_pod(cluster, "d-1")
    why = "s3://loras/chat: NoSuchBucket: The specified bucket does not exist"
    reports["d-1"] = {
        "sql": entry("hf://org/sql-lora@v2", "Ready", "cached"),
        "chat": entry("s3://loras/chat", "Failed", why),
    }
    outcome = run_reading(cluster, body(spec(HUB, BUCKET)), reports)
    assert adapters_of(outcome) == [("sql", "Ready", "installed on 1/1 engine pods"), ("chat", "Failed", why)]
    assert adapters_condition(outcome) == ("False", "AdaptersFailed", "1/2 ready; failed: chat")
    assert outcome.status.adapter_summary == "1/2"
    warnings = [e for e in outcome.events if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [
        ("AdapterFailed", f"adapter 'chat' (s3://loras/chat) is Failed: {why}"),
    ]
    assert outcome.status.phase == "Progressing", "the model's readiness is not the adapters'"


def test_one_pod_that_has_it_makes_it_ready_even_where_another_failed() -> None:
    cluster, reports = ListingCluster(), Reports()
    engine_pod(cluster, "d-1")
    engine_pod(cluster, "d-2")
    reports["d-1"] = {"sql": entry("hf://org/sql-lora@v2", "Failed", "hf://org/sql-lora: 503")}
    reports["d-2"] = {"sql": entry("hf://org/sql-lora@v2", "Ready", "fetched")}
    outcome = run_reading(cluster, body(spec(HUB)), reports)
    assert adapters_of(outcome) == [("sql", "Ready", "installed on 1/2 engine pods")]


def test_a_sidecar_that_does_not_answer_leaves_it_pending_with_the_reason() -> None:
    cluster, reports = ListingCluster(), Reports()
    engine_pod(cluster, "d-1")
    reports["d-1"] = "http://10.0.0.7:8095/adapters: timed out"
    outcome = run_reading(cluster, body(spec(HUB)), reports)
    assert adapters_of(outcome) == [
        (
            "sql",
            "Pending",
            "cannot read the adapters-sync report of 1 engine pods: http://10.0.0.7:8095/adapters: timed out",
        )
    ]
    assert outcome.error is None


def test_a_pod_whose_sidecar_has_not_started_is_not_read() -> None:
    cluster, reports = ListingCluster(), Reports()
    engine_pod(cluster, "d-1", started=False)
    outcome = run_reading(cluster, body(spec(HUB)), reports)
    assert reports.read_pods == []
    assert adapters_of(outcome)[0][1] == "Pending"


def test_prefill_pods_count_and_other_services_pods_do_not() -> None:
    cluster, reports = ListingCluster(), Reports()
    engine_pod(cluster, "p-1", role=Role.PREFILL)
    other = cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, "p-1")]
    cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, "x-1")] = copy.deepcopy(other) | {
        "metadata": {"name": "x-1", "namespace": OWNER.namespace, "labels": {"app": "other"}},
    }
    reports["p-1"] = {"sql": entry("hf://org/sql-lora@v2", "Ready", "cached")}
    reports["x-1"] = {"sql": entry("hf://org/sql-lora@v2", "Failed", "not this service's")}
    outcome = run_reading(cluster, body(spec(HUB)), reports)
    assert adapters_of(outcome) == [("sql", "Ready", "installed on 1/1 engine pods")]
    assert reports.read_pods == ["p-1"]


@pytest.mark.parametrize(
    ("phase", "state", "reason"),
    [
        ("Bound", "Ready", "PersistentVolumeClaim legal-loras is Bound"),
        ("Pending", "Pending", "PersistentVolumeClaim legal-loras is Pending"),
        ("Lost", "Failed", "PersistentVolumeClaim legal-loras is Lost (its volume is gone)"),
        (None, "Failed", "PersistentVolumeClaim legal-loras does not exist"),
    ],
)
def test_a_pvc_adapter_is_judged_by_its_claim(phase: str | None, state: str, reason: str) -> None:
    cluster = MemoryCluster()  # no list: a pvc:// adapter needs none
    if phase is not None:
        claim(cluster, "legal-loras", phase)
    outcome = run(cluster, body(spec(CLAIM)))
    assert adapters_of(outcome) == [("legal", state, reason)]
    assert ("list", "Pod") not in cluster.calls


def test_pods_it_may_not_list_leave_remote_adapters_pending_and_the_reconcile_goes_on() -> None:
    cluster = ListingCluster(list_status=403)
    outcome = run(cluster, body(spec(HUB)))
    [(name, state, reason)] = adapters_of(outcome)
    assert (name, state) == ("sql", "Pending")
    assert reason.startswith("cannot list the engine pods:") and "forbidden" in reason
    assert outcome.error is None
    assert {a.verb for a in outcome.actions} == {"created"}


def test_removing_every_adapter_clears_the_status_and_says_so() -> None:
    cluster = ListingCluster()
    claim(cluster, "legal-loras", "Bound")
    first = run(cluster, body(spec(CLAIM)))
    assert first.status.adapter_summary == "1/1"
    after = run(cluster, body(LORA, status=status_dict(first)))
    assert after.status.adapters is None and after.status.adapter_summary is None
    assert all(c.type != "AdaptersReady" for c in after.status.conditions)
    assert [(e.reason, e.message) for e in after.events] == [
        ("AdapterRemoved", "adapter 'legal' (pvc://legal-loras/v1) removed")
    ]
    patch = as_patch(after.status, status_dict(first))
    assert patch["adapters"] is None and patch["adapterSummary"] is None


def test_an_invalid_spec_keeps_the_adapters_as_last_observed() -> None:
    cluster = ListingCluster()
    claim(cluster, "legal-loras", "Bound")
    first = run(cluster, body(spec(CLAIM)))
    bad = spec(CLAIM, HUB | {"name": "legal"})  # a duplicate name
    after = run(cluster, body(bad, status=status_dict(first)))
    assert after.status.phase == "Invalid"
    assert after.status.adapters == first.status.adapters
    assert after.status.adapter_summary == "1/1"
    assert [c.type for c in after.status.conditions if c.type == "AdaptersReady"] == ["AdaptersReady"]


def decode_template(document_spec: dict[str, Any]) -> dict[str, Any]:
    parsed = spec_of(body(document_spec))
    for child in desired_children(parsed, owner=OWNER, images=IMAGES):
        if child.manifest["kind"] == "Deployment" and child.manifest["metadata"]["name"].endswith("-decode"):
            return dict(child.manifest["spec"]["template"])
    raise AssertionError("no decode Deployment")


def test_the_sidecar_reads_only_the_known_keys_of_the_credentials_secret() -> None:
    template = decode_template(spec(HUB, BUCKET, adapterCache={"credentialsSecret": "creds"}))
    [container] = template["spec"]["initContainers"]
    assert container["name"] == "adapters-sync" and container["restartPolicy"] == "Always"
    assert [e["name"] for e in container["env"]] == [
        "HF_TOKEN", "HF_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_REGION", "AWS_ENDPOINT_URL",
    ]  # fmt: skip
    assert container["env"][0]["valueFrom"] == {
        "secretKeyRef": {"name": "creds", "key": "HF_TOKEN", "optional": True}
    }
    assert {"name": "adapters", "mountPath": "/adapters"} in container["volumeMounts"]
    assert {"name": "adapter-list", "mountPath": "/etc/tandem/adapters", "readOnly": True} in container[
        "volumeMounts"
    ]


def test_without_a_cache_claim_the_fetch_fills_an_emptydir_per_pod() -> None:
    parsed = spec_of(body(spec(HUB, adapterCache={"credentialsSecret": "creds"})))
    for child in desired_children(parsed, owner=OWNER, images=IMAGES):
        if child.manifest["kind"] == "Deployment" and child.manifest["metadata"]["name"].endswith("-decode"):
            volumes = child.manifest["spec"]["template"]["spec"]["volumes"]
            assert {"name": "adapters", "emptyDir": {}} in volumes


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        (None, "spec.adapterCache.credentialsSecret: Secret 'creds' does not exist"),
        (
            {},
            "spec.adapterCache.credentialsSecret: Secret 'creds' lacks the label tandem.dev/usable: \"true\"",
        ),
    ],
)
def test_a_credentials_secret_it_may_not_use_blocks_the_service(
    labels: dict[str, str] | None, why: str
) -> None:
    cluster = ListingCluster()
    if labels is not None:
        cluster.objects[ObjectRef("v1", "Secret", OWNER.namespace, "creds")] = {
            "metadata": {"name": "creds", "labels": labels}
        }
    outcome = run(cluster, body(spec(HUB, adapterCache={"credentialsSecret": "creds"})))
    assert outcome.status.phase == "Blocked"
    assert [(e.reason, e.message) for e in outcome.events] == [("SecretRefused", why)]
    assert cluster.writes() == []


def test_a_usable_credentials_secret_is_accepted() -> None:
    cluster = ListingCluster()
    cluster.objects[ObjectRef("v1", "Secret", OWNER.namespace, "creds")] = {
        "metadata": {"name": "creds", "labels": {USABLE_LABEL: "true"}}
    }
    outcome = run(cluster, body(spec(HUB, adapterCache={"credentialsSecret": "creds"})))
    assert outcome.status.phase == "Progressing"
