"""The operator's view of the Kubernetes API: four verbs on namespaced objects, as a Protocol.

The reconcile logic talks only to this Protocol; `tandem.operator.kube` implements it with
Tandem's client (`tandem.core.kubeaccess`), and tests may implement it in memory. Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any, Protocol

from tandem.core.kubeerror import KubeError
from tandem.operator.objects import ObjectRef

#: The API server refused or failed a request: Tandem's one Kubernetes error (`status`: the HTTP
#: status, 0: no answer; `transient`: whether a retry later may succeed).
ClusterError = KubeError


class Cluster(Protocol):
    """Namespaced object access. Every method raises ClusterError on a failed request."""

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        ...

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the object; returns it as stored."""
        ...

    def patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        """Apply a JSON merge patch (RFC 7386); returns the object as stored."""
        ...

    def delete(self, ref: ObjectRef) -> None:
        """Delete the object (background propagation); a missing object is not an error."""
        ...


class ListingCluster(Cluster, Protocol):
    """A Cluster that also lists a kind's objects in a namespace (the handlers' view of the
    InferenceServices and InferenceGateways around the object they reconcile)."""

    def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        """Every object of the kind in the namespace; raises ClusterError (404: the kind is unknown)."""
        ...
