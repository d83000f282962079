"""How long a request runs in a decode engine as the engine's load grows, learned from the rounds seen.

Pure: plain data in, plain data out; time is the caller's monotonic seconds.

**Why.** A decode engine's step reads every running sequence's KV, and every request it admits stalls
the batch once (its KV load, or a converted prefill), so the seconds a request runs there grow with the
engine's concurrency c (running requests per engine). Little's law with it: λ requests/s each running
s(c) seconds keep L = λ·s(c) running, and n engines at concurrency c run L = n·c. With every engine at
its KV target, c* = target ÷ (the KV share of one running request), and

    n = λ · s(c*) / c*

The service time measured now is s(c) at today's load: at a step from idle it is the idle one, and the
demand under-counted by s(c*) / s(c_idle) (0.83 s at idle against 1.6–2.0 s at the peak on the held-out
step, docs/autoscaler.md; and by half again on that simulator's clock, below).
Example: s(c) = 0.6 + 0.1·c s, c* = 12, 15 requests/s → n = 15 × 1.8 / 12 = 2.25 → 3 replicas, where the
idle service time (c = 1: 0.7 s) said 15 × 0.7 / 12 = 0.875 → 1.

**The line.** s(c) ≈ a + b·c, from points per engine and interval between two scrapes (the mean
service time of the requests that finished in it and the running count they saw: the collector's
`tandem.autoscaler.observe.learn_service`), each added to the concurrency bin it falls in (bins grow
geometrically: ``floor(log(1 + c) / log(BIN_BASE))``, so idle loads of 1, 2 and 3 running fall in
different bins and 90 and 105 in one); a bin holds the weighted mean of its points
(weight: requests finished), its weight capped at `BIN_WEIGHT_CAP` so it follows a drifting load, and
is forgotten `SERVICE_MEMORY_S` after its last point. The fit (`fit_service`) over the bins of at
least `MIN_BIN_WEIGHT`: Theil–Sen (the median of the pairwise slopes, which one odd bin moves little),
at least 0 (service time does not fall with load); intercept the median of s − b·c, and when that is
negative, the line through 0 with the median s / c: a request's time grows at most in proportion to
the concurrency (an engine's throughput c / s(c) does not fall as it batches more), which bounds an
extrapolation from a narrow, noisy idle spread. Floor: the lowest-concurrency bin's time (the idle
value). Fewer than two bins apart by `MIN_SPREAD` running requests: no line, and the decider keeps the
service time as measured.

**The clock.** Engines report their latencies on their own clock (Tandem's simulator at `--time-scale
0.5` reports simulated seconds, half the wall seconds its requests take), while arrivals are counted
per wall second. Little's law on the engines fixes the ratio without knowing the engine: over a span,
the request-seconds the `running` gauge integrates on the autoscaler's clock equal the service seconds
the finished requests report, times the ratio (`clock_ratio`). Real vLLM reports wall seconds: ≈ 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tandem.autoscaler.windows import median

#: Bin k holds points with 1 + c in [BIN_BASE^k, BIN_BASE^(k+1)).
BIN_BASE = 1.25
#: A bin's weight (finished requests) stops growing here, so that its mean follows a load that drifts:
#: a new point weighs its finished requests against at most this many before it.
BIN_WEIGHT_CAP = 200.0
#: A bin joins the fit from this many finished requests on (a handful is noise).
MIN_BIN_WEIGHT = 10.0
#: Two bins give a slope only when their mean concurrencies differ by this many running requests.
MIN_SPREAD = 0.5
#: Seconds a bin is kept after its last point (as long as a measured prefill rate: the workload may change).
SERVICE_MEMORY_S = 600.0
#: The clock ratio is measured over this many seconds of rounds, once this many requests finished in them.
CLOCK_MEMORY_S = 120.0
MIN_CLOCK_FINISHED = 20.0


@dataclass(frozen=True, slots=True)
class ServicePoint:
    """One engine over one window: mean running requests, mean service seconds (engine clock) of the
    `finished` requests that finished in it."""

    concurrency: float
    service_s: float
    finished: float


@dataclass(frozen=True, slots=True)
class ServiceBin:
    """The weighted mean point of bin `index`, last updated at `t`."""

    index: int
    concurrency: float
    service_s: float
    weight: float
    t: float


@dataclass(frozen=True, slots=True)
class ServiceCurve:
    """s(c) = max(floor, intercept + slope·c) seconds; c is running requests per engine."""

    intercept_s: float
    slope_s: float
    floor_s: float

    def at(self, concurrency: float) -> float:
        """Seconds a request runs at `concurrency`. Example: 0.6 + 0.1·c, floor 0.7 → at(12) = 1.8,
        at(0) = 0.7."""
        return max(self.floor_s, self.intercept_s + self.slope_s * concurrency)

    def scaled(self, factor: float) -> ServiceCurve:
        """The same curve on another clock (every term × `factor`). Example: × 2 → 1.2 + 0.2·c, floor 1.4."""
        return ServiceCurve(self.intercept_s * factor, self.slope_s * factor, self.floor_s * factor)


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One round's increments over the pool's engines: request-seconds running on the autoscaler's clock
    (∫ Σ running dt), service seconds the engines reported for the requests that finished, and how many;
    Σ running at the round's first and last scrape."""

    t: float
    running_s: float
    reported_s: float
    finished: float
    running_start: float = 0.0
    running_end: float = 0.0


@dataclass(frozen=True, slots=True)
class ServiceMemory:
    """What the collector has learned of a decode pool's service time: the bins and the clock samples."""

    bins: tuple[ServiceBin, ...] = ()
    clock: tuple[ClockSample, ...] = ()


