"""Router overhead: the latency a gateway adds over sending straight to the engine, at concurrency 1 to
256, and the highest request rate one gateway process sustains with streaming.

Method (`tandem bench --overhead-sweep 1,4,16,64,256 --policy round-robin --peer vllm-router:round_robin`):
- every target, `direct` first, runs in front of **one** simulated engine at a high time scale
  (`engine_time_scale`, default 1000: a 7 ms decode step takes 7 µs of wall time), so the engine's
  model time is near zero and what remains is HTTP, streaming and the gateway's own work;
- at each concurrency C, `max(requests_per_level, 2 × C)` identical-shape streamed completions
  (`prompt_tokens` in, `output_tokens` out, distinct prompts) are sent closed loop: all released at
  once and at most C in flight, so a new one is sent when one ends; a few warm-up requests go first;
- TTFT and E2E are **wall** milliseconds (no time scaling); throughput is successful requests per
  wall second from the first send to the last end;
- **added latency** at C = the target's p50 (p99) − direct's p50 (p99) at the same C and repeat;
- **sustained rate** = the highest throughput over the levels at which every request succeeded;
- **gateway CPU per 1,000 requests** at C = the CPU seconds of the gateway's process tree
  (`tandem.bench.cpu`: user + system, workers included) read just before and just after the level,
  ÷ the level's requests sent × 1000; None for `direct`, which has no gateway;
- **the C = 1 probe** (`probe_pairs`, default 300; `tandem.bench.wireprobe`): after its levels, each
  gateway is measured once more at concurrency 1 with a raw-socket client that alternates requests
  between the engine and the gateway, pair by pair; its added TTFT p50 is the bench client's own
  work taken out of the figure (the levels' client is Python and shares the cores).

The client, the gateway and the engine share the host's cores, so on a small machine the numbers
are an upper bound on overhead and a lower bound on the gateway's capacity; the comparison between
gateways is what holds, since they run under the same conditions. `--repeat N` repeats the whole
sweep N times; the table shows mean ± sample standard deviation over the repeats.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tandem.bench.aggregate import spread
from tandem.bench.cpu import cpu_per_1000
from tandem.bench.driver import DriverSettings, drive
from tandem.bench.harness import PoolSettings, Progress, Tools, started
from tandem.bench.records import DriveResult
from tandem.bench.stats import percentile
from tandem.bench.targets import Target
from tandem.bench.text import words
from tandem.bench.wireprobe import probe
from tandem.bench.workloads import BenchRequest, Workload

DEFAULT_LEVELS = (1, 4, 16, 64, 256)


@dataclass(frozen=True)
class SweepSettings:
    levels: tuple[int, ...] = DEFAULT_LEVELS
    requests_per_level: int = 200
    prompt_tokens: int = 64
    output_tokens: int = 16
    engine_time_scale: float = 1000.0
    warmup_requests: int = 8
    request_timeout_s: float = 60.0
    #: Request pairs of the C = 1 probe (`tandem.bench.wireprobe`); 0: none.
    probe_pairs: int = 300


def parse_levels(text: str) -> tuple[int, ...]:
    """`"1,4,16"` → (1, 4, 16); raises ValueError naming a bad entry."""
    levels = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--overhead-sweep: {part!r} is not a positive integer")
        levels.append(int(part))
    if not levels:
        raise ValueError("--overhead-sweep: give concurrency levels, e.g. 1,4,16,64,256")
    return tuple(sorted(set(levels)))


def level_workload(level: int, sweep: SweepSettings, *, seed: int, count: int | None = None) -> Workload:
    """The requests of one level: all at t=0, distinct prompts of the same length, completions API."""
    rng = random.Random(f"tandem-bench:{seed}:overhead:{level}")
    n = count if count is not None else max(sweep.requests_per_level, 2 * level)
    requests = tuple(
        BenchRequest(
            0.0, "default", sweep.output_tokens, prompt=words(rng, sweep.prompt_tokens), group=f"c{level}"
        )
        for _ in range(n)
    )
    return Workload(f"overhead-c{level}", requests, {"level": level}, level)


def level_row(
    label: str,
    level: int,
    repeat: int,
    result: DriveResult,
    *,
    gateway_cpu_s: tuple[float | None, float | None] | None = None,
) -> dict[str, Any]:
    """One target at one concurrency: wall-clock latency percentiles (ms), throughput, and the gateway's
    CPU from its readings (seconds) before and after the level (pure; `gateway_cpu_s` None: no gateway).
    """
    records = result.records
    sent = sum(r.start_s is not None for r in records)
    before, after = gateway_cpu_s if gateway_cpu_s is not None else (None, None)
    cpu = cpu_per_1000(before, after, requests=sent)
    ok = [r for r in records if r.ok]
    ttft = [(r.token_times_s[0] - r.start_s) * 1000 for r in ok if r.token_times_s and r.start_s is not None]
    e2e = [(r.end_s - r.start_s) * 1000 for r in ok if r.end_s is not None and r.start_s is not None]
    starts = [r.start_s for r in records if r.start_s is not None]
    ends = [r.end_s for r in ok if r.end_s is not None]
    span = max(ends) - min(starts) if ends and starts else 0.0
    return {
        "label": label, "concurrency": level, "repeat": repeat, "requests": len(records), "ok": len(ok),
        "errors": len(records) - len(ok),
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
        "e2e_p50_ms": percentile(e2e, 50), "e2e_p99_ms": percentile(e2e, 99),
        "requests_per_s": len(ok) / span if span > 0 else None,
        "gateway_cpu_s": cpu["cpu_s"], "gateway_cpu_s_per_1000": cpu["cpu_s_per_1000"],
    }  # fmt: skip


_ADDED = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def added_over_direct(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every non-direct row with `added_*` fields: its percentile − direct's, same level and repeat.

    Example: direct TTFT p50 2.0 ms, a router 3.5 ms at C = 4 → added_ttft_p50_ms = 1.5.
    """
    direct = {(r["concurrency"], r["repeat"]): r for r in rows if r["label"] == "direct"}
    out = []
    for r in rows:
        base = direct.get((r["concurrency"], r["repeat"]))
        if r["label"] == "direct" or base is None:
            continue
        added = {f"added_{k}": _minus(r[k], base[k]) for k in _ADDED}
        out.append({**r, **added})
    return out


