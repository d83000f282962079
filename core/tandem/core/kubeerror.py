"""The one error every Tandem component's Kubernetes calls fail with. Pure: no I/O.

The operator's and the autoscaler's `ClusterError` are this class; `tandem.core.kubeaccess` translates
transport failures, non-2xx answers and malformed documents into it at the boundary.
"""

from __future__ import annotations


class KubeError(Exception):
    """A Kubernetes API request failed: `status` is the HTTP status (0: no answer, or an answer that
    is not a Kubernetes document)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def transient(self) -> bool:
        """Whether retrying the same request later may succeed (conflicts, throttling, outages)."""
        return self.status in (0, 409, 429) or self.status >= 500