def bin_index(concurrency: float) -> int:
    """The bin of a concurrency. Examples: 0 → 0; 1 → 3; 2 → 4; 3 → 6; 10 → 10; 100 and 105 → 20; 110 → 21."""
    return math.floor(math.log1p(max(0.0, concurrency)) / math.log(BIN_BASE) + 1e-9)


def learn_point(
    bins: tuple[ServiceBin, ...], point: ServicePoint, *, now: float, memory_s: float = SERVICE_MEMORY_S
) -> tuple[ServiceBin, ...]:
    """`bins` with `point` added to its bin and bins older than `memory_s` dropped, ordered by index.
    Example: a bin at (1.6 running, 1.0 s, weight 200) and a point (1.8, 1.2 s, 20 finished) in it →
    (200 × 1.0 + 20 × 1.2) / 220 = 1.018 s at concurrency 1.618, weight 220 (the prior counts at most
    200 again at the next point)."""
    if point.finished <= 0 or not all(map(math.isfinite, (point.concurrency, point.service_s))):
        return tuple(b for b in bins if now - b.t <= memory_s)
    index = bin_index(point.concurrency)
    kept = {b.index: b for b in bins if now - b.t <= memory_s}
    old = kept.get(index)
    if old is None:
        kept[index] = ServiceBin(index, point.concurrency, point.service_s, point.finished, now)
    else:
        prior = min(old.weight, BIN_WEIGHT_CAP)
        weight = prior + point.finished
        kept[index] = ServiceBin(
            index=index,
            concurrency=(prior * old.concurrency + point.finished * point.concurrency) / weight,
            service_s=(prior * old.service_s + point.finished * point.service_s) / weight,
            weight=weight,
            t=now,
        )
    return tuple(kept[i] for i in sorted(kept))


def fit_service(bins: Sequence[ServiceBin]) -> ServiceCurve | None:
    """The line through the bins (module docstring); None without two usable bins `MIN_SPREAD` apart.

    Examples (concurrency, seconds): (1, 0.7), (2, 0.8), (4, 1.0) → slopes 0.1, 0.1, 0.1: 0.6 + 0.1·c,
    floor 0.7. (1, 0.7), (2, 0.8), (4, 1.0), (6, 0.5) (one odd bin) → slopes 0.1, 0.1, 0.1, −0.04,
    −0.075, −0.25: median 0.03, intercept median(0.67, 0.74, 0.88, 0.32) = 0.705. (1, 0.5), (2, 1.5) →
    slope 1.0, intercept −0.5 < 0: through 0 with median(0.5, 0.75) = 0.625 per running request.
    """
    usable = [b for b in bins if b.weight >= MIN_BIN_WEIGHT]
    slopes = [
        (q.service_s - p.service_s) / (q.concurrency - p.concurrency)
        for i, p in enumerate(usable)
        for q in usable[i + 1 :]
        if abs(q.concurrency - p.concurrency) >= MIN_SPREAD
    ]
    if not slopes:
        return None
    slope = max(0.0, median(slopes))
    intercept = median([b.service_s - slope * b.concurrency for b in usable])
    if intercept < 0:
        slope = median([b.service_s / b.concurrency for b in usable if b.concurrency > 0])
        intercept = 0.0
    floor = min(usable, key=lambda b: b.concurrency).service_s
    return ServiceCurve(intercept_s=intercept, slope_s=slope, floor_s=floor)


def learn_clock(
    samples: tuple[ClockSample, ...], sample: ClockSample, *, memory_s: float = CLOCK_MEMORY_S
) -> tuple[ClockSample, ...]:
    """`samples` with `sample` appended and those older than `memory_s` before it dropped."""
    return tuple(s for s in (*samples, sample) if sample.t - s.t < memory_s)


def clock_ratio(samples: Sequence[ClockSample]) -> float | None:
    """Seconds on the autoscaler's clock per second the engines report (module docstring); None until
    `MIN_CLOCK_FINISHED` requests finished. Over the span, the running request-seconds R are the
    finished requests' service seconds on this clock, u·S, plus the time the requests still running at
    its end have run, less the time those finished had run before it began: about half a service time
    each, so R = u·S + u·(L_end − L_start)·s / 2 (s = S / N the mean reported time), and

        u = R / (S + (L_end − L_start) · s / 2)

    which holds through a step (the running requests of a burst have not finished yet: R alone grew
    ahead of S and read the clock high). Examples: 96 request-seconds running while 60 requests finished
    reporting 50 s, as many running at both ends → 1.92 (a simulator at time scale 0.5). A step from
    nothing to 10 requests/s of 1 s each (vLLM's clock), over its first 3 s: 25 request-seconds, 20
    finished reporting 20 s, running 0 → 10 → 25 / (20 + 10 × 1 / 2) = 1.0, where R / S says 1.25."""
    finished = sum(s.finished for s in samples)
    reported = sum(s.reported_s for s in samples)
    if finished < MIN_CLOCK_FINISHED or reported <= 0:
        return None
    rise = samples[-1].running_end - samples[0].running_start
    edges = reported + rise * (reported / finished) / 2
    return sum(s.running_s for s in samples) / edges if edges > 0 else None


def remember_service(
    memory: ServiceMemory, *, points: Sequence[ServicePoint], clock: ClockSample | None, now: float
) -> ServiceMemory:
    """`memory` after one round: its engines' points and the round's clock sample (None: none)."""
    bins = memory.bins
    for point in points:
        bins = learn_point(bins, point, now=now)
    if not points:
        bins = tuple(b for b in bins if now - b.t <= SERVICE_MEMORY_S)
    samples = memory.clock if clock is None else learn_clock(memory.clock, clock)
    return replace(memory, bins=bins, clock=samples)
