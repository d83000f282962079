"""One engine's `/metrics` text reduced to what the autoscaler reads, the gateway's demand signals, and
histogram arithmetic.

Pure: text in, values out (prometheus_client's text parser, no I/O). Names are vLLM's
(research: engine-lab.md, anchors.md §1); Tandem's simulator serves the same ones. When an engine
reports several series of one name (vLLM with several engine cores, one `engine` label each),
counters and histograms are summed, queue gauges summed and KV utilisation averaged.

Histogram quantiles follow Prometheus' `histogram_quantile`: find the bucket holding rank q × count
and interpolate linearly inside it (the first bucket starts at 0); a rank in the +Inf bucket answers
the largest finite bound. Example: buckets ≤0.1: 2, ≤0.5: 8, ≤1: 10 (cumulative), q = 0.9 → rank 9,
in (0.5, 1] which holds 2 → 0.5 + (9 − 8) / 2 × 0.5 = 0.75 s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PROMPT_TOKENS = "vllm:prompt_tokens"  # counter family; the sample is vllm:prompt_tokens_total
TTFT = "vllm:time_to_first_token_seconds"
#: Finished requests' time in the engine and, of it, in its waiting queue (histogram families; the
#: autoscaler reads their _sum and _count): what is left is the time a request runs, for Little's law.
E2E = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
#: The gateway's admission queue: requests waiting for decode capacity, one series per priority band.
GATEWAY_QUEUE = "tandem_router_queue_depth"
#: Requests the gateway holds while the decode pool has no engine (scale from zero).
GATEWAY_HELD = "tandem_router_held_requests"
#: Requests the gateway holds for a prefill engine with room (late binding of prefills).
GATEWAY_PREFILL_HELD = "tandem_router_pd_prefill_held"
#: Upstream requests the gateway has open per pool (label `pool`); the prefill pool's are on their way
#: to decode.
GATEWAY_POOL_IN_FLIGHT = "tandem_router_pool_in_flight_requests"
#: Requests and their prompt tokens arriving at the gateway (counter families; samples end in _total).
GATEWAY_ARRIVALS = "tandem_router_arrivals"
GATEWAY_ARRIVAL_TOKENS = "tandem_router_arrival_prompt_tokens"
COUNTERS = {
    f"{GATEWAY_ARRIVALS}_total": GATEWAY_ARRIVALS,
    f"{GATEWAY_ARRIVAL_TOKENS}_total": GATEWAY_ARRIVAL_TOKENS,
}
#: The gateway's observed prefill throughput per engine (tokens/s, overhead included; label `endpoint` =
#: the engine's host:port; only engines it has seen a first token from).
GATEWAY_PREFILL_RATE = "tandem_router_endpoint_prefill_throughput_tokens_per_second"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: ascending (upper bound, count ≤ bound) pairs ending with +Inf."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineReading:
    """What one scrape of one engine said; None where the engine did not report the metric."""

    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    prompt_tokens: float | None = None
    ttft: Histogram | None = None
    #: Σ seconds finished requests spent in the engine and, of those, waiting; how many finished.
    e2e_sum: float | None = None
    queue_sum: float | None = None
    finished: float | None = None
    #: When the answer arrived (the scraper's monotonic seconds; None: take the round's time). Rates
    #: divide by the time between two answers: a scrape that waited on a busy process reads its
    #: counters late, and the round's start time would put that wait into the rate.
    at: float | None = None


def parse_engine_metrics(text: str) -> EngineReading:
    """The autoscaler's view of one `/metrics` page; raises ValueError when it is not exposition text."""
    gauges: dict[str, list[float]] = {}
    prompt_tokens: list[float] = []
    ttft: dict[float, float] = {}
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name in (KV_USAGE, RUNNING, WAITING) and sample.name == family.name:
                    gauges.setdefault(family.name, []).append(sample.value)
                elif family.name == PROMPT_TOKENS and sample.name == f"{PROMPT_TOKENS}_total":
                    prompt_tokens.append(sample.value)
                elif family.name == TTFT and sample.name == f"{TTFT}_bucket":
                    bound = float(sample.labels["le"])
                    ttft[bound] = ttft.get(bound, 0.0) + sample.value
                elif family.name in (E2E, QUEUE_TIME) and sample.name in (
                    f"{family.name}_sum",
                    f"{family.name}_count",
                ):
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # the parser's ways of saying "not metrics"
        raise ValueError(f"not Prometheus text: {exc}") from None
    kv = gauges.get(KV_USAGE)
    return EngineReading(
        kv_usage=sum(kv) / len(kv) if kv else None,
        running=sum(gauges[RUNNING]) if RUNNING in gauges else None,
        waiting=sum(gauges[WAITING]) if WAITING in gauges else None,
        prompt_tokens=sum(prompt_tokens) if prompt_tokens else None,
        ttft=Histogram(tuple(sorted(ttft.items()))) if ttft and math.inf in ttft else None,
        e2e_sum=sums.get(f"{E2E}_sum"),
        queue_sum=sums.get(f"{QUEUE_TIME}_sum"),
        finished=sums.get(f"{E2E}_count"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayReading:
    """What one scrape of one gateway replica said about demand.

    `queued`: requests in its admission queue (Σ over priority bands; 0 without the metric);
    `held`: requests held while the decode pool has no engine; `prefill_held`: requests held for a
    prefill engine with room (they wait in the gateway instead of an engine's queue); `prefill_in_flight`:
    its requests open to prefill engines (in prefill now, bound for decode next); `arrivals` /
    `arrival_tokens`: its lifetime counters of arriving requests and their prompt tokens (None: not
    exported); `prefill_rates`: its observed prefill throughput (tokens/s, overhead included) per engine
    host:port."""

    queued: float = 0.0
    held: float = 0.0
    prefill_held: float = 0.0
    prefill_in_flight: float = 0.0
    arrivals: float | None = None
    arrival_tokens: float | None = None
    prefill_rates: Mapping[str, float] = field(default_factory=dict)
    #: When the answer arrived (as `EngineReading.at`).
    at: float | None = None


def parse_gateway(text: str) -> GatewayReading:
    """One gateway replica's `/metrics` page as a `GatewayReading`; raises ValueError when the text is
    not exposition text. Example: queue bands 0: 3 and 1: 4 → queued 7.0."""
    sums = {GATEWAY_QUEUE: 0.0, GATEWAY_HELD: 0.0, GATEWAY_PREFILL_HELD: 0.0}
    counters: dict[str, float] = {}
    rates: dict[str, float] = {}
    prefill_in_flight = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name in sums and sample.name == family.name:
                    sums[family.name] += sample.value
                elif sample.name in COUNTERS:
                    name = COUNTERS[sample.name]
                    counters[name] = counters.get(name, 0.0) + sample.value
                elif family.name == GATEWAY_POOL_IN_FLIGHT and sample.labels.get("pool") == "prefill":
                    prefill_in_flight += sample.value
                elif family.name == GATEWAY_PREFILL_RATE and sample.value > 0 and "endpoint" in sample.labels:
                    rates[sample.labels["endpoint"]] = sample.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"not Prometheus text: {exc}") from None
    return GatewayReading(
        queued=sums[GATEWAY_QUEUE],
        held=sums[GATEWAY_HELD],
        prefill_held=sums[GATEWAY_PREFILL_HELD],
        prefill_in_flight=prefill_in_flight,
        arrivals=counters.get(GATEWAY_ARRIVALS),
        arrival_tokens=counters.get(GATEWAY_ARRIVAL_TOKENS),
        prefill_rates=rates,
    )


def histogram_delta(new: Histogram, old: Histogram) -> Histogram:
    """Observations between two readings of one engine's histogram. A count that went down means the
    engine restarted (counters start again at 0), so everything in `new` is new, as Prometheus' rate().
    Raises ValueError when the bucket bounds differ."""
    if [b for b, _ in new.buckets] != [b for b, _ in old.buckets]:
        raise ValueError("histogram bucket bounds changed between scrapes")
    if any(n < o for (_, n), (_, o) in zip(new.buckets, old.buckets, strict=True)):
        return new
    return Histogram(tuple((b, n - o) for (b, n), (_, o) in zip(new.buckets, old.buckets, strict=True)))


def histogram_sum(histograms: Iterable[Histogram]) -> Histogram | None:
    """Bucket-wise sum (one pool's engines); None for none. Raises ValueError when bounds differ."""
    items = list(histograms)
    if not items:
        return None
    bounds = [b for b, _ in items[0].buckets]
    if any([b for b, _ in h.buckets] != bounds for h in items):
        raise ValueError("engines report different histogram buckets")
    return Histogram(tuple((b, sum(h.buckets[i][1] for h in items)) for i, b in enumerate(bounds)))


def histogram_quantile(q: float, histogram: Histogram) -> float | None:
    """The q-quantile (0 < q < 1) by linear interpolation (module docstring); None when empty."""
    total = histogram.count
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    finite = [b for b, _ in histogram.buckets if math.isfinite(b)]
    for bound, cumulative in histogram.buckets:
        if cumulative >= rank and cumulative > below:
            if not math.isfinite(bound):
                return finite[-1] if finite else None
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = (bound if math.isfinite(bound) else lower), cumulative
    return finite[-1] if finite else None
