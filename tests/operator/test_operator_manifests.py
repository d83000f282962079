"""Every manifest Tandem ships or builds, checked against the real Kubernetes schemas.

Real: the builders, the Helm chart rendered and linted by Helm's own Go SDK (helm-python-sdk), the
kustomize base, and kubernetes-validate's bundled OpenAPI schemas of Kubernetes 1.30 and 1.34 in
strict mode (unknown fields are errors). Faked: nothing, but no API server is involved: admission,
defaulting and server-side checks beyond the schemas are not exercised here.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from tests.operator.specs import IMAGES, OWNER, ROOT, VARIANTS

from tandem.operator.crd import crd_manifest
from tandem.operator.kube import PLURALS
from tandem.operator.resources import desired_children
from tandem.operator.resources.router import build_router_role

KUBERNETES_VERSIONS = ("1.30", "1.34")
CHART = ROOT / "charts" / "tandem"
KUSTOMIZE = ROOT / "deploy" / "kustomize" / "base"
ALL_FEATURES: dict[str, Any] = {
    "image": {"repository": "registry.example/tandem", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccount": {"annotations": {"iam.example/role": "tandem"}},
    "operator": {
        "watchNamespaces": ["team-a", "team-b"],
        "resyncSeconds": 10,
        "logLevel": "debug",
        "logFormat": "text",
        "podAnnotations": {"example/scrape": "true"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {
                            "matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]
                        },
                    }
                ]
            }
        },
    },
    "autoscaler": {"enabled": True, "intervalSeconds": 5, "nodeSelector": {"kubernetes.io/os": "linux"}},
}
#: operator.watchNamespaces set: Roles and RoleBindings in those namespaces, nothing cluster-wide.
NAMESPACED: dict[str, Any] = {
    "operator": {"watchNamespaces": ["team-a", "team-b"]},
    "autoscaler": {"enabled": True},
}
VALUES = {
    "default": None,
    "all features": ALL_FEATURES,
    "autoscaler in one namespace": {
        "autoscaler": {"enabled": True, "namespace": "team-a"},
        "operator": {"clusterWide": True},
    },
}
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@functools.cache
def _validate(document_json: str, version: str) -> str | None:
    """kubernetes-validate --strict of one document; the error text, or None. Cached because many
    builder outputs repeat across specs."""
    try:
        kubernetes_validate.validate(json.loads(document_json), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{'.'.join(map(str, exc.path))}: {exc.message}"
    return None


def assert_valid(document: dict[str, Any], version: str) -> None:
    error = _validate(json.dumps(document, sort_keys=True), version)
    assert error is None, (
        f"{document['kind']} {document['metadata'].get('name')} (Kubernetes {version}): {error}"
    )


def render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`helm template` of the chart: every rendered object (NOTES.txt excluded)."""
    rendered = helm.Chart.load(CHART).render(values, name="tandem", namespace="tandem-system")
    documents: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            documents += [d for d in yaml.safe_load_all(text) if d]
    return documents


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_child_the_operator_builds_passes_strict_validation(variant: str, version: str) -> None:
    for child in desired_children(VARIANTS[variant], owner=OWNER, images=IMAGES):
        assert_valid(child.manifest, version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_generated_crd_passes_strict_validation(version: str) -> None:
    assert_valid(crd_manifest(), version)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_rendered_chart_passes_strict_validation(values: str, version: str) -> None:
    documents = render(VALUES[values])
    for document in documents:
        assert_valid(document, version)
    for crd in helm.Chart.load(CHART).crds:
        assert_valid(yaml.safe_load(crd["data"]), version)


CLUSTER_WIDE: dict[str, Any] = {"operator": {"clusterWide": True}}


def test_the_default_chart_renders_the_operator_with_rights_in_its_own_namespace_only() -> None:
    documents = render(None)
    kinds = sorted((d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in documents)
    assert kinds == [
        ("Deployment", "tandem-system", "tandem-operator"),
        ("Role", "tandem-system", "tandem-operator"),
        ("RoleBinding", "tandem-system", "tandem-operator"),
        ("ServiceAccount", "tandem-system", "tandem-operator"),
    ]
    (operator,) = by_kind(documents, "Deployment")
    assert "--namespace=tandem-system" in operator["spec"]["template"]["spec"]["containers"][0]["args"]


def test_cluster_wide_is_asked_for_and_then_a_cluster_role_is_rendered() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in render(CLUSTER_WIDE))
    assert kinds == [
        ("ClusterRole", "tandem-operator"),
        ("ClusterRoleBinding", "tandem-operator"),
        ("Deployment", "tandem-operator"),
        ("ServiceAccount", "tandem-operator"),
    ]


def test_the_autoscalers_namespace_may_scrape_through_the_operators_network_policies() -> None:
    (operator,) = [
        d
        for d in by_kind(
            render({"autoscaler": {"enabled": True}, "operator": {"metricsNamespaces": ["monitoring"]}}),
            "Deployment",
        )
        if d["metadata"]["name"] == "tandem-operator"
    ]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--metrics-namespace=")] == [
        "--metrics-namespace=monitoring",
        "--metrics-namespace=tandem-system",
    ]


