"""Per-adapter status: each declared adapter Ready, Pending or Failed with a reason, the
`AdaptersReady` condition, the `ready/declared` count, and an Event per transition; the fetch init
container the engine pods get for `hf://` and `s3://` adapters, and its credentials Secret.

Real: tandem.operator.reconcile, tandem.operator.adapterstatus, the builders and the status
derivation. Faked: the Kubernetes API, by `ListingCluster` (the in-memory cluster of
test_operator_reconcile.py that also lists), and the pods' init container statuses, written as the
kubelet writes them. Over HTTP against the emulated API server: test_adapter_lifecycle.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.operator.specs import IMAGES, OWNER, spec_of
from tests.operator.test_operator_reconcile import MemoryCluster, body, run, status_dict

from tandem.operator.cluster import ClusterError
from tandem.operator.objects import ObjectRef
from tandem.operator.reconcile import Outcome
from tandem.operator.resources import desired_children
from tandem.operator.resources.meta import Role, selector_labels
from tandem.operator.resources.secrets import USABLE_LABEL
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


def fetch_pod(
    cluster: MemoryCluster,
    name: str,
    *,
    args: list[str],
    exit_code: int | None,
    message: str = "",
    role: Role = Role.DECODE,
    last: bool = False,
) -> None:
    """An engine pod whose adapters-fetch container was given `args` and ended with `exit_code`
    (None: still running); `last`: the end is in lastState (the container restarted since)."""
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    terminated |= {"message": message} if message else {}
    state = {"running": {}} if exit_code is None else {"terminated": terminated}
    status: dict[str, Any] = {"name": "adapters-fetch", "state": state}
    if last:
        status = {"name": "adapters-fetch", "state": {"waiting": {}}, "lastState": {"terminated": terminated}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": OWNER.namespace, "labels": selector_labels(OWNER, role)},
        "spec": {"initContainers": [{"name": "adapters-fetch", "args": args}], "containers": []},
        "status": {"initContainerStatuses": [status]},
    }
    cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, name)] = pod


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


def test_a_remote_adapter_is_pending_until_a_pod_given_it_has_fetched_it() -> None:
    cluster = ListingCluster()
    first = run(cluster, body(spec(HUB)))
    assert adapters_of(first) == [
        ("sql", "Pending", "no engine pod has been given it yet (the engine pools roll out to fetch it)")
    ]
    assert adapters_condition(first)[:2] == ("False", "AdaptersPending")
    assert first.status.adapter_summary == "0/1"
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "AdapterPending")]

    fetch_pod(cluster, "d-1", args=["sql=hf://org/sql-lora@v2"], exit_code=None)
    fetch_pod(cluster, "old", args=["sql=hf://org/sql-lora@v1"], exit_code=0)  # an older template
    running = run(cluster, body(spec(HUB), status=status_dict(first)))
    assert adapters_of(running) == [("sql", "Pending", "being fetched on 1 engine pods")]
    assert running.events == [], "no transition, no event"

    fetch_pod(cluster, "d-1", args=["sql=hf://org/sql-lora@v2"], exit_code=0, message="fetched sql abc")
    done = run(cluster, body(spec(HUB), status=status_dict(running)))
    assert adapters_of(done) == [("sql", "Ready", "fetched; on 1/1 engine pods given it")]
    assert adapters_condition(done) == ("True", "AdaptersReady", "1/1 ready")
    assert done.status.adapter_summary == "1/1"
    assert [(e.type, e.reason, e.message) for e in done.events] == [
        ("Normal", "AdapterReady",
         "adapter 'sql' (hf://org/sql-lora@v2) is Ready: fetched; on 1/1 engine pods given it"),
    ]  # fmt: skip
    assert status_dict(done)["adapters"] == [
        {"name": "sql", "source": "hf://org/sql-lora@v2", "state": "Ready",
         "reason": "fetched; on 1/1 engine pods given it"},
    ]  # fmt: skip


def test_a_failure_the_fetch_names_fails_that_adapter_only_with_a_warning() -> None:
    cluster = ListingCluster()
    report = (
        "failed chat: s3://loras/chat: NoSuchBucket: The specified bucket does not exist\nfetched sql abc"
    )
    args = ["sql=hf://org/sql-lora@v2", "chat=s3://loras/chat"]
    fetch_pod(cluster, "d-1", args=args, exit_code=0, message=report)
    outcome = run(cluster, body(spec(HUB, BUCKET)))
    assert adapters_of(outcome) == [
        ("sql", "Ready", "fetched; on 1/1 engine pods given it"),
        ("chat", "Failed", "s3://loras/chat: NoSuchBucket: The specified bucket does not exist"),
    ]
    assert adapters_condition(outcome) == ("False", "AdaptersFailed", "1/2 ready; failed: chat")
    assert outcome.status.adapter_summary == "1/2"
    warnings = [e for e in outcome.events if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [
        ("AdapterFailed", "adapter 'chat' (s3://loras/chat) is Failed: s3://loras/chat: NoSuchBucket: "
         "The specified bucket does not exist"),
    ]  # fmt: skip
    assert outcome.status.phase == "Progressing", "the model's readiness is not the adapters'"


def test_a_fetch_container_that_crashed_fails_the_adapters_it_did_not_fetch() -> None:
    cluster = ListingCluster()
    fetch_pod(cluster, "d-1", args=["sql=hf://org/sql-lora@v2"], exit_code=137, message="Killed", last=True)
    outcome = run(cluster, body(spec(HUB)))
    assert adapters_of(outcome) == [("sql", "Failed", "the fetch exited 137 (Error): Killed")]


def test_prefill_pods_count_and_other_services_pods_do_not() -> None:
    cluster = ListingCluster()
    fetch_pod(cluster, "p-1", args=["sql=hf://org/sql-lora@v2"], exit_code=0, role=Role.PREFILL)
    other = cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, "p-1")]
    cluster.objects[ObjectRef("v1", "Pod", OWNER.namespace, "x-1")] = copy.deepcopy(other) | {
        "metadata": {"name": "x-1", "namespace": OWNER.namespace, "labels": {"app": "other"}},
        "status": {"initContainerStatuses": [{"name": "adapters-fetch", "state": {"terminated": {
            "exitCode": 0, "message": "failed sql: not this service's"}}}]},
    }  # fmt: skip
    outcome = run(cluster, body(spec(HUB)))
    assert adapters_of(outcome) == [("sql", "Ready", "fetched; on 1/1 engine pods given it")]


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


def fetch_container(document_spec: dict[str, Any]) -> dict[str, Any]:
    parsed = spec_of(body(document_spec))
    for child in desired_children(parsed, owner=OWNER, images=IMAGES):
        if child.manifest["kind"] == "Deployment" and child.manifest["metadata"]["name"].endswith("-decode"):
            [container] = child.manifest["spec"]["template"]["spec"]["initContainers"]
            return dict(container)
    raise AssertionError("no decode Deployment")


def test_the_fetch_container_reads_only_the_known_keys_of_the_credentials_secret() -> None:
    container = fetch_container(spec(HUB, BUCKET, adapterCache={"credentialsSecret": "creds"}))
    assert container["args"] == ["sql=hf://org/sql-lora@v2", "chat=s3://loras/chat"]
    assert [e["name"] for e in container["env"]] == [
        "HF_TOKEN", "HF_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_REGION", "AWS_ENDPOINT_URL",
    ]  # fmt: skip
    assert container["env"][0]["valueFrom"] == {
        "secretKeyRef": {"name": "creds", "key": "HF_TOKEN", "optional": True}
    }
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "adapters", "mountPath": "/adapters"} in container["volumeMounts"]


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
