"""The least TTFT a bench workload's requests could have on the harness's simulated engines, printed
under the results so a ratio between routers can be read against what no router goes below.

The floor is `tandem.sim.engine.floor`'s (`tandem dev ttft-floor`, docs/sim.md): each request's
prompt tokens that no earlier request shared, computed alone on an idle engine of the pool's profile
in steps of at most the engines' `--max-num-batched-tokens`, no sooner than an earlier request could
have computed the tokens it shares. From a cold start nothing is shared before the first request;
after a `restarted` or `warm` start's warm-up the workload's first N requests were computed before.
It lives here because it joins the bench's workload (`tandem.bench`) with the simulator's time model
(`tandem.sim`), which do not import each other.

Times are engine seconds, as the bench's tables: the workload's offsets are engine seconds already.
Closed-loop workloads (a tenant sends when a slot frees) have no fixed arrival times: no floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tandem.bench.harness import PoolSettings
from tandem.bench.stats import percentile
from tandem.bench.workloads import Workload
from tandem.core.engineargs import arg_value
from tandem.core.tokenizer import encode, render_chat
from tandem.sim.engine.floor import least_ttfts
from tandem.sim.engine.profiles import get_profile
from tandem.sim.settings import SimSettings

QUANTILES = (50, 90, 99)


def prompt_ids(workload: Workload) -> list[list[int]]:
    """Each request's prompt as the simulated engines tokenize it (chat messages rendered first)."""
    requests = workload.requests
    return [encode(render_chat(r.messages) if r.messages is not None else (r.prompt or "")) for r in requests]


def engine_int(args: Iterable[str], flag: str, default: int) -> int:
    """An integer flag of the engines' arguments (`--flag N` or `--flag=N`), else `default`."""
    value = arg_value(list(args), flag)
    return default if value is None else int(value)


def bench_floor(workload: Workload, pool: PoolSettings, *, starts: Iterable[str]) -> dict[str, Any] | None:
    """`{"cold": {...}, "warm": {...}, "warmup": N}` with each start's floor percentiles in engine
    ms (`p50`, `p90`, `p99`, `max`; "warm" only when a start has a warm-up), or None for a
    closed-loop workload."""
    if workload.closed_loop or not workload.requests:
        return None
    fields, args = SimSettings.model_fields, pool.engine_args
    block_size = engine_int(args, "--block-size", fields["block_size"].default)
    budget = engine_int(args, "--max-num-batched-tokens", fields["max_num_batched_tokens"].default)
    prompts = prompt_ids(workload)
    arrivals = [r.offset_s for r in workload.requests]
    profile = get_profile(pool.profile)

    def cells(warm: int) -> dict[str, float]:
        floors = least_ttfts(
            prompts, profile, block_size=block_size, max_num_batched_tokens=budget, warm=prompts[:warm],
            arrivals=arrivals,
        )  # fmt: skip
        ms = [f * 1000 for f in floors]
        return {**{f"p{q}": percentile(ms, q) or 0.0 for q in QUANTILES}, "max": max(ms)}

    result: dict[str, Any] = {"cold": cells(0), "warmup": pool.warmup_requests}
    if any(start != "cold" for start in starts):
        result["warm"] = cells(pool.warmup_requests)
    return result


def floor_markdown(floor: Mapping[str, Any] | None) -> str:
    """The floor's lines for bench.md ("" without one)."""
    if not floor:
        return ""

    def row(name: str, cell: Mapping[str, float]) -> str:
        values = [cell[f"p{q}"] for q in QUANTILES] + [cell["max"]]
        return f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |"

    lines = [
        "## The least TTFT any router could give these requests",
        "",
        "Each request's unshared prompt tokens computed alone on an idle engine of this profile, no sooner "
        "than an earlier request could have computed the tokens it shares (`tandem dev ttft-floor`, "
        "docs/sim.md). No target's percentile is below the floor's; the gateway's own time comes on top.",
        "",
        "| start | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
        row("cold", floor["cold"]),
    ]
    if "warm" in floor:
        lines.append(row(f"after the {floor['warmup']} warm-up requests (restarted, warm)", floor["warm"]))
    return "\n".join(lines) + "\n"
