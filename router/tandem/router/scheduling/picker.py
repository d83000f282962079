"""The picker: the highest weighted total wins, with a deterministic tie-break."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.router.scheduling.plugins import Scored
from tandem.router.types import Endpoint

#: Totals closer than this are equal (float noise from summing weighted scores).
TIE_TOLERANCE = 1e-9


class MaxScorePicker:
    """argmax of `Scored.total`. Ties (within `TIE_TOLERANCE`) go to the candidate with the fewest
    requests in flight, then to the one this picker chose least recently (never chosen counts as
    oldest), then to the smallest URL. The recency step makes equal candidates take turns, so an idle
    pool with no prefix to follow still spreads requests instead of sending all to the first URL.

    Example: totals A 5.0, B 5.0, C 4.2; in flight A 1, B 1; A chosen last → B.
    State: one counter per endpoint chosen (bounded by the endpoints ever seen).
    """

    name = "max-score"

    def __init__(self) -> None:
        self._turn = 0
        self._chosen_at: dict[Endpoint, int] = {}

    def pick(self, scored: Sequence[Scored], /) -> Scored:
        if not scored:
            raise ValueError("nothing to pick from")
        best = max(s.total for s in scored)
        tied = [s for s in scored if best - s.total <= TIE_TOLERANCE]
        chosen = min(tied, key=self._tie_key)
        self._turn += 1
        self._chosen_at[chosen.candidate.endpoint] = self._turn
        return chosen

    def forget(self, keep: set[Endpoint]) -> None:
        """Drop the recency of endpoints not in `keep` (they left discovery)."""
        self._chosen_at = {e: t for e, t in self._chosen_at.items() if e in keep}

    def _tie_key(self, scored: Scored) -> tuple[int, int, str]:
        candidate = scored.candidate
        return (candidate.snapshot.in_flight, self._chosen_at.get(candidate.endpoint, 0), candidate.url)
