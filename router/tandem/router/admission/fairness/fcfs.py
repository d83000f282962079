"""First come, first served: the baseline the VTC queue is measured against.

`FCFSQueue` keeps every piece of VTC's bookkeeping (counters are charged and lifted the same way, so
the per-tenant metrics mean the same thing under both policies) and changes only the choice: within
the highest non-empty priority band, the oldest request goes first whoever sent it. Under overload a
tenant's share of service is then its share of the requests waiting, which is what VTC corrects.
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
