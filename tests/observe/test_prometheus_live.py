"""Every dashboard query and every rule of the chart, run by a real Prometheus against a live stack.

Real: `tandem up` on a spec that exercises what the dashboards show (autoscaled pools, so the autoscaler
runs and scales decode 2 → 1; precise prefix state; conditional P/D with a Redis KV pool; a rate-limited
tenant), `tandem kvpool exporter` on the stack's Redis, and Debian's `prometheus` scraping the targets of
the `prometheus.yml` that `tandem up` wrote (every second, with the chart's rule file loaded, evaluated
every second). Every query goes through Prometheus' HTTP API (`/api/v1/query`). Faked: nothing; the
traffic is a handful of requests, so what only an incident produces is listed in `INCIDENT_ONLY`.

How each kind of expression is checked:
- a dashboard target: Grafana's variables replaced (`$__rate_interval` → 1m, a query variable → its
  values from Prometheus as `(a|b)`, a custom one → its default), then it must return series, unless
  every metric it names that Prometheus has not seen is in `INCIDENT_ONLY`;
- a recording rule: its expression must return series;
- an alert: its expression with `bool` after every comparison (`tests.observe.promql.probe`), which
  returns a 0/1 sample per series the alert watches instead of none on a healthy stack;
- and Prometheus' own evaluation of every rule must be healthy (`/api/v1/rules`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.observe.promql import (
    RULES,
    Query,
    custom_value,
    dashboard_queries,
    label_values_query,
    load_dashboards,
    load_rules,
    metric_names,
    probe,
    variables,
)
from tests.servers import free_port, stop_process

from tandem.local.binaries import find_redis_server
from tandem.local.scrape import JOBS

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "obs"
READY_TIMEOUT_S = 180.0
SETTLE_TIMEOUT_S = 90.0
SPEC: dict[str, Any] = {
    "apiVersion": "tandem.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": SERVICE},
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen"},
        "engine": {"kind": "sim", "sim": {"profile": "qwen2.5-7b-h100"}},
        "prefill": {"replicas": 1, "autoscaling": {"enabled": True, "min": 1, "max": 2}},
        # Two decode engines that the autoscaler at once finds one too many: a scale event.
        "decode": {
            "replicas": 2,
            "autoscaling": {
                "enabled": True,
                "min": 1,
                "max": 2,
                "scaleDownDelaySeconds": 0,
                "stableWindowSeconds": 4,
                "panicWindowSeconds": 2,
            },
        },
        "disaggregation": {"mode": "auto", "minUncachedTokens": 64},
        "kvPool": {"redis": {"memory": "256Mi"}, "chunkSize": 64},
        "router": {
            "replicas": 1,
            "prefixSource": "precise",
            "tenants": [{"name": "limited", "rateLimits": {"requestsPerMinute": 1}}],
        },
    },
}
#: Metrics a healthy stack under light load never exports, and why; a query that finds nothing must
#: name at least one of these, and nothing else Prometheus has not seen.
INCIDENT_ONLY = {
    "tandem_router_admission_rejections_total": "only once the queue refuses a request (no load here queues)",
    "tandem_router_pd_fallbacks_total": "only when a prefill or the KV handover fails",
    "tandem_router_upstream_errors_total": "only after a failed upstream request",
    "tandem_router_retries_total": "only after a failed upstream request",
    "tandem_router_kv_event_gaps_total": "only when a KV-event batch is missed",
    "tandem_router_shared_counter_age_seconds": "only with several gateway replicas (tandem up runs one)",
    "tandem_router_shared_counter_syncs_total": "only with several gateway replicas (tandem up runs one)",
    "tandem_autoscaler_holds_total": "only when an observation is invalid or stale",
    **{
        f"tandem_kvpool_connector_{name}_total": "only real vLLM with Tandem's connector (the simulator "
        "exports tandem_sim_kv_pool_* instead)"
        for name in (
            "chunks_saved",
            "chunks_already_stored",
            "chunks_loaded",
            "bytes_saved",
            "bytes_loaded",
            "lookup_failures",
            "load_failures",
            "save_failures",
        )
    },
}


@dataclass
class Live:
    """The running stack and the Prometheus scraping it."""

    prometheus: httpx.Client
    scrape_config: dict[str, Any]
    output: list[str]
    seen: set[str] = field(default_factory=set)

    def query(self, expr: str) -> tuple[str | None, list[Any]]:
        """(error, result) of an instant query now."""
        response = self.prometheus.get("/api/v1/query", params={"query": expr})
        body = response.json()
        if body.get("status") != "success":
            return f"{body.get('errorType')}: {body.get('error')}", []
        return None, list(body["data"]["result"])

    def label_values(self, selector: str, label: str) -> list[str]:
        response = self.prometheus.get(f"/api/v1/label/{label}/values", params={"match[]": selector})
        response.raise_for_status()
        return list(response.json()["data"])


class Processes:
    """Child processes of the fixture, stopped in reverse order by their own pid."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], *, log: Path, **kwargs: Any) -> subprocess.Popen[str]:
        with log.open("w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, **kwargs)
        self.children.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.children):
            stop_process(process, timeout_s=60)


