"""Per-request latencies and their distributions (pure).

Definitions, for one streamed request (all times in engine seconds: wall seconds × time scale):
- **TTFT** = time of the first chunk with non-empty content − time the request was sent. Waiting for
  a client slot before sending is not included (it is `queue`), as in vLLM's `bench serve`.
- **TPOT** (time per output token after the first) = (time of the last content chunk − time of the
  first) / (completion tokens − 1); defined for requests with at least 2 tokens. Completion tokens
  come from the `usage` chunk (the number of content chunks when there is none).
  Example: first token at 0.20 s, last at 1.20 s, 101 tokens → TPOT = 1.00 / 100 = 10 ms.
- **ITL** (inter-token latency): the gaps between consecutive content chunks.
- **E2E** = end of the stream − time sent. **Queue** = time sent − arrival.
Only successful requests (`ok`) enter the distributions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.bench.records import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0 <= q <= 100) by linear interpolation between closest ranks (numpy's
    default, as vLLM's benchmark uses): rank = q/100 × (n − 1). None for no values.

    Examples: [1, 2, 3, 4] → p50 = 2.5, p90 = 3.7; [5] → every percentile is 5.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100] (got {q})")
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    """`{count, mean, p50, p90, p99, max}` of the values (None entries when there are none)."""
    data = list(values)
    summary: dict[str, float | int | None] = {
        "count": len(data),
        "mean": sum(data) / len(data) if data else None,
    }
    for q in PERCENTILES:
        summary[f"p{q}"] = percentile(data, q)
    summary["max"] = max(data) if data else None
    return summary


@dataclass(frozen=True)
class Timed:
    """One request's facts with its times multiplied by the time scale (engine seconds since start);
    `status` is the HTTP status (None: no answer)."""

    tenant: str
    ok: bool
    arrival: float
    start: float | None
    token_times: tuple[float, ...]
    end: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    status: int | None = None

    @property
    def tokens_out(self) -> int:
        """Completion tokens from usage, else the number of content chunks."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        if self.start is None or not self.token_times:
            return None
        return self.token_times[0] - self.start

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2 or self.tokens_out < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.tokens_out - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def queue(self) -> float | None:
        return None if self.start is None else self.start - self.arrival

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


def timed(records: Iterable[RequestRecord], *, time_scale: float) -> list[Timed]:
    """Records → `Timed` views in engine seconds (wall seconds × `time_scale`)."""

    def scale(value: float | None) -> float | None:
        return None if value is None else value * time_scale

    return [
        Timed(
            tenant=r.tenant,
            ok=r.ok,
            arrival=r.arrival_s * time_scale,
            start=scale(r.start_s),
            token_times=tuple(t * time_scale for t in r.token_times_s),
            end=scale(r.end_s),
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            status=r.status,
        )
        for r in records
    ]


def latency_summary(requests: Sequence[Timed]) -> dict[str, Any]:
    """Distributions of TTFT, TPOT, ITL, E2E and queue time over the successful requests (seconds)."""
    ok = [r for r in requests if r.ok]
    return {
        "ttft_s": distribution(v for r in ok if (v := r.ttft) is not None),
        "tpot_s": distribution(v for r in ok if (v := r.tpot) is not None),
        "itl_s": distribution(v for r in ok for v in r.itls()),
        "e2e_s": distribution(v for r in ok if (v := r.e2e) is not None),
        "queue_s": distribution(v for r in ok if (v := r.queue) is not None),
    }


def throughput(requests: Sequence[Timed]) -> dict[str, Any]:
    """Successful requests and tokens per engine second, over [0, the last end of any request]."""
    ok = [r for r in requests if r.ok]
    span = max((r.end for r in requests if r.end is not None), default=0.0)
    output = sum(r.tokens_out for r in ok)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    return {
        "duration_s": span,
        "requests_per_s": len(ok) / span if span > 0 else None,
        "output_tokens_per_s": output / span if span > 0 else None,
        "prompt_tokens_per_s": prompt / span if span > 0 else None,
        "output_tokens": output,
        "prompt_tokens": prompt,
    }


@dataclass(frozen=True)
class Slo:
    """Latency objectives per request: TTFT and TPOT in seconds (DistServe's pair)."""

    ttft_s: float = 1.0
    tpot_s: float = 0.1


def meets(r: Timed, slo: Slo) -> bool:
    """Whether one request succeeded within both objectives; a 1-token answer has no TPOT and only
    needs the TTFT one."""
    if not r.ok or r.ttft is None or r.ttft > slo.ttft_s:
        return False
    tpot = r.tpot
    return tpot is None or tpot <= slo.tpot_s


def slo_report(requests: Sequence[Timed], slo: Slo) -> dict[str, Any]:
    """SLO attainment and goodput (DistServe): requests meeting both objectives, as a fraction of all
    requests and per engine second over [0, the last end].

    Example: 10 requests over 5 s, 8 within both objectives → attainment 0.8, goodput 1.6 req/s
    (throughput 2.0 req/s if all 10 succeeded).
    """
    met = sum(meets(r, slo) for r in requests)
    span = max((r.end for r in requests if r.end is not None), default=0.0)
    return {
        "ttft_slo_s": slo.ttft_s,
        "tpot_slo_s": slo.tpot_s,
        "met": met,
        "attainment": met / len(requests) if requests else None,
        "goodput_rps": met / span if span > 0 else None,
    }
