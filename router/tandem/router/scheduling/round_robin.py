"""Round-robin: the baseline policy (ignores load, prefixes and SLOs)."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.router.scheduling.base import Routable
from tandem.router.types import Endpoint, EndpointSnapshot, Pool


class RoundRobin:
    """Each pool's endpoints in turn, ordered by URL, resuming after the last one picked.

    Because the cursor is the last endpoint's URL (not an index), an endpoint leaving or joining
    the candidates does not skew the turn of the others: with A, B, C and B out of rotation the
    picks go A, C, A, C; when B returns after A it goes A, B, C. A retry that excludes the
    endpoint that just failed naturally moves on to the next one.
    """

    def __init__(self) -> None:
        self._last: dict[Pool, str] = {}

    def pick(self, pool: Pool, request: Routable, candidates: Sequence[EndpointSnapshot], /) -> Endpoint:
        if not candidates:
            raise ValueError(f"no candidates to pick from in pool {pool!r}")
        ordered = sorted((snap.endpoint for snap in candidates), key=lambda e: e.url)
        last = self._last.get(pool)
        chosen = next((e for e in ordered if last is None or e.url > last), ordered[0])
        self._last[pool] = chosen.url
        return chosen
