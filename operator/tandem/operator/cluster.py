"""The operator's view of the Kubernetes API: four verbs on namespaced objects, as a Protocol.

The reconcile logic talks only to this Protocol; `tandem.operator.kube` implements it with the
official client, and tests may implement it in memory. Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any, Protocol

from tandem.operator.objects import ObjectRef


class ClusterError(Exception):
    """The API server refused or failed a request; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def transient(self) -> bool:
        """Whether retrying the same request later may succeed (conflicts, throttling, outages)."""
        return self.status in (0, 409, 429) or self.status >= 500


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
