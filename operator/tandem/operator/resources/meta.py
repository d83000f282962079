"""Names, labels, owner references and object metadata shared by every child builder.

Every child of an InferenceService `demo` in namespace `ns` is named `demo-<suffix>`, lives in `ns`,
carries the `app.kubernetes.io/*` labels plus `tandem.dev/role`, and has one controller owner
reference to the InferenceService, so that deleting the InferenceService lets Kubernetes' garbage
collector remove it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from tandem.core.spec import API_VERSION, KIND

# libyaml's emitter when PyYAML has it (10x faster; reconciles render configs every resync).
_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

#: Ports every pod of a role listens on.
ENGINE_PORT = 8000
#: The gateway's diagnostics port: `/metrics`, behind the metrics token (`tandem router --metrics-port`).
METRICS_PORT = 9090
ROUTER_PORT = 8080
REDIS_PORT = 6379

#: Label keys. The selector uses only `instance` and `tandem.dev/role` plus `name`, which never change.
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
PART_OF_LABEL = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
ROLE_LABEL = "tandem.dev/role"
MANAGED_BY = "tandem-operator"


class Role(StrEnum):
    """What a child is for; the value of its `tandem.dev/role` label."""

    PREFILL = "prefill"
    DECODE = "decode"
    KV_POOL = "kv-pool"
    ROUTER = "router"
    #: An InferenceGateway's gateway, in front of several InferenceServices.
    GATEWAY = "gateway"


@dataclass(frozen=True)
class Owner:
    """The InferenceService that owns the children: enough to name them and to reference it."""

    name: str
    namespace: str
    uid: str
    api_version: str = API_VERSION
    kind: str = KIND

    def reference(self) -> dict[str, Any]:
        """The controller owner reference every child carries.

        `blockOwnerDeletion` makes foreground deletion of the InferenceService wait for its children;
        on clusters with the OwnerReferencesPermissionEnforcement admission plugin, setting it needs
        `update` on `inferenceservices/finalizers` (granted in the chart's ClusterRole).
        """
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class Images:
    """Container images the operator uses besides the engine image given in the spec."""

    tandem: str
    redis: str


def child_name(owner: Owner, suffix: str) -> str:
    """`<service name>-<suffix>`; the spec caps service names at 52 characters, so this fits 63."""
    return f"{owner.name}-{suffix}"


def selector_labels(owner: Owner, role: Role) -> dict[str, str]:
    """Labels a role's pods are selected by (immutable for Deployments, so never extended)."""
    return {NAME_LABEL: "tandem", INSTANCE_LABEL: owner.name, ROLE_LABEL: role.value}


def labels(owner: Owner, role: Role) -> dict[str, str]:
    """Every label a child and its pods carry."""
    return {
        **selector_labels(owner, role),
        COMPONENT_LABEL: role.value,
        PART_OF_LABEL: "tandem",
        MANAGED_BY_LABEL: MANAGED_BY,
    }


def object_meta(
    owner: Owner, *, name: str, role: Role, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """`metadata` of a child: name, namespace, labels, owner reference (and annotations if any)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, role),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def to_yaml(document: Any) -> str:
    """Block-style YAML with sorted keys: stable text, so config hashes change only with content."""
    return yaml.dump(document, Dumper=_DUMPER, sort_keys=True, default_flow_style=False)
