"""A Prometheus scrape configuration for `tandem up`: `<state dir>/prometheus.yml`.

One job per kind of component, every target on 127.0.0.1 with the two labels the chart's dashboards
and alerts select on (`charts/tandem/dashboards`, `charts/tandem/alerts`; a cluster gets the same labels
from the chart's ServiceMonitor): `tandem_service` (the InferenceService's name) and `tandem_role`
(`router`, `prefill`, `decode`, `autoscaler`). The engines listed are the planned ones; engines the
autoscaler starts later are not (the gateway's per-endpoint gauges and the autoscaler's own metrics
still cover them). Redis has no `/metrics`: the header says how to add `tandem kvpool exporter`.

`prometheus_config` is pure (plan in, config out); `write_prometheus_config` writes the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tandem.local.plan import LOOPBACK, LocalPlan

#: Seconds between scrapes: the gateway's and the autoscaler's own loops run every second or so.
SCRAPE_INTERVAL_S = 5
JOBS = {"router": "tandem-router", "prefill": "tandem-engines", "decode": "tandem-engines"}


def prometheus_config(plan: LocalPlan, *, autoscaler_port: int | None) -> dict[str, Any]:
    """Scrape jobs for the plan's gateway and engines, and the autoscaler when `autoscaler_port` is
    given and a pool is autoscaled (the only case in which `tandem up` runs it)."""
    service = plan.router_config.service
    jobs: dict[str, list[dict[str, Any]]] = {}
    for process in plan.processes:
        if process.role in JOBS:
            labels = {"tandem_service": service, "tandem_role": process.role}
            target = {"targets": [f"{LOOPBACK}:{process.port}"], "labels": labels}
            jobs.setdefault(JOBS[process.role], []).append(target)
    if autoscaler_port is not None and plan.endpoint_file is not None:
        labels = {"tandem_service": service, "tandem_role": "autoscaler"}
        jobs["tandem-autoscaler"] = [{"targets": [f"{LOOPBACK}:{autoscaler_port}"], "labels": labels}]
    interval = f"{SCRAPE_INTERVAL_S}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{"job_name": job, "static_configs": targets} for job, targets in jobs.items()],
    }


def _header(plan: LocalPlan) -> str:
    pool = plan.router_config.kv_pool_url or "redis://127.0.0.1:<port>"
    service = plan.router_config.service
    return (
        f"# Prometheus scrape configuration written by `tandem up` for {service!r} (docs/observability.md).\n"
        "# prometheus --config.file=prometheus.yml --web.listen-address=127.0.0.1:9091\n"
        "# The chart's alert and recording rules: add\n"
        "#   rule_files: [<checkout>/charts/tandem/alerts/tandem-alerts.yaml]\n"
        f"# KV pool metrics: run `tandem kvpool exporter --url {pool} --port 9400` and add\n"
        "#   - job_name: tandem-kvpool\n"
        "#     static_configs: [{targets: ['127.0.0.1:9400'],\n"
        f"#       labels: {{tandem_service: {service}, tandem_role: kvpool}}}}]\n"
    )


def write_prometheus_config(path: Path, plan: LocalPlan, *, autoscaler_port: int | None) -> Path:
    """Write `prometheus_config(plan, ...)` to `path`, with a header saying how to use it."""
    text = yaml.safe_dump(prometheus_config(plan, autoscaler_port=autoscaler_port), sort_keys=False)
    path.write_text(_header(plan) + text, encoding="utf-8")
    return path