def _start_stack(tmp: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """`tandem up` on SPEC; returns the process and its output lines once it printed `ready:`."""
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC), encoding="utf-8")
    argv = [
        sys.executable, "-m", "tandem.cli", "up", "-f", str(spec), "--port", str(free_port()),
        "--state-dir", str(tmp / "state"), "--autoscaler-port", str(free_port()),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env
    )
    output: list[str] = []
    ready = threading.Event()
    stdout = process.stdout
    assert stdout is not None

    def read() -> None:
        for line in stdout:
            output.append(line)
            if line.startswith("ready: "):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(READY_TIMEOUT_S):
        process.kill()
        raise AssertionError("tandem up did not become ready:\n" + "".join(output))
    return process, output


def _wait_http(url: str, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not answer {url} within {timeout_s:.0f}s")
        time.sleep(0.2)


def _prometheus_config(written: dict[str, Any], *, exporter_port: int) -> dict[str, Any]:
    """`tandem up`'s config, scraped and evaluated every second, with the chart's rules and the
    KV pool exporter's job (what the file's header says to add)."""
    config = dict(written)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    config["rule_files"] = [str(RULES)]
    labels = {"tandem_service": SERVICE, "tandem_role": "kvpool"}
    exporter = {"targets": [f"127.0.0.1:{exporter_port}"], "labels": labels}
    config["scrape_configs"] = [
        *written["scrape_configs"],
        {"job_name": "tandem-kvpool", "static_configs": [exporter]},
    ]
    return config


def _send_traffic(endpoint: str, *, wave: int) -> None:
    """Streams and plain answers for two tenants, a new and a repeated long prompt (disaggregated,
    then decode-only from the pool); a rate-limited tenant's refused requests (429)."""
    long_prompt = " ".join(f"word{i}" for i in range(300))
    with httpx.Client(base_url=endpoint, timeout=60, trust_env=False) as client:
        for tenant in ("team-a", "team-b"):
            headers = {"x-tenant-id": tenant}
            new = f"{tenant} wave {wave} {long_prompt}"
            for prompt in (new, new, f"hello from {tenant}"):
                body = {"model": "qwen", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
                with client.stream(
                    "POST", "/chat/completions", json={**body, "stream": True}, headers=headers
                ) as r:
                    assert r.status_code == 200, r.read()
                    r.read()
            answer = client.post(
                "/completions",
                json={"model": "qwen", "prompt": long_prompt, "max_tokens": 4},
                headers=headers,
            )
            assert answer.status_code == 200, answer.text
        # The rate-limited tenant (1 request a minute): 200 then 429 in the first wave, 429 in the
        # second, so its refusals' counter has samples before and after it moves.
        limited = {"x-tenant-id": "limited"}
        body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        statuses = [
            client.post("/chat/completions", json=body, headers=limited).status_code
            for _ in range(2 if wave == 1 else 1)
        ]
        assert statuses == ([200, 429] if wave == 1 else [429])


#: Every component scraped once (before the traffic, so that rates see the counters move).
SCRAPED = ['up{tandem_role="router"} == 1', "vllm:num_requests_running", "tandem_kvpool_up == 1",
           "tandem_autoscaler_desired_replicas"]  # fmt: skip
#: The first wave's series scraped: counters that a request creates start at their first sample, so
#: only a second wave makes their rates move.
CREATED = [
    "tandem_router_tenant_served_tokens_total",
    "vllm:generation_tokens_total > 0",
    "tandem_router_rate_limited_total",
]
#: The traffic's rates, the recording rules and the autoscaler's scale-down.
SETTLED = [
    'tandem_service:ttft_slo_miss_ratio:rate5m{tandem_service="obs"}',
    "rate(tandem_router_tenant_served_tokens_total[1m]) > 0",
    "rate(vllm:generation_tokens_total[1m]) > 0",
    "rate(tandem_router_rate_limited_total[1m]) > 0",
    "tandem_autoscaler_scale_events_total",
]


def _wait_for(live: Live, canaries: list[str]) -> None:
    """Wait until every canary query returns series."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        missing = [c for c in canaries if not live.query(c)[1]]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus never saw {missing}:\n" + "".join(live.output))
        time.sleep(1)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is not installed; run `bash scripts/bootstrap.sh dev` (Debian's package)")
    if find_redis_server() is None:
        pytest.fail("redis-server is not installed; run `bash scripts/bootstrap.sh dev`")
    tmp = tmp_path_factory.mktemp("observe")
    processes = Processes()
    stack, output = _start_stack(tmp)
    try:
        state = tmp / "state"
        written = yaml.safe_load((state / "prometheus.yml").read_text())
        pool_url = yaml.safe_load((state / "router.yaml").read_text())["kvPoolUrl"]
        exporter_port, prometheus_port = free_port(), free_port()
        # The stack's Redis has a password: `tandem up` keeps it in the state dir for its own user.
        password = (state / "auth.conf").read_text().split()[1]  # `requirepass <password>`
        processes.start(
            [sys.executable, "-m", "tandem.cli", "kvpool", "exporter", "--url", pool_url,
             "--host", "127.0.0.1", "--port", str(exporter_port)],
            log=tmp / "exporter.log",
            env={**os.environ, "TANDEM_KVPOOL_PASSWORD": password},
        )  # fmt: skip
        _wait_http(f"http://127.0.0.1:{exporter_port}/metrics", timeout_s=30, what="tandem kvpool exporter")
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump(_prometheus_config(written, exporter_port=exporter_port)))
        processes.start(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"],
            log=tmp / "prometheus.log",
        )  # fmt: skip
        base = f"http://127.0.0.1:{prometheus_port}"
        _wait_http(f"{base}/-/ready", timeout_s=60, what="prometheus")
        endpoint = next(line.split(": ", 1)[1].strip() for line in output if line.startswith("endpoint: "))
        with httpx.Client(base_url=base, timeout=30, trust_env=False) as client:
            result = Live(prometheus=client, scrape_config=written, output=output)
            _wait_for(result, SCRAPED)
            _send_traffic(endpoint, wave=1)
            _wait_for(result, CREATED)
            _send_traffic(endpoint, wave=2)
            _wait_for(result, SETTLED)
            result.seen = set(result.label_values('{__name__=~".+"}', "__name__"))
            yield result
    finally:
        processes.stop_all()
        stop_process(stack, timeout_s=60)
        if stack.stdout is not None:
            stack.stdout.close()


def _resolved(live: Live, board: dict[str, Any]) -> dict[str, str]:
    """Each variable's value as Grafana sends it: a query variable's values from Prometheus as
    `(a|b)` (what selecting all of them gives), a custom variable's default."""
    values: dict[str, str] = {}
    for variable in variables(board):
        if variable["type"] == "query":
            found = live.label_values(*label_values_query(variable))
            assert found, f"{board['uid']}: ${variable['name']} ({variable['definition']}) has no value"
            values[variable["name"]] = "(" + "|".join(found) + ")"
        else:
            values[variable["name"]] = custom_value(variable)
    return values


def _why_empty(live: Live, expr: str) -> str | None:
    """None when an empty answer is explained by INCIDENT_ONLY metrics alone, else what is wrong."""
    recorded = {rule["record"] for rule in load_rules() if "record" in rule}
    unseen = metric_names(expr) - live.seen - recorded
    if not unseen:
        return "no series, though Prometheus has every metric it names (labels or maths filter all out)"
    unexplained = unseen - set(INCIDENT_ONLY)
    return f"no series; never scraped: {sorted(unexplained)}" if unexplained else None


def test_tandem_up_writes_a_scrape_job_with_the_dashboards_labels_for_every_component(live: Live) -> None:
    jobs = {job["job_name"]: job["static_configs"] for job in live.scrape_config["scrape_configs"]}
    assert set(jobs) == {*JOBS.values(), "tandem-autoscaler"}
    roles = sorted(g["labels"]["tandem_role"] for groups in jobs.values() for g in groups)
    assert roles == ["autoscaler", "decode", "decode", "prefill", "router"]
    assert {g["labels"]["tandem_service"] for groups in jobs.values() for g in groups} == {SERVICE}
    scraped = {r["metric"]["instance"] for r in live.query("up")[1]}
    listed = {target for groups in jobs.values() for g in groups for target in g["targets"]}
    assert listed <= scraped


def test_every_dashboard_query_is_valid_and_returns_series(live: Live) -> None:
    problems: list[str] = []
    checked = 0
    for name, board in load_dashboards().items():
        values = _resolved(live, board)
        for query in dashboard_queries(board, values):
            checked += 1
            problem = _check(live, query)
            if problem is not None:
                problems.append(f"{name}: {query.where}: {problem}\n    {query.expr}")
    assert checked > 50
    assert not problems, "\n".join(problems)


def _check(live: Live, query: Query) -> str | None:
    error, result = live.query(query.expr)
    if error is not None:
        return error
    if not result:
        return _why_empty(live, query.expr)
    # The legend's {{label}}s must be labels of the answer (a typo in `by (...)` still returns series).
    wanted = set(re.findall(r"{{\s*(\w+)\s*}}", query.legend))
    lacking = {label for series in result for label in wanted - set(series["metric"])}
    return f"the legend names labels the series lack: {sorted(lacking)}" if lacking else None


def test_every_recording_rule_and_alert_expression_is_valid_and_returns_series(live: Live) -> None:
    problems: list[str] = []
    for rule in load_rules():
        name = rule.get("record") or rule["alert"]
        expr = rule["expr"] if "record" in rule else probe(rule["expr"])
        error, result = live.query(expr)
        if error is not None or not result:
            problems.append(f"{name}: {error or 'no series'}\n    {expr}")
    assert not problems, "\n".join(problems)


def test_prometheus_evaluates_every_rule_of_the_chart_without_error(live: Live) -> None:
    groups = live.prometheus.get("/api/v1/rules").json()["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(rules) == {rule.get("record") or rule["alert"] for rule in load_rules()}
    unhealthy = {name: r.get("lastError") for name, r in rules.items() if r["health"] != "ok"}
    assert unhealthy == {}


def test_every_metric_named_is_scraped_or_known_to_need_an_incident(live: Live) -> None:
    named: set[str] = set()
    for board in load_dashboards().values():
        for query in dashboard_queries(board, _resolved(live, board)):
            named |= metric_names(query.expr)
    recorded = set()
    for rule in load_rules():
        named |= metric_names(rule["expr"])
        recorded.add(rule.get("record"))
    assert named - live.seen - recorded - set(INCIDENT_ONLY) == set()
