"""Kubernetes RBAC evaluated over the chart's rendered manifests: may a ServiceAccount make a request?

The requests come off the emulated API server's log (`accesses`); the rights come from the chart as
Helm renders it (`chart_documents`). `Grants` applies the RBAC authorizer's rules to what the chart
renders, to list what it would refuse or to act as the emulator's authorizer: a ClusterRoleBinding
grants its ClusterRole's rules in every namespace and on cluster-scoped URLs; a RoleBinding grants
its Role's (or a ClusterRole's) rules in its own namespace only, so a list or watch across all
namespaces (no namespace in the URL) needs a ClusterRoleBinding. A rule allows a request when its
apiGroups, resources and verbs name the request's; the chart uses no wildcards or resourceNames
(tests/operator/test_chart_security.py checks that), so none are read here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import kmock as kmock_lib
import yaml
from tests.operator.specs import ROOT

CHART = ROOT / "charts" / "tandem"
RELEASE, RELEASE_NAMESPACE = "tandem", "tandem-system"


@dataclass(frozen=True, order=True)
class Access:
    """One request as RBAC sees it. `namespace` None: a cluster-scoped resource, or a namespaced one
    listed or watched across every namespace."""

    namespace: str | None
    group: str
    resource: str  # plural, or plural/subresource
    verb: str


def chart_documents(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`helm template` of the chart as release `tandem` in `tandem-system`: every rendered object."""
    rendered = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=RELEASE_NAMESPACE)
    documents: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            documents += [d for d in yaml.safe_load_all(text) if d]
    return documents


def rbac_verb(request: Any) -> str:
    """The RBAC verb an API server checks for an HTTP request on a resource URL."""
    method = request.method.value
    if method == "GET":
        if request.name is not None:
            return "get"
        return "watch" if request.params.get("watch") in ("true", "1") else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


def access_of(request: Any) -> Access | None:
    """What RBAC checks for one request in the emulator's log; None for discovery (/api, /apis,
    /apis/<group>/<version>, /version), which is open to every account."""
    if request.resource is None or not request.resource.plural:
        return None
    resource = request.resource.plural
    if request.subresource:
        resource = f"{resource}/{request.subresource}"
    return Access(request.namespace, request.resource.group or "", resource, rbac_verb(request))


def accesses(api: kmock_lib.KubernetesEmulator, *, made_by: Callable[[Any], bool]) -> set[Access]:
    """Every resource request in the emulator's log that `made_by` attributes to the component."""
    return {a for r in list(api) if made_by(r) and (a := access_of(r)) is not None}


def rule_allows(rules: Iterable[dict[str, Any]], *, group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


class Grants:
    """What the chart's bindings let ServiceAccount `account` (of the release's namespace) do."""

    def __init__(self, documents: list[dict[str, Any]], *, account: str) -> None:
        self.cluster_rules: list[dict[str, Any]] = []
        self.namespace_rules: dict[str, list[dict[str, Any]]] = {}
        subject = {"kind": "ServiceAccount", "name": account, "namespace": RELEASE_NAMESPACE}
        for binding in documents:
            if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            if not any({k: s.get(k) for k in subject} == subject for s in binding["subjects"]):
                continue
            namespace = binding["metadata"].get("namespace")
            rules = _role(documents, binding["roleRef"], namespace)["rules"]
            if binding["kind"] == "ClusterRoleBinding":
                self.cluster_rules += rules
            else:
                self.namespace_rules.setdefault(namespace, []).extend(rules)

    def allow(self, access: Access) -> bool:
        local = self.namespace_rules.get(access.namespace, []) if access.namespace else []
        rules = self.cluster_rules + local
        return rule_allows(rules, group=access.group, resource=access.resource, verb=access.verb)

    def refused(self, made: Iterable[Access]) -> list[Access]:
        """The accesses not granted, sorted; [] when every one is allowed."""
        return sorted(a for a in made if not self.allow(a))

    def authorizer(self, *, made_by: Callable[[Any], bool]) -> Callable[[Any], bool]:
        """For `StampingEmulator.authorize`: refuses the component's requests these grants do not
        allow; everyone else's (the test's own) pass."""

        def authorize(request: Any) -> bool:
            access = access_of(request) if made_by(request) else None
            return access is None or self.allow(access)

        return authorize


def _role(documents: list[dict[str, Any]], ref: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """The role a binding's roleRef names (a Role in the binding's namespace, or a ClusterRole)."""
    for document in documents:
        meta = document["metadata"]
        same_scope = ref["kind"] == "ClusterRole" or meta.get("namespace") == namespace
        if document["kind"] == ref["kind"] and meta["name"] == ref["name"] and same_scope:
            return document
    raise AssertionError(f"a binding refers to {ref['kind']} {ref['name']}, which the chart does not render")
