"""Plain types for Kubernetes objects as the operator handles them: references and desired children.

Pure: no I/O. Manifests are plain JSON-compatible dicts, as the API server speaks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: A path into a manifest, e.g. ("spec", "replicas").
FieldPath = tuple[str, ...]


@dataclass(frozen=True, order=True)
class ObjectRef:
    """Identifies one namespaced object: `apps/v1 Deployment ns/demo-decode`."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> ObjectRef:
        """The reference of a manifest that has apiVersion, kind, metadata.namespace and .name."""
        meta = manifest["metadata"]
        return cls(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Child:
    """One object an InferenceService should own.

    `create_only` lists fields written when the object is created and then left alone, because
    someone else owns them afterwards (a Deployment's `spec.replicas` under autoscaling). `owned`
    lists fields the operator owns whole even when `manifest` leaves them out: a live value there is
    removed (an engine pod's `initContainers`, which only LMCache engines have).
    """

    manifest: dict[str, Any]
    create_only: tuple[FieldPath, ...] = ()
    owned: tuple[FieldPath, ...] = ()

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef.of(self.manifest)
