"""First come, first served: the baseline the VTC queue is measured against.

`FCFSQueue` keeps every piece of VTC's bookkeeping (counters are charged and lifted the same way, so
the per-tenant metrics mean the same thing under both policies) and changes only the choice: within
the highest non-empty priority band, the oldest request goes first whoever sent it. Under overload a
tenant's share of service is then its share of the requests waiting, which is what VTC corrects.
As a baseline it also knows nothing of tenants when the queue is full: the newcomer is refused
(unless a lower band has a request to push out), and what is ahead of a request is everything
waiting in its band and above.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TypeVar

from tandem.router.admission.fairness.vtc import Ticket, VTCQueue

T = TypeVar("T")


class FCFSQueue(VTCQueue[T]):
    """`VTCQueue` ordered by arrival only (priority bands still apply)."""

    def _next_tenant(self, band: Mapping[str, deque[Ticket[T]]]) -> str:
        return min(band, key=lambda t: band[t][0].seq)

    def ahead(self, *, tenant: str, priority: int = 0) -> int:
        return sum(n for band, n in self.depths().items() if band >= priority)

    def displaceable(self, *, tenant: str, priority: int = 0) -> Ticket[T] | None:
        if any(band < priority for band in self.depths()):
            return super().displaceable(tenant=tenant, priority=priority)
        return None
