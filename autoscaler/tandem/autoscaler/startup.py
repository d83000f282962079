"""How long a new replica of a pool takes to become ready, learned from the pool's own scale-ups.

Every scale-up asks for replicas at a known time (`asked`); when the pool's ready count rises, the oldest
outstanding asks are matched to the replicas that became ready (`readied`) and each wait is one sample of
the start time, smoothed exponentially (weight `SMOOTHING` on the newest). A scale-down first cancels the
newest outstanding asks (`cancelled`: Kubernetes' ReplicaSet and the local actuator both remove replicas
that are still starting first), and asks older than `forget_after_s` (replicas that never became ready)
are dropped without a sample. Replicas nobody asked for (the initial ones, a manual scale) teach nothing.

Example: 2 asked at t = 10; one ready at t = 15, the other at t = 17 → samples 5 s and 7 s; estimate 5.0,
then 0.3 × 7 + 0.7 × 5 = 5.6 s.

Pure: time is passed in (monotonic seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

SMOOTHING = 0.3


@dataclass(frozen=True, slots=True)
class StartTimes:
    """Outstanding asks (monotonic seconds each replica was asked for, oldest first) and the estimate."""

    pending: tuple[float, ...] = ()
    estimate_s: float | None = None
    samples: int = 0


def asked(times: StartTimes, *, now: float, count: int) -> StartTimes:
    """`count` more replicas asked for at `now`."""
    return replace(times, pending=(*times.pending, *([now] * max(0, count))))


def cancelled(times: StartTimes, *, count: int) -> StartTimes:
    """`count` replicas fewer asked for: the newest outstanding asks go (no sample)."""
    keep = max(0, len(times.pending) - max(0, count))
    return replace(times, pending=times.pending[:keep])


def readied(times: StartTimes, *, now: float, count: int, forget_after_s: float) -> StartTimes:
    """`count` replicas became ready at `now`: as many of the oldest asks become samples."""
    pending = tuple(t for t in times.pending if now - t <= forget_after_s)
    matched, rest = pending[: max(0, count)], pending[max(0, count) :]
    estimate, samples = times.estimate_s, times.samples
    for started in matched:
        took = now - started
        estimate = took if estimate is None else SMOOTHING * took + (1.0 - SMOOTHING) * estimate
        samples += 1
    return StartTimes(pending=rest, estimate_s=estimate, samples=samples)