def summarize_probe(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per gateway, mean ± sd over repeats of the C = 1 probe's p50s (rows with `probe`), and its
    failed pairs. Example: added 0.5 and 0.7 ms → {"added_ttft_p50_ms": {"mean": 0.6, "sd": 0.14, ...}}."""
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("probe"):
            by_label.setdefault(r["label"], []).append(r)
    keys = ("direct_ttft_p50_ms", "gateway_ttft_p50_ms", "added_ttft_p50_ms")
    return {
        label: {k: spread([v for row in found if (v := row.get(k)) is not None]) for k in keys}
        | {"errors": sum(row["errors"] for row in found), "pairs": sum(row["pairs"] for row in found)}
        for label, found in by_label.items()
    }


def summarize_sweep(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean ± sd over repeats per (target, level), added latency, each target's sustained rate, and
    the C = 1 probe (`summarize_probe`)."""
    probed = summarize_probe(rows)
    rows = [r for r in rows if not r.get("probe")]
    added = added_over_direct(rows)
    keys = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "requests_per_s", "added_ttft_p50_ms",
            "added_ttft_p99_ms", "added_e2e_p50_ms", "gateway_cpu_s_per_1000")  # fmt: skip
    table: dict[str, dict[int, dict[str, Any]]] = {}
    source = added + [r for r in rows if r["label"] == "direct"]
    for r in source:
        cell = table.setdefault(r["label"], {}).setdefault(r["concurrency"], {"rows": []})
        cell["rows"].append(r)
    levels: dict[str, dict[int, dict[str, Any]]] = {}
    sustained: dict[str, Any] = {}
    for label, by_level in table.items():
        levels[label] = {
            c: {k: spread([v for row in cell["rows"] if (v := row.get(k)) is not None]) for k in keys}
            | {"errors": sum(row["errors"] for row in cell["rows"])}
            for c, cell in sorted(by_level.items())
        }
        clean = [(c, v) for c, v in levels[label].items() if v["errors"] == 0 and v["requests_per_s"]["mean"]]
        best = max(clean, key=lambda cv: cv[1]["requests_per_s"]["mean"], default=None)
        sustained[label] = None if best is None else {"concurrency": best[0], **best[1]["requests_per_s"]}
    return {"levels": levels, "sustained": sustained, "added_rows": added, "probe": probed}


