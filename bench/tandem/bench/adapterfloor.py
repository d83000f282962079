"""The floors of the multi-adapter benchmark (pure): what no placement could beat on a request
sequence, from Belady's clairvoyant eviction over each pool's CPU-tier entries and GPU slots taken
together, and the paragraph the report prints under its verdict (docs/bench.md, "Floors").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tandem.bench.adapterbench import num


def least_disk_loads(sequence: Sequence[str], *, slots: int) -> int:
    """The fewest disk reads that serve `sequence` (adapter names in arrival order) from a CPU tier of
    `slots` adapters in all: Belady's clairvoyant rule (on a miss with the tier full, evict the
    adapter whose next request is farthest away), which no online policy beats. Engines with
    `max_cpu_loras` each, taken together, can hold no more distinct adapters than one tier of their
    sum, so this is a floor for any placement over them (replicating an adapter only takes more room).

    >>> least_disk_loads(["a", "b", "a", "c", "a", "b"], slots=2)
    4
    >>> least_disk_loads(["a", "b", "a", "c", "a", "b"], slots=3)
    3"""
    if slots < 1:
        raise ValueError("slots must be >= 1")
    following: list[int] = [0] * len(sequence)
    seen: dict[str, int] = {}
    for i in range(len(sequence) - 1, -1, -1):
        following[i] = seen.get(sequence[i], len(sequence))
        seen[sequence[i]] = i
    held: dict[str, int] = {}  # adapter → the position of its next request
    misses = 0
    for i, name in enumerate(sequence):
        if name not in held:
            misses += 1
            if len(held) >= slots:
                del held[max(held, key=held.__getitem__)]
        held[name] = following[i]
    return misses


def least_loads(
    sequence: Sequence[str],
    *,
    slots: int | Sequence[int],
    best_peer: float | None,
    gpu_slots: int | Sequence[int] | None = None,
) -> dict[str, Any]:
    """What no placement could beat on this request sequence, per pool that every request passes
    through (with prefill/decode disaggregation a request needs its adapter on a prefill and on a
    decode engine, so each pool loads on its own), from Belady's clairvoyant eviction over a pool's
    entries taken together (engines holding `k` entries each hold no more distinct adapters than one
    cache of their sum; replicating an adapter only takes more room):

    - `least_disk_loads`: reads from disk into `slots` CPU-tier entries in all;
    - `least_gpu_copies`: copies into `gpu_slots` GPU slots in all (`max_loras` per engine), since an
      adapter runs only from a GPU slot; at least the disk reads (fewer slots), each of which is also
      followed by a copy (vLLM's GPU slots hold only adapters its CPU tier holds);
    - `least_loads` = disk reads + GPU copies: the floor from empty CPU tiers. Without `gpu_slots`, a
      copy per disk read (2 × disk reads);
    - `least_warm_loads` = GPU copies: the floor when every CPU tier already holds what it needs (a
      gateway that loads the declared adapters before it reports ready), None without `gpu_slots`.

    All per 1,000 requests, with the share of requests that must wait for a disk read (in the pool
    where most must) and each floor as a ratio of `best_peer`'s loads per 1,000. Example without
    `gpu_slots`: 570 requests, 198 least disk reads → 347 and 695 per 1,000; against 1,174 → 0.59;
    the same with two such pools → 1,389 per 1,000. With 64 CPU-tier entries and 16 GPU slots, 106
    least reads and 142 least copies: 249 per 1,000 warm, 435 from empty."""
    n = len(sequence)
    pools = [slots] if isinstance(slots, int) else list(slots)
    reads = [least_disk_loads(sequence, slots=s) if n else 0 for s in pools]
    disk = sum(reads)
    gpu_pools = None if gpu_slots is None else [gpu_slots] if isinstance(gpu_slots, int) else list(gpu_slots)
    copies = None
    if gpu_pools is not None:
        if len(gpu_pools) != len(pools):
            raise ValueError("gpu_slots must name as many pools as slots")
        copies = sum(least_disk_loads(sequence, slots=g) if n else 0 for g in gpu_pools)
    loads = disk + (disk if copies is None else copies)
    loads_per_1000 = loads * 1000 / n if n else None
    warm_per_1000 = copies * 1000 / n if n and copies is not None else None

    def ratio(per_1000: float | None) -> float | None:
        return per_1000 / best_peer if per_1000 is not None and best_peer else None

    return {
        "slots": sum(pools),
        "pools": pools,
        "gpu_pools": gpu_pools,
        "requests": n,
        "distinct_adapters": len(set(sequence)),
        "least_disk_loads_per_1000": disk * 1000 / n if n else None,
        "least_gpu_copies_per_1000": warm_per_1000,
        "least_loads_per_1000": loads_per_1000,
        "least_warm_loads_per_1000": warm_per_1000,
        "least_share_reading_disk": max(reads) / n if n else None,
        "least_ratio_to_best_peer": ratio(loads_per_1000),
        "least_warm_ratio_to_best_peer": ratio(warm_per_1000),
    }


def least_loads_markdown(bound: Mapping[str, Any]) -> str:
    """The floors' paragraph under the verdict: from empty CPU tiers and, when the GPU slots are
    known, with every CPU tier already holding what it needs (a gateway that loads the declared
    adapters before it reports ready reads less from disk during the run than the first says)."""
    ratio = bound["least_ratio_to_best_peer"]
    share = bound["least_share_reading_disk"]
    text = (
        f"\nLeast any placement could reach on this request sequence from empty CPU tiers "
        f"({bound['requests']} requests, "
        f"{bound['distinct_adapters']} distinct adapters, {_entries(bound)}, Belady's clairvoyant "
        f"eviction): {num(bound['least_loads_per_1000'], '.0f')} adapter "
        f"loads per 1,000 ({num(bound['least_disk_loads_per_1000'], '.0f')} disk reads), "
        f"{num(ratio, '.2f')}× the best peer's loads; at least "
        f"{num(None if share is None else share * 100, '.0f')}% of the requests wait for a disk read.\n"
    )
    warm = bound.get("least_warm_loads_per_1000")
    if warm is not None:
        warm_ratio = bound.get("least_warm_ratio_to_best_peer")
        gpu = " + ".join(map(str, bound["gpu_pools"]))
        text += (
            f"With every CPU tier already holding its adapters, the copies into the {gpu} GPU slots "
            f"alone: {num(warm, '.0f')} loads per 1,000, "
            f"{num(warm_ratio, '.2f')}× the best peer's.\n"
        )
    return text


def _entries(bound: Mapping[str, Any]) -> str:
    """ "16 CPU-tier entries over all engines", or per pool with P/D: "8 + 8 CPU-tier entries (prefill
    and decode pools, each read on its own)"."""
    pools = bound.get("pools") or [bound["slots"]]
    if len(pools) == 1:
        return f"{pools[0]} CPU-tier entries over all engines"
    return f"{' + '.join(map(str, pools))} CPU-tier entries (prefill and decode pools, each read on its own)"
