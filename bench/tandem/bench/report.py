"""A benchmark's results: one summary per run (policy, peer or endpoint), a markdown table with one
column per run, and one JSON document with everything (pure: data in, data out).

All times are **engine seconds**: wall seconds × the time scale (1 for real engines), so results
taken at different time scales compare; a router's own overhead is real time and is multiplied too,
which is why the table's heading always states the scale. Metric definitions: `tandem.bench.stats`
(TTFT, TPOT, ITL, E2E, throughput), `tandem.bench.engines` (hit rates), `tandem.bench.fairness`
(service, shares). docs/bench.md explains them with examples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.bench.aggregate import aggregate, spread_table
from tandem.bench.counters import EngineCounters, engine_report
from tandem.bench.fairness import ServiceWeights, tenant_report
from tandem.bench.isolation import isolation_markdown
from tandem.bench.records import DriveResult
from tandem.bench.stats import Slo, latency_summary, slo_report, throughput, timed

SCHEMA = "tandem-bench/1"
_ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class RunData:
    """What one run produced: the driver's records and the engines' counters around it.

    `target` describes what was measured (kind, policy, URL); `notes` are events worth reporting
    (a child that died); `children` the processes the harness started for it, after they stopped;
    `gateway` the gateway's CPU over the run (`tandem.bench.cpu.cpu_per_1000`; None without one);
    `phase` is empty, or with `--isolation` `alone` (the light tenant only) or `flood` (everything);
    `replicas` Tandem's gateway replicas' counters over the run (`tandem.bench.gateways.replica_report`;
    empty for peers, `direct` and endpoint runs).
    """

    label: str
    target: Mapping[str, Any]
    result: DriveResult
    engines_before: Mapping[str, EngineCounters | str]
    engines_after: Mapping[str, EngineCounters | str]
    children: Sequence[Mapping[str, Any]] = ()
    notes: Sequence[str] = field(default_factory=tuple)
    repeat: int = 0
    gateway: Mapping[str, Any] | None = None
    phase: str = ""
    replicas: Sequence[Mapping[str, Any]] = ()

    @property
    def file_label(self) -> str:
        """The label in file names: `vllm-router-cache_aware`; `-r1`, `-r2`... for the later repeats;
        `-alone` for an isolation run of the light tenant alone (`round-robin-alone-r1`)."""
        base = self.label.replace(":", "-") + ("-alone" if self.phase == "alone" else "")
        return base if self.repeat == 0 else f"{base}-r{self.repeat}"


def summarize(
    run: RunData, *, time_scale: float, weights: ServiceWeights, slo: Slo | None = None
) -> dict[str, Any]:
    """Every metric of one run as plain JSON data (engine seconds)."""
    requests = timed(run.result.records, time_scale=time_scale)
    records = run.result.records
    errors = [r.error or f"HTTP {r.status}" for r in records if not r.ok]
    engines = engine_report(run.engines_before, run.engines_after)
    return {
        "label": run.label,
        "repeat": run.repeat,
        "phase": run.phase or None,
        "target": dict(run.target),
        "requests": {
            "total": len(records),
            "sent": sum(r.start_s is not None for r in records),
            "closed_loop_unsent": run.result.unissued,
            "ok": sum(r.ok for r in records),
            "errors": len(errors),
            "error_examples": list(dict.fromkeys(errors))[:_ERROR_EXAMPLES],
        },
        "latency": latency_summary(requests),
        "throughput": throughput(requests),
        "slo": slo_report(requests, slo or Slo()),
        "engines": engines,
        "load": _load(engines),
        "fairness": tenant_report(requests, weights),
        "gateway": None if run.gateway is None else dict(run.gateway),
        "gateway_replicas": [dict(r) for r in run.replicas],
        "wall_s": run.result.wall_s,
        "children": [dict(c) for c in run.children],
        "notes": list(run.notes),
    }


def _load(engines: Mapping[str, Any]) -> dict[str, Any]:
    """Requests finished per engine (from the engines' counters) and max/mean as the imbalance."""
    counts = {url: e["delta"]["requests"] for url, e in engines["engines"].items() if "delta" in e}
    mean = sum(counts.values()) / len(counts) if counts else 0.0
    return {"requests_per_engine": counts, "imbalance": max(counts.values()) / mean if mean > 0 else None}


def document(
    *,
    runs: Sequence[Mapping[str, Any]],
    workload: Mapping[str, Any],
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    created: str,
    command: Sequence[str],
) -> dict[str, Any]:
    """The JSON document of a whole `tandem bench` invocation."""
    return {
        "schema": SCHEMA,
        "created": created,
        "command": list(command),
        "settings": dict(settings),
        "machine": dict(machine),
        "workload": dict(workload),
        "runs": list(runs),
        "aggregate": aggregate(runs),
    }


Row = tuple[str, Callable[[Mapping[str, Any]], str]]


def _ms(dist: Mapping[str, Any], *qs: str) -> str:
    return " / ".join("–" if dist.get(q) is None else f"{dist[q] * 1000:.0f}" for q in qs)


def _s(dist: Mapping[str, Any], *qs: str) -> str:
    return " / ".join("–" if dist.get(q) is None else f"{dist[q]:.2f}" for q in qs)


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "–" if value is None else format(value, fmt)


def _ms_value(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _overall(run: Mapping[str, Any], key: str) -> float | None:
    overall = run["engines"]["overall"]
    return None if overall is None else overall.get(key)


def _per_engine(run: Mapping[str, Any]) -> str:
    counts = run["load"]["requests_per_engine"].values()
    return " / ".join(f"{c:.0f}" for c in counts) if counts else "–"


_COMMON_ROWS: tuple[Row, ...] = (
    ("requests ok / total", lambda r: f"{r['requests']['ok']} / {r['requests']['total']}"),
    ("TTFT p50 / p90 / p99 (ms)", lambda r: _ms(r["latency"]["ttft_s"], "p50", "p90", "p99")),
    ("engine TTFT mean (ms)", lambda r: _num(_ms_value(_overall(r, "engine_ttft_mean_s")), ".0f")),
    ("TPOT p50 / p90 / p99 (ms)", lambda r: _ms(r["latency"]["tpot_s"], "p50", "p90", "p99")),
    ("E2E p50 / p90 / p99 (s)", lambda r: _s(r["latency"]["e2e_s"], "p50", "p90", "p99")),
    ("throughput (req/s)", lambda r: _num(r["throughput"]["requests_per_s"], ".2f")),
    ("output tokens/s", lambda r: _num(r["throughput"]["output_tokens_per_s"], ".0f")),
    ("SLO attainment", lambda r: _pct(r.get("slo", {}).get("attainment"))),
    ("goodput (req/s)", lambda r: _num(r.get("slo", {}).get("goodput_rps"), ".2f")),
    ("prefix cache hit rate", lambda r: _pct(_overall(r, "prefix_hit_rate"))),
    ("KV pool hit rate", lambda r: _pct(_overall(r, "external_hit_rate"))),
    ("requests per engine", _per_engine),
    ("preemptions", lambda r: _num(_overall_delta(r, "preemptions"), ".0f")),
)


def _gateway_cpu(run: Mapping[str, Any]) -> float | None:
    gateway = run.get("gateway")
    return None if gateway is None else gateway.get("cpu_s_per_1000")


#: Shown when a run had a gateway whose CPU was read (harness mode), not for endpoint runs.
GATEWAY_CPU_ROW: Row = ("gateway CPU s per 1,000 requests", lambda r: _num(_gateway_cpu(r), ".2f"))


def replica_count(run: Mapping[str, Any]) -> int | None:
    """The gateway processes of a run's target (`target.replicas`); None for `direct` and endpoints."""
    count = run.get("target", {}).get("replicas")
    return None if count is None else int(count)


def _per_replica(run: Mapping[str, Any], key: str) -> str:
    """`30 / 30`: a `gateway_replicas` counter per replica (`?` for a failed scrape); `–` for none."""
    replicas = run.get("gateway_replicas") or []
    return " / ".join("?" if r.get(key) is None else f"{r[key]:.0f}" for r in replicas) or "–"


def _syncs(run: Mapping[str, Any]) -> str:
    failed = sum(r.get("counter_syncs_error") or 0 for r in run.get("gateway_replicas") or [])
    ok = _per_replica(run, "counter_syncs_ok")
    return ok if not failed else f"{ok} ({failed:.0f} failed)"


#: Shown when a target ran more than one gateway replica (`--gateway-replicas`).
REPLICA_ROWS: tuple[Row, ...] = (
    ("gateway replicas", lambda r: _num(replica_count(r), "d")),
    ("requests per gateway replica", lambda r: _per_replica(r, "requests")),
    ("shared counter syncs per replica", _syncs),
)


def _overall_delta(run: Mapping[str, Any], key: str) -> float | None:
    overall = run["engines"]["overall"]
    return None if overall is None else overall["delta"][key]


def _tenant(run: Mapping[str, Any], tenant: str) -> Mapping[str, Any]:
    tenants: Mapping[str, Any] = run["fairness"]["tenants"]
    return tenants.get(tenant) or {}


def _rows_of(tenant: str) -> list[Row]:
    def ok(r: Mapping[str, Any]) -> str:
        return f"{_tenant(r, tenant).get('ok', 0)} / {_tenant(r, tenant).get('requests', 0)}"

    def ttft(r: Mapping[str, Any]) -> str:
        return _ms(_tenant(r, tenant).get("ttft_s", {}), "p50", "p90")

    def served(r: Mapping[str, Any]) -> str:
        return _num(_tenant(r, tenant).get("service"), ".0f")

    def share(r: Mapping[str, Any]) -> str:
        return _num(_tenant(r, tenant).get("share_backlogged"), ".2f")

    return [
        (f"{tenant}: ok / total", ok),
        (f"{tenant}: TTFT p50 / p90 (ms)", ttft),
        (f"{tenant}: service (VTC units)", served),
        (f"{tenant}: share while backlogged", share),
    ]


#: Per-tenant rows are listed for at most this many tenants (the JSON has them all).
TENANT_ROWS = 4


def _pair_gap(run: Mapping[str, Any]) -> str:
    fair = run["fairness"]
    gap, pair = fair.get("max_pair_gap"), fair.get("max_pair_gap_tenants")
    return "–" if gap is None else f"{gap:.0f} ({' / '.join(pair or ())})"


def _tenant_rows(tenants: Sequence[str]) -> list[Row]:
    rows: list[Row] = [("all backlogged (s)", lambda r: _num(r["fairness"]["backlogged_s"], ".1f"))]
    for tenant in tenants[:TENANT_ROWS]:
        rows += _rows_of(tenant)
    rows.append(
        ("service gap while all backlogged", lambda r: _num(r["fairness"]["service_gap_backlogged"], ".0f"))
    )
    rows.append(("max service gap, any two backlogged", _pair_gap))
    return rows


def markdown_table(runs: Sequence[Mapping[str, Any]]) -> str:
    """One row per metric, one column per run (label), in GitHub markdown."""
    tenants = list(dict.fromkeys(t for r in runs for t in r["fairness"]["tenants"]))
    rows = list(_COMMON_ROWS) + (_tenant_rows(tenants) if len(tenants) > 1 else [])
    if any(_gateway_cpu(r) is not None for r in runs):
        rows.insert(len(_COMMON_ROWS), GATEWAY_CPU_ROW)
    if any((replica_count(r) or 0) > 1 for r in runs):
        rows[len(_COMMON_ROWS) : len(_COMMON_ROWS)] = REPLICA_ROWS
    lines = [
        "| metric | " + " | ".join(r["label"] for r in runs) + " |",
        "| --- | " + " | ".join("---:" for _ in runs) + " |",
    ]
    lines += [f"| {name} | " + " | ".join(cell(r) for r in runs) + " |" for name, cell in rows]
    return "\n".join(lines)


def _source(source: Mapping[str, Any] | None) -> str:
    if not source or not source.get("commit"):
        return ""
    return f"; code {source['commit'][:10]}{' with local changes' if source.get('dirty') else ''}"


def _replica_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The heading's line on gateway replicas, when a target ran more than one."""
    counts = {str(r["label"]): n for r in runs if (n := replica_count(r) or 0) > 1}
    if not counts:
        return []
    which = ", ".join(f"{label}: {n} replicas" for label, n in counts.items())
    return [
        f"- gateway replicas: {which} (each `tandem router --replicas N`, sharing its fair-queue counters "
        "through the KV pool's Redis); request i of the workload goes to replica i mod N, so every tenant "
        "reaches every replica; the other targets run one gateway process"
    ]


def markdown(doc: Mapping[str, Any]) -> str:
    """The table with a heading that says what was run, where, and in which units."""
    settings, machine, workload = doc["settings"], doc["machine"], doc["workload"]
    params = ", ".join(f"{k}={v}" for k, v in workload.get("params", {}).items() if k not in ("sha256",))
    fair = doc["runs"][0]["fairness"] if doc["runs"] else {}
    lines = [
        f"# tandem bench: {workload['name']}",
        "",
        f"- command: `{' '.join(doc['command'])}`",
        f"- date: {doc['created']}; machine: {machine.get('nproc')} cores, {machine.get('cpu', '?')}"
        f"{_source(machine.get('source'))}",
        f"- workload: {workload['name']} ({params}); {workload['requests']} requests, "
        f"seed {workload['seed']}",
        f"- engines: {settings.get('engines_desc', 'external')}; time scale {settings['time_scale']:g} "
        "(times are engine seconds = wall seconds × time scale)",
    ]
    slo = doc["runs"][0].get("slo") if doc["runs"] else None
    if slo:
        lines.append(
            f"- SLO: TTFT ≤ {slo['ttft_slo_s'] * 1000:g} ms and TPOT ≤ {slo['tpot_slo_s'] * 1000:g} ms "
            "(attainment: share of all requests meeting both; goodput: those per second)"
        )
    if fair.get("weights") and len(fair.get("tenants", {})) > 1:
        lines.append(
            f"- service in VTC units: {fair['weights']['input']:g} × prompt + {fair['weights']['output']:g}"
            f" × completion tokens; fair share {_num(fair.get('fair_share'), '.2f')}"
        )
    lines += _replica_lines(doc["runs"])
    if doc.get("isolation"):
        lines += ["", *isolation_markdown(doc["isolation"]), "", "## The flood runs"]
    first = [r for r in doc["runs"] if r.get("repeat", 0) == 0]
    if len(first) < len(doc["runs"]):
        repeats = len(doc["runs"]) // max(1, len(first))
        lines += [
            "", f"{repeats} runs per target, each on freshly started engines; ± is the sample standard "
            "deviation over the runs (min and max in bench.json's `aggregate`).", "",
            spread_table(doc["aggregate"]), "", "The first run of each target in full:",
        ]  # fmt: skip
    lines += ["", markdown_table(first)]
    notes = [f"- {r['label']}: {note.splitlines()[0]}" for r in doc["runs"] for note in r["notes"] if note]
    errors = [f"- {r['label']}: {e}" for r in doc["runs"] for e in r["requests"]["error_examples"]]
    if notes or errors:
        lines += ["", "Notes:", *notes, *errors]
    return "\n".join(lines) + "\n"