def _pm(item: Mapping[str, Any], fmt: str = ".1f") -> str:
    if item["mean"] is None:
        return "–"
    mean = format(item["mean"], fmt)
    return mean if item["n"] < 2 else f"{mean} ± {format(item['sd'], fmt)}"


def sweep_markdown(summary: Mapping[str, Any]) -> str:
    """Two tables: added TTFT p50 / p99 over direct per level, and throughput (with each router's gateway
    CPU s per 1,000 requests) and the sustained rate."""
    levels: Mapping[str, Mapping[int, Mapping[str, Any]]] = summary["levels"]
    routers = [label for label in levels if label != "direct"]
    concurrencies = sorted({c for by in levels.values() for c in by})
    lines = ["| concurrency | direct TTFT p50 / p99 (ms) | "
             + " | ".join(f"{r}: added TTFT p50 / p99 (ms)" for r in routers) + " |",
             "| ---: | ---: | " + " | ".join("---:" for _ in routers) + " |"]  # fmt: skip
    for c in concurrencies:
        d = levels.get("direct", {}).get(c)
        cells = [f"{_pm(d['ttft_p50_ms'])} / {_pm(d['ttft_p99_ms'])}" if d else "–"]
        for r in routers:
            x = levels[r].get(c)
            cells.append(f"{_pm(x['added_ttft_p50_ms'])} / {_pm(x['added_ttft_p99_ms'])}" if x else "–")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    tables = [*lines, "", *_throughput_table(levels, concurrencies, summary["sustained"])]
    return "\n".join([*tables, *_probe_table(summary.get("probe") or {})])