def test_all_features_render_the_autoscaler_and_watch_the_given_namespaces() -> None:
    documents = render(ALL_FEATURES)
    deployments = {d["metadata"]["name"]: d for d in by_kind(documents, "Deployment")}
    assert set(deployments) == {"tandem-operator", "tandem-autoscaler"}
    operator = deployments["tandem-operator"]["spec"]["template"]["spec"]["containers"][0]
    assert operator["image"] == "registry.example/tandem:1.2.3"
    assert "--namespace=team-a" in operator["args"] and "--namespace=team-b" in operator["args"]
    assert "--tandem-image=registry.example/tandem:1.2.3" in operator["args"]
    autoscaler = deployments["tandem-autoscaler"]["spec"]["template"]["spec"]["containers"][0]
    assert autoscaler["args"][0] == "autoscaler"
    assert "--namespace=team-a" in autoscaler["args"] and "--namespace=team-b" in autoscaler["args"]


def rbac_objects(documents: list[dict[str, Any]]) -> set[tuple[str, str | None, str]]:
    """(kind, namespace, name) of every RBAC object."""
    return {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
        for d in documents
        if d["kind"] in RBAC_KINDS
    }


def test_a_namespaced_install_grants_roles_in_the_watched_namespaces_and_nothing_cluster_wide() -> None:
    documents = render(NAMESPACED)
    assert rbac_objects(documents) == {
        (kind, namespace, f"tandem-{component}")
        for kind in ("Role", "RoleBinding")
        for namespace in ("team-a", "team-b")
        for component in ("operator", "autoscaler")
    }
    for binding in by_kind(documents, "RoleBinding"):
        name = binding["metadata"]["name"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "tandem-system"}]
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(documents, "ServiceAccount")
    }
    assert accounts == {("tandem-system", "tandem-operator"), ("tandem-system", "tandem-autoscaler")}


@pytest.mark.parametrize("component", ["operator", "autoscaler"])
def test_each_namespaced_role_holds_the_cluster_roles_rules_less_the_cluster_scoped_crd_read(
    component: str,
) -> None:
    name = f"tandem-{component}"
    (cluster_role,) = [
        d
        for d in by_kind(render({"autoscaler": {"enabled": True}, **CLUSTER_WIDE}), "ClusterRole")
        if d["metadata"]["name"] == name
    ]
    # CRDs are cluster-scoped (a Role cannot grant them), and a namespaced operator does not read them.
    expected = [r for r in cluster_role["rules"] if r["resources"] != ["customresourcedefinitions"]]
    roles = [d for d in by_kind(render(NAMESPACED), "Role") if d["metadata"]["name"] == name]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == expected, role["metadata"]["namespace"]


def test_an_autoscaler_namespace_narrows_the_autoscalers_rights_to_that_namespace() -> None:
    documents = render({"autoscaler": {"enabled": True, "namespace": "team-a"}, **CLUSTER_WIDE})
    assert rbac_objects(documents) == {
        ("ClusterRole", None, "tandem-operator"),
        ("ClusterRoleBinding", None, "tandem-operator"),
        ("Role", "team-a", "tandem-autoscaler"),
        ("RoleBinding", "team-a", "tandem-autoscaler"),
    }


@pytest.mark.parametrize(
    ("values", "namespaces"),
    [
        ({"autoscaler": {"enabled": True}, **CLUSTER_WIDE}, []),
        ({"autoscaler": {"enabled": True}}, ["tandem-system"]),
        ({"autoscaler": {"enabled": True, "namespace": "team-a"}, **CLUSTER_WIDE}, ["team-a"]),
        (NAMESPACED, ["team-a", "team-b"]),
        (
            {"autoscaler": {"enabled": True, "namespace": "team-b"}, "operator": NAMESPACED["operator"]},
            ["team-b"],
        ),
    ],
)
def test_the_autoscaler_watches_its_own_namespace_else_the_operators(
    values: dict[str, Any], namespaces: list[str]
) -> None:
    (deployment,) = [
        d for d in by_kind(render(values), "Deployment") if d["metadata"]["name"] == "tandem-autoscaler"
    ]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a.removeprefix("--namespace=") for a in args if a.startswith("--namespace=")] == namespaces


