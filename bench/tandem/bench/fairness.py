"""Per-tenant service in VTC units and each tenant's share while every tenant was backlogged (pure).

Service (VTC, Sheng et al. OSDI'24 §3.1): a tenant's service is `w_in × prompt tokens + w_out ×
completion tokens` of its requests (defaults w_in = 1, w_out = 2, as the paper and
`spec.router.fairness`). Over a set of times I, a request contributes
- its prompt, `w_in × prompt_tokens`, at the time of its first token (the prompt has been processed);
- its output, `w_out × completion_tokens`, spread evenly over its content chunks (each chunk carries
  completion_tokens / chunks tokens), each counted at the time it arrived.

Backlog (the client-side reading of the paper's Definition 4.1, "has a request in the waiting
queue"): tenant f is **waiting** at time t when one of its requests has arrived (its workload
offset) but not yet produced its first token (or ended, when it never does). Waiting includes time
in the client's per-tenant slot queue, in the gateway's queue and in an engine's waiting queue,
which the client cannot tell apart.

**Both-backlogged interval** B: the times at which every tenant of the run is waiting (the
intersection over tenants of the union of each tenant's waiting intervals); |B| is its total length.
Over B, with n tenants: **share** of f = W_f(B) / Σ_g W_g(B) and the **fair share** is 1/n (equal
weights; VTC's property 1: backlogged tenants get equal service). The **service gap** is
max_f W_f(B) − min_f W_f(B), the paper's "absolute difference in accumulated service" restricted to
B (its Theorem 4.4 bounds it by 2·max(w_in·L_input, w_out·M) under VTC).
Worked example: heavy gets 9,000 units and light 3,000 within B → shares 0.75 and 0.25 against a
fair 0.5 each, gap 6,000.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tandem.bench.stats import Timed, distribution

Interval = tuple[float, float]


@dataclass(frozen=True)
class ServiceWeights:
    """VTC cost per prompt token (`input`) and per generated token (`output`)."""

    input: float = 1.0
    output: float = 2.0


def merge(intervals: Sequence[Interval]) -> list[Interval]:
    """Sorted, disjoint union of half-open intervals [a, b); empty ones dropped.

    Example: [(3, 4), (0, 2), (1, 2.5)] → [(0, 2.5), (3, 4)].
    """
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists.

    Example: [(0, 5)] ∩ [(1, 2), (4, 9)] → [(1, 2), (4, 5)].
    """
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals: Sequence[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def contains(intervals: Sequence[Interval], t: float) -> bool:
    """Whether t lies in one of the sorted disjoint half-open intervals."""
    i = bisect.bisect_right(intervals, (t, float("inf"))) - 1
    return i >= 0 and intervals[i][0] <= t < intervals[i][1]


def waiting_intervals(requests: Sequence[Timed], *, run_end: float) -> dict[str, list[Interval]]:
    """Per tenant, the merged times with a request arrived but without its first token (module doc)."""
    spans: dict[str, list[Interval]] = {}
    for r in requests:
        first = r.token_times[0] if r.token_times else None
        until = first if first is not None else (r.end if r.end is not None else run_end)
        spans.setdefault(r.tenant, []).append((r.arrival, until))
    return {tenant: merge(items) for tenant, items in spans.items()}


def service(r: Timed, weights: ServiceWeights, *, within: Sequence[Interval] | None = None) -> float:
    """VTC units of one request, all of it (`within` None) or the part that fell inside `within`."""
    if not r.token_times:
        return 0.0
    per_chunk = weights.output * r.tokens_out / len(r.token_times)
    if within is None:
        return weights.input * (r.prompt_tokens or 0) + per_chunk * len(r.token_times)
    prompt = weights.input * (r.prompt_tokens or 0) if contains(within, r.token_times[0]) else 0.0
    return prompt + per_chunk * sum(contains(within, t) for t in r.token_times)


def tenant_report(requests: Sequence[Timed], weights: ServiceWeights) -> dict[str, Any]:
    """Per-tenant counts, TTFT, service and (with 2+ tenants) shares over the both-backlogged set."""
    run_end = max((r.end for r in requests if r.end is not None), default=0.0)
    tenants = list(dict.fromkeys(r.tenant for r in requests))
    waiting = waiting_intervals(requests, run_end=run_end)
    both: list[Interval] | None = None
    if len(tenants) >= 2:
        both = waiting[tenants[0]]
        for tenant in tenants[1:]:
            both = intersect(both, waiting[tenant])
    in_both = {t: sum(service(r, weights, within=both) for r in requests if r.tenant == t) for t in tenants}
    total_in_both = sum(in_both.values())
    per_tenant: dict[str, Any] = {}
    for tenant in tenants:
        mine = [r for r in requests if r.tenant == tenant]
        served = sum(service(r, weights) for r in mine)
        per_tenant[tenant] = {
            "requests": len(mine),
            "ok": sum(r.ok for r in mine),
            "service": served,
            "service_per_s": served / run_end if run_end > 0 else None,
            "waiting_s": length(waiting[tenant]),
            "service_backlogged": in_both[tenant] if both is not None else None,
            "share_backlogged": in_both[tenant] / total_in_both if both and total_in_both > 0 else None,
            "ttft_s": distribution(v for r in mine if r.ok and (v := r.ttft) is not None),
        }
    gap = max(in_both.values()) - min(in_both.values()) if both else None
    pair_gap, pair = max_pair_gap(requests, waiting, weights)
    return {
        "weights": {"input": weights.input, "output": weights.output},
        "fair_share": 1 / len(tenants) if tenants else None,
        "backlogged_s": length(both) if both is not None else None,
        "service_gap_backlogged": gap,
        "max_pair_gap": pair_gap,
        "max_pair_gap_tenants": list(pair) if pair else None,
        "tenants": per_tenant,
    }


def max_pair_gap(
    requests: Sequence[Timed], waiting: dict[str, list[Interval]], weights: ServiceWeights
) -> tuple[float | None, tuple[str, str] | None]:
    """VTC's fairness measure over any number of tenants: for every pair (f, g), the service each got
    while both were waiting, |W_f(B_fg) − W_g(B_fg)|; the largest over pairs and the pair.

    With two tenants it equals `service_gap_backlogged`. Example: a and b both wait over [0, 10)
    and get 900 and 300 units there, a and c never wait together → (600, ("a", "b")).
    None when no two tenants were ever waiting at the same time.
    """
    tenants = list(waiting)
    best: tuple[float | None, tuple[str, str] | None] = (None, None)
    for i, f in enumerate(tenants):
        for g in tenants[i + 1 :]:
            both = intersect(waiting[f], waiting[g])
            if not both:
                continue
            served = [
                sum(service(r, weights, within=both) for r in requests if r.tenant == t) for t in (f, g)
            ]
            gap = abs(served[0] - served[1])
            if best[0] is None or gap > best[0]:
                best = (gap, (f, g))
    return best


def service_curves(
    requests: Sequence[Timed], weights: ServiceWeights
) -> dict[str, tuple[list[float], list[float]]]:
    """Per tenant (in order of appearance), its cumulative service over time, as `service` counts it:
    `(times, totals)` with one point per event, in time order: a prompt at its request's first token,
    an output chunk when it arrived. Requests that produced nothing add nothing.

    Example (w_in 1, w_out 2): one request of 10 prompt tokens whose 4 completion tokens came in 2
    chunks at 1.0 s and 1.5 s → `([1.0, 1.0, 1.5], [10.0, 14.0, 18.0])`.
    """
    events: dict[str, list[tuple[float, float]]] = {r.tenant: [] for r in requests}
    for r in requests:
        if not r.token_times:
            continue
        per_chunk = weights.output * r.tokens_out / len(r.token_times)
        mine = events[r.tenant]
        mine.append((r.token_times[0], weights.input * (r.prompt_tokens or 0)))
        mine += [(t, per_chunk) for t in r.token_times]
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for tenant, items in events.items():
        items.sort(key=lambda e: e[0])  # stable: a prompt stays before its first chunk
        total, totals = 0.0, []
        for _, units in items:
            total += units
            totals.append(total)
        curves[tenant] = ([t for t, _ in items], totals)
    return curves