def _probe_table(probed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The C = 1 probe per gateway (none: no lines)."""
    if not probed:
        return []
    lines = [
        "",
        "C = 1 with a raw-socket client, requests alternating between the engine and the gateway:",
        "",
        "| gateway | added TTFT p50 (ms) | engine TTFT p50 (ms) | through it TTFT p50 (ms) | pairs |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for label, x in probed.items():
        errors = f" ({x['errors']} failed)" if x["errors"] else ""
        lines.append(
            f"| {label} | {_pm(x['added_ttft_p50_ms'], '.2f')} | {_pm(x['direct_ttft_p50_ms'], '.2f')} | "
            f"{_pm(x['gateway_ttft_p50_ms'], '.2f')} | {x['pairs']}{errors} |"
        )
    return lines


_CPU = "gateway_cpu_s_per_1000"


def _throughput_table(
    levels: Mapping[str, Mapping[int, Mapping[str, Any]]],
    concurrencies: Sequence[int],
    sustained: Mapping[str, Any],
) -> list[str]:
    """Requests per second per target and level, each router's gateway CPU s per 1,000 requests beside
    it, and a last row with the sustained rate (and the CPU at that level)."""
    columns = [(label, key) for label in levels for key in ("requests_per_s", _CPU)
               if key != _CPU or label != "direct"]  # fmt: skip
    names = {"requests_per_s": "{} (req/s)", _CPU: "{}: gateway CPU s per 1,000 req"}
    lines = ["| concurrency | " + " | ".join(names[key].format(label) for label, key in columns) + " |",
             "| ---: | " + " | ".join("---:" for _ in columns) + " |"]  # fmt: skip
    for c in concurrencies:
        cells = []
        for label, key in columns:
            x = levels[label].get(c)
            errors = f" ({x['errors']} errors)" if x and x["errors"] and key != _CPU else ""
            cells.append(_pm(x[key], ".2f" if key == _CPU else ".1f") + errors if x else "–")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    best = []
    for label, key in columns:
        top = sustained[label]
        if top is None:
            best.append("–")
        elif key == _CPU:
            best.append(_pm(levels[label][top["concurrency"]][_CPU], ".2f"))
        else:
            best.append(f"**{_pm(top)}** (C = {top['concurrency']})")
    lines.append("| sustained | " + " | ".join(best) + " |")
    return lines


def run_sweep(
    targets: Sequence[Target],
    *,
    pool: PoolSettings,
    tools: Tools,
    sweep: SweepSettings,
    repeat: int,
    state_dir: Path,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Direct, then every target, `repeat` times: start one engine (and the gateway), warm up, and run
    every level; returns one `level_row` per (repeat, target, level)."""
    # Objectives loose enough (600 s and 50 s of wall time) that Tandem's gateway never sheds here:
    # the sweep measures forwarding, not admission.
    scale = sweep.engine_time_scale
    engine_pool = replace(
        pool, engines=1, pd=False, time_scale=scale, slo_ttft_s=600 * scale, slo_tpot_s=50 * scale
    )
    order = [Target("direct"), *[t for t in targets if t.kind != "direct"]]
    rows: list[dict[str, Any]] = []
    for r in range(repeat):
        for target in order:
            where = state_dir / f"r{r}"
            with started(target, pool=engine_pool, tools=tools, state_dir=where, progress=progress) as run:
                base = DriverSettings(
                    base_url=run.base_url, model=run.model, label=f"{target.label}-warmup", time_scale=1.0,
                    request_timeout_s=sweep.request_timeout_s, progress_every_s=30.0,
                )  # fmt: skip
                asyncio.run(drive(level_workload(4, sweep, seed=r, count=sweep.warmup_requests), base))
                for level in sweep.levels:
                    settings = replace(base, label=f"{target.label}-c{level}", max_concurrency=level)
                    before = run.gateway_cpu_s()
                    result = asyncio.run(drive(level_workload(level, sweep, seed=r), settings))
                    cpu = (before, run.gateway_cpu_s()) if run.gateway_pids else None
                    row = level_row(target.label, level, r, result, gateway_cpu_s=cpu)
                    rows.append(row)
                    progress(_level_line(row))
                if target.kind != "direct" and sweep.probe_pairs > 0 and run.engines:
                    found = probe(
                        f"{run.engines[0]}/v1", run.base_url, model=run.model, pairs=sweep.probe_pairs,
                        prompt_tokens=sweep.prompt_tokens, output_tokens=sweep.output_tokens, seed=r,
                    )  # fmt: skip
                    probed = found.row(target.label, r) | {"probe": True}
                    rows.append(probed)
                    progress(_probe_line(probed))
    return rows


def _probe_line(row: Mapping[str, Any]) -> str:
    """`[round-robin] C=1 probe: 300 pairs, added TTFT p50 0.58 ms (engine 0.55, through it 1.13)`."""

    def ms(key: str) -> str:
        value = row[key]
        return "–" if value is None else f"{value:.2f}"

    failed = f", {row['errors']} failed" if row["errors"] else ""
    return (
        f"[{row['label']}] C=1 probe: {row['pairs']} pairs{failed}, "
        f"added TTFT p50 {ms('added_ttft_p50_ms')} ms "
        f"(engine {ms('direct_ttft_p50_ms')}, through it {ms('gateway_ttft_p50_ms')})"
    )


def _level_line(row: Mapping[str, Any]) -> str:
    """The progress line of one level: `[round-robin] C=4: 200/200 ok, TTFT p50 1.9 ms, 850 req/s, gateway
    1.52 CPU s per 1,000 requests`."""
    line = (
        f"[{row['label']}] C={row['concurrency']}: {row['ok']}/{row['requests']} ok, TTFT p50 "
        f"{row['ttft_p50_ms'] or 0:.1f} ms, {row['requests_per_s'] or 0:.0f} req/s"
    )
    cpu = row.get("gateway_cpu_s_per_1000")
    return line if cpu is None else f"{line}, gateway {cpu:.2f} CPU s per 1,000 requests"