def test_an_autoscaler_namespace_the_operator_does_not_watch_is_refused() -> None:
    values = {"autoscaler": {"enabled": True, "namespace": "team-c"}, "operator": NAMESPACED["operator"]}
    with pytest.raises(helm.HelmRenderError, match=r'autoscaler\.namespace "team-c" must be one of'):
        render(values)


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_chart_lints_without_errors_or_warnings(values: str) -> None:
    report = helm.lint(CHART, VALUES[values], strict=True, namespace="tandem-system")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"operator": {"replicas": 2}}, "/operator/replicas"),
        ({"operator": {"logLevel": "verbose"}}, "/operator/logLevel"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0"),
        ({"operator": {"resyncSeconds": 0}}, "/operator/resyncSeconds"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"autoscalr": {"enabled": True}}, "autoscalr"),
    ],
)
def test_the_values_schema_rejects_invalid_values(values: dict[str, Any], error: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=error):
        helm.Chart.load(CHART).render(values)


def rule_allows(rules: list[dict[str, Any]], *, group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def operator_rules(install: str = "cluster-wide") -> list[dict[str, Any]]:
    """The operator's ClusterRole rules, or (namespaced) those of its Role in team-a."""
    if install == "cluster-wide":
        roles = [
            d
            for d in by_kind(render(CLUSTER_WIDE), "ClusterRole")
            if d["metadata"]["name"] == "tandem-operator"
        ]
    else:
        roles = [
            d for d in by_kind(render(NAMESPACED), "Role")
            if d["metadata"]["name"] == "tandem-operator" and d["metadata"]["namespace"] == "team-a"
        ]  # fmt: skip
    (role,) = roles
    rules: list[dict[str, Any]] = role["rules"]
    return rules


@pytest.mark.parametrize("install", ["cluster-wide", "namespaced"])
def test_the_operator_role_allows_everything_the_operator_does(install: str) -> None:
    rules = operator_rules(install)
    for (api_version, _), plural in PLURALS.items():
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        for verb in ("get", "create", "patch", "delete"):
            assert rule_allows(rules, group=group, resource=plural, verb=verb), (plural, verb)
    for verb in ("get", "list", "watch", "patch"):
        assert rule_allows(rules, group="tandem.dev", resource="inferenceservices", verb=verb)
    assert rule_allows(rules, group="tandem.dev", resource="inferenceservices/status", verb="patch")
    assert rule_allows(rules, group="tandem.dev", resource="inferenceservices/finalizers", verb="update")
    assert rule_allows(rules, group="", resource="events", verb="create")


@pytest.mark.parametrize("install", ["cluster-wide", "namespaced"])
def test_the_operator_holds_every_permission_it_grants_the_router(install: str) -> None:
    rules = operator_rules(install)
    for rule in build_router_role(OWNER)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert rule_allows(rules, group=group, resource=resource, verb=verb)


def test_the_operator_role_grants_nothing_cluster_wide_it_does_not_need() -> None:
    rules = operator_rules()
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)
    # Secrets: by name only (those it generates, and the label check of those a spec names).
    assert not rule_allows(rules, group="", resource="secrets", verb="list")
    assert not rule_allows(rules, group="", resource="secrets", verb="watch")
    assert not rule_allows(rules, group="", resource="pods", verb="create")


def kustomize_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((KUSTOMIZE / "kustomization.yaml").read_text())
    documents: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        documents += [d for d in yaml.safe_load_all((KUSTOMIZE / name).read_text()) if d]
    return documents


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_kustomize_base_passes_strict_validation(version: str) -> None:
    for document in kustomize_documents():
        assert_valid(document, version)


def test_the_kustomize_base_matches_the_chart_defaults() -> None:
    kustomize = {d["kind"]: d for d in kustomize_documents()}
    chart = {d["kind"]: d for d in render(CLUSTER_WIDE)}
    assert kustomize["ClusterRole"]["rules"] == chart["ClusterRole"]["rules"]
    container = kustomize["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    chart_container = chart["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == chart_container["args"]
    assert container["livenessProbe"] == chart_container["livenessProbe"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_the_base(tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    built = subprocess.run(  # offline: `kustomize` needs no server; the kubeconfig does not exist
        [kubectl, "kustomize", str(KUSTOMIZE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)},
    )
    documents = [d for d in yaml.safe_load_all(built.stdout) if d]
    (deployment,) = by_kind(documents, "Deployment")
    assert deployment["metadata"]["namespace"] == "tandem-system"
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/tandem-dev/tandem:0.1.0"
    )
