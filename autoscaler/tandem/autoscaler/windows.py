"""Time windows over timestamped samples, the bookkeeping behind the decider.

Pure: no I/O and no clock of its own; every function takes ``now`` (monotonic seconds) from its caller,
so tests drive it with a fake clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Sample:
    """One value seen at monotonic time ``t`` (seconds)."""

    t: float
    value: float


def within(samples: Sequence[Sample], *, now: float, window_s: float) -> tuple[Sample, ...]:
    """Samples with ``now - window_s < t <= now``: a window is half-open at its old end.

    Example: samples at t = 0, 30, 60 with now = 60 and window_s = 60 keep t = 30 and t = 60.
    """
    return tuple(s for s in samples if now - window_s < s.t <= now)


def mean(samples: Sequence[Sample]) -> float:
    """Arithmetic mean of the values; 0.0 for no samples. Example: values 1, 2, 6 → 3.0."""
    if not samples:
        return 0.0
    return sum(s.value for s in samples) / len(samples)


def median(values: Iterable[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count); 0.0 for none.
    Example: 3, 1, 2 → 2; 4, 1, 2, 3 → 2.5."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def peak(samples: Sequence[Sample]) -> float:
    """Largest value; 0.0 for no samples. Example: values 3, 5, 4 → 5.0."""
    return max((s.value for s in samples), default=0.0)


def ceil_replicas(demand: float) -> int:
    """Replicas needed for a demand in replica-equivalents, rounded up, ignoring float noise below 1e-9.

    Example: 2.0000000001 → 2 (noise from 0.7 × 2 / 0.7), 2.1 → 3, -0.5 → 0.
    """
    return max(0, math.ceil(demand - _EPSILON))
