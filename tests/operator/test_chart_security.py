"""Least privilege of what the chart, the kustomize base and the image run.

Real: the Helm chart rendered by Helm's own Go SDK (helm-python-sdk), the kustomize base's files,
deploy/Dockerfile's text, and (for the RBAC coverage story) the operator running against the
emulated API server of tests/operator/conftest.py. Emulated: the API server's RBAC authorizer, which
refuses (403) each of the operator's requests that the RBAC the chart renders, cluster-wide or
namespaced, does not grant (tests/operator/rbac.py); the story then checks every request the
operator made against those grants. Not exercised: a container runtime enforcing the security
contexts, a Docker build (none here)."""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import helm_python as helm
import kmock as kmock_lib
import pytest
import yaml
from tests.operator import cluster_state as k8s
from tests.operator.cluster_state import NAMESPACE, eventually
from tests.operator.rbac import Access, Grants, accesses, chart_documents
from tests.operator.specs import ROOT

CHART = ROOT / "charts" / "tandem"
KUSTOMIZE = ROOT / "deploy" / "kustomize" / "base"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
#: Chart values under test: the defaults, and every optional part switched on.
VALUES: dict[str, dict[str, Any] | None] = {
    "default": None,
    "autoscaler and namespaces": {
        "autoscaler": {"enabled": True},
        "operator": {"watchNamespaces": ["team-a"]},
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "no chart-made service accounts": {"serviceAccount": {"create": False}, "autoscaler": {"enabled": True}},
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
#: Verbs that let a holder grant or assume more than it has.
ESCALATING_VERBS = {"*", "escalate", "bind", "impersonate"}


def rendered_texts(values: dict[str, Any] | None) -> dict[str, str]:
    """`helm template`: {template path: rendered text}, comments kept (NOTES.txt excluded)."""
    rendered = helm.Chart.load(CHART).render(values, name="tandem", namespace="tandem-system")
    return {path: text for path, text in rendered.items() if not path.endswith("NOTES.txt")}


def documents(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    for _, text in sorted(rendered_texts(values).items()):
        result += [d for d in yaml.safe_load_all(text) if d]
    return result


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every workload's pod template."""
    for doc in docs:
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_chart_renders_a_workload_for_every_component(values: str) -> None:
    names = {name for name, _ in pod_specs(documents(VALUES[values]))}
    expected = {"tandem-operator"} | ({"tandem-autoscaler"} if values != "default" else set())
    assert names == expected


@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_container_runs_as_non_root_with_a_read_only_root_and_no_privileges(values: str) -> None:
    for name, pod in pod_specs(documents(VALUES[values])):
        pod_context = pod.get("securityContext", {})
        for container in containers(pod):
            context = container.get("securityContext", {})
            where = f"{name}/{container['name']}"
            effective = {**pod_context, **context}
            assert effective.get("runAsNonRoot") is True, where
            assert effective.get("runAsUser", 1) != 0 and effective.get("runAsGroup", 1) != 0, where
            assert effective.get("seccompProfile") == {"type": "RuntimeDefault"}, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("privileged", False) is False, where
            assert context.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not context.get("capabilities", {}).get("add"), where


@pytest.mark.parametrize("values", sorted(VALUES))
def test_no_pod_shares_the_host_or_mounts_its_paths(values: str) -> None:
    for name, pod in pod_specs(documents(VALUES[values])):
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key), (name, key)
        assert not [v for v in pod.get("volumes", []) if "hostPath" in v], name


@pytest.mark.parametrize("values", sorted(VALUES))
def test_every_container_requests_cpu_and_memory_and_has_a_memory_limit(values: str) -> None:
    for name, pod in pod_specs(documents(VALUES[values])):
        for container in containers(pod):
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), name
            assert "memory" in resources.get("limits", {}), name


@pytest.mark.parametrize("values", sorted(VALUES))
def test_service_account_tokens_are_mounted_only_into_pods_whose_account_holds_a_role(values: str) -> None:
    docs = documents(VALUES[values])
    for account in (d for d in docs if d["kind"] == "ServiceAccount"):
        assert account.get("automountServiceAccountToken") is False, account["metadata"]["name"]
    bound = {
        subject["name"]
        for binding in docs
        if binding["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for subject in binding["subjects"]
    }
    for name, pod in pod_specs(docs):
        assert "automountServiceAccountToken" in pod, f"{name} must say whether it needs a token"
        if pod["automountServiceAccountToken"]:
            assert pod.get("serviceAccountName") in bound or pod.get("serviceAccountName") == "default", name


# --------------------------------------------------------------------------------------------- RBAC


def rule_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(the rule's first line, the comment lines right above it) for every item of every `rules:`
    list in a YAML text (the chart's templates keep comments when rendered)."""
    lines = text.splitlines()
    in_rules = False
    for i, line in enumerate(lines):
        if re.match(r"^rules:\s*$", line):
            in_rules = True
            continue
        if in_rules and re.match(r"^\S", line) and not line.startswith("#"):
            in_rules = False
        if in_rules and re.match(r"^\s*- ", line):
            comments: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                comments.insert(0, lines[j].strip())
                j -= 1
            yield line.strip(), comments


def cluster_role_texts() -> dict[str, str]:
    texts = {"kustomize clusterrole.yaml": (KUSTOMIZE / "clusterrole.yaml").read_text()}
    for values in sorted(VALUES):
        for path, text in rendered_texts(VALUES[values]).items():
            if "rules:" in text:
                texts[f"chart ({values}) {path}"] = text
    return texts


@pytest.mark.parametrize("source", sorted(cluster_role_texts()))
def test_every_rbac_rule_carries_a_comment_saying_what_it_is_for(source: str) -> None:
    text = cluster_role_texts()[source]
    blocks = list(rule_blocks(text))
    rules = [r for d in yaml.safe_load_all(text) if d and "rules" in d for r in d["rules"]]
    assert blocks and len(blocks) == len(rules), f"{source}: {len(blocks)} rule items, {len(rules)} rules"
    for rule, comments in blocks:
        words = " ".join(comments).lstrip("# ")
        assert len(words.split()) >= 4, f"{source}: rule `{rule}` has no justifying comment"


@pytest.mark.parametrize("values", sorted(VALUES))
def test_no_rbac_rule_uses_a_wildcard_or_a_verb_that_escalates(values: str) -> None:
    roles = [d for d in documents(VALUES[values]) if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            where = f"{role['metadata']['name']}: {rule}"
            assert "nonResourceURLs" not in rule, where
            assert not {"*"} & {*rule["apiGroups"], *rule["resources"]}, where
            assert not ESCALATING_VERBS & set(rule["verbs"]), where
            if "secrets" in rule["resources"]:  # by name only: never enumerated
                assert not {"list", "watch"} & set(rule["verbs"]), where
            assert "resourceNames" not in rule or rule["resourceNames"], where


def authenticated(request: Any) -> bool:
    """The operator's requests: kopf and the reconcile both send the kubeconfig's token; the tests'
    own requests carry none."""
    return "authorization" in {h.lower() for h in request.headers}


DEMO: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "demo", "namespace": NAMESPACE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
        "engine": {"kind": "sim"},
        "decode": {"replicas": 1},
        "router": {"replicas": 1},
    },
}


def operator_grants(namespaces: tuple[str, ...]) -> Grants:
    """The operator's rights in the chart rendered with `operator.watchNamespaces: namespaces`."""
    chart = chart_documents(
        {"operator": {"watchNamespaces": list(namespaces), "clusterWide": not namespaces}}
    )
    return Grants(chart, account="tandem-operator")


@pytest.fixture
def authorize(operator_namespaces: tuple[str, ...]) -> Callable[[Any], bool]:
    """The operator runs under the chart's RBAC for its namespaces: the emulated API server refuses
    (403) what the chart does not grant, as a real one would."""
    return operator_grants(operator_namespaces).authorizer(made_by=authenticated)


async def lifecycle(api: kmock_lib.KubernetesEmulator, restart: Callable[[], Awaitable[None]]) -> None:
    """Create, ready, switch to an external Redis, an invalid spec, a restart, deletion."""
    await k8s.apply(api, copy.deepcopy(DEMO))
    await eventually(lambda: k8s.find(api, "Deployment", "demo-router") is not None, "children")
    for name in ("demo-prefill", "demo-decode", "demo-kv", "demo-router"):
        await k8s.mark_ready(api, name)
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("status") == "True", "Ready")
    await k8s.patch_spec(api, "demo", {"kvPool": {"redis": {"url": "redis://cache.example:6379"}}})
    await eventually(lambda: k8s.find(api, "Deployment", "demo-kv") is None, "managed Redis deleted")
    await k8s.patch_spec(api, "demo", {"decode": {"autoscaling": {"min": 9, "max": 4}}})
    await eventually(lambda: k8s.condition(api, "demo", "Ready").get("reason") == "InvalidSpec", "Event")
    await restart()  # kopf lists, watches and resumes
    await k8s.delete(api, "demo")
    await eventually(lambda: k8s.find(api, "InferenceService", "demo") is None, "deleted")


@pytest.mark.parametrize(
    "operator_namespaces", [(), (NAMESPACE, "team-b")], ids=["cluster-wide", "namespaced"]
)
async def test_every_request_the_operator_makes_in_a_lifecycle_is_allowed_by_the_rbac_the_chart_renders(
    api: kmock_lib.KubernetesEmulator,
    operator: Callable[[], Awaitable[None]],
    operator_namespaces: tuple[str, ...],
) -> None:
    try:
        await lifecycle(api, operator)
    finally:  # a refusal explains a stalled lifecycle better than the timeout does
        made = accesses(api, made_by=authenticated)
        denied = operator_grants(operator_namespaces).refused(made)
        assert denied == [], f"the chart's RBAC refuses: {denied}"
    assert {
        Access(NAMESPACE, "", "events", "create"),
        Access(NAMESPACE, "apps", "deployments", "delete"),
    } <= made
    # It watched InferenceServices where the chart says: everywhere, or in each watched namespace.
    watched = {a.namespace for a in made if a.resource == "inferenceservices" and a.verb == "watch"}
    assert watched == set(operator_namespaces or [None])


# -------------------------------------------------------------------------------------------- image


def final_stage(dockerfile: str) -> list[str]:
    """Instructions of the Dockerfile's last stage (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    start = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    return lines[start:]


def test_the_image_runs_as_the_numeric_non_root_user_the_chart_expects() -> None:
    stage = final_stage(DOCKERFILE.read_text())
    users = [ln.split(None, 1)[1] for ln in stage if ln.upper().startswith("USER ")]
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0 and int(gid) != 0, users[-1]
    last_user = max(i for i, ln in enumerate(stage) if ln.upper().startswith("USER "))
    assert not [ln for ln in stage[last_user:] if ln.upper().startswith(("RUN ", "COPY ", "ADD "))], (
        "everything is installed before the image switches to its runtime user"
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (values["podSecurityContext"]["runAsUser"], values["podSecurityContext"]["runAsGroup"]) == (
        int(uid),
        int(gid),
    )


def test_the_image_declares_no_writable_volume_and_writes_no_bytecode() -> None:
    stage = final_stage(DOCKERFILE.read_text())
    assert not [ln for ln in stage if ln.upper().startswith("VOLUME")]
    env = " ".join(ln for ln in stage if ln.upper().startswith("ENV "))
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_the_kustomize_base_runs_the_operator_as_the_chart_does() -> None:
    (deployment,) = [d for d in yaml.safe_load_all((KUSTOMIZE / "operator.yaml").read_text()) if d]
    (chart,) = [d for d in documents(None) if d["kind"] == "Deployment"]
    pod, chart_pod = deployment["spec"]["template"]["spec"], chart["spec"]["template"]["spec"]
    for key in ("securityContext", "automountServiceAccountToken", "enableServiceLinks"):
        assert pod.get(key) == chart_pod.get(key), key
    assert pod["containers"][0]["securityContext"] == chart_pod["containers"][0]["securityContext"]
    assert pod["containers"][0]["resources"] == chart_pod["containers"][0]["resources"]
    (account,) = [d for d in yaml.safe_load_all((KUSTOMIZE / "serviceaccount.yaml").read_text()) if d]
    assert account.get("automountServiceAccountToken") is False
