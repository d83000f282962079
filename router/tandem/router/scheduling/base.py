"""The scheduling boundary: one small Protocol every policy implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.router.types import Endpoint, EndpointSnapshot, Pool, RequestView


class Scheduler(Protocol):
    """Chooses the endpoint of `pool` that serves `request`.

    Contract: `candidates` is non-empty, holds only endpoints of `pool` that are in rotation and not
    yet tried by this request, and is in discovery order; the result is one of them. `pick` is
    synchronous, does no I/O and must not mutate its arguments; it may update the policy's own
    state (a cursor, counters). Called on the event loop, so it must be cheap (microseconds).
    Parameters are positional-only so implementations may name them as they like.
    """

    def pick(
        self, pool: Pool, request: RequestView, candidates: Sequence[EndpointSnapshot], /
    ) -> Endpoint: ...
