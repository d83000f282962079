"""A small evaluator of Kubernetes NetworkPolicy ingress semantics, for the policy tests.

It answers "may a pod with these labels in this namespace open a TCP connection to that pod's port?"
as the NetworkPolicy API defines it (networking.k8s.io/v1):

- a pod no ingress policy selects accepts everything; a pod some policy selects accepts only what
  one of those policies' rules allows (policies are additive allow-lists);
- a rule with no `from` allows every source, with no `ports` every port;
- a peer with only `podSelector` means pods of the policy's own namespace; with `namespaceSelector`,
  pods of the namespaces it selects (namespaces carry `kubernetes.io/metadata.name`); both in one
  peer must both match; an empty selector selects everything;
- a port is a number or a container port's name on the destination pod, with an optional `endPort`.

`ipBlock` peers are treated as matching no pod (the Tandem policies have none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    """A pod as the policies see it: namespace, labels, and its named container ports."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects `labels`."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def namespace_labels(name: str) -> dict[str, str]:
    """The labels the API server guarantees on a namespace."""
    return {"kubernetes.io/metadata.name": name}


def peer_matches(peer: Mapping[str, Any], source: Pod, *, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return False
    namespaces = peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selects(namespaces, namespace_labels(source.namespace))
    pods = peer.get("podSelector")
    return in_namespace and (pods is None or selects(pods, source.labels))


def port_matches(spec: Mapping[str, Any], port: int, destination: Pod) -> bool:
    if spec.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in spec:
        return True
    wanted = spec["port"]
    if isinstance(wanted, str):
        return destination.named_ports.get(wanted) == port
    return bool(wanted <= port <= spec.get("endPort", wanted))


def allowed(policies: Sequence[Mapping[str, Any]], *, source: Pod, destination: Pod, port: int) -> bool:
    """Whether `source` may connect to `destination` on TCP `port` under `policies`."""
    selecting = [
        p
        for p in policies
        if p["kind"] == "NetworkPolicy"
        and p["metadata"]["namespace"] == destination.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], destination.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            ports = rule.get("ports") or []
            namespace = policy["metadata"]["namespace"]
            if peers and not any(peer_matches(p, source, policy_namespace=namespace) for p in peers):
                continue
            if ports and not any(port_matches(p, port, destination) for p in ports):
                continue
            return True
    return False
