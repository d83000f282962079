"""`<state dir>/prometheus.yml`, the scrape configuration `tandem up` writes.

Real: the local plan of the shipped example and of an autoscaled spec (pure), the file as written, and
Prometheus' own `promtool check config` on it (Debian's `prometheus` package). Faked: the ports.
tests/observe/test_prometheus_live.py scrapes a running stack with it.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.cli.documents import load_one
from tandem.local.plan import LocalPlan, build_plan
from tandem.local.scrape import prometheus_config, write_prometheus_config

ROOT = Path(__file__).resolve().parents[2]


def plan_of(example: str, tmp_path: Path) -> LocalPlan:
    return build_plan(
        load_one(ROOT / "deploy" / "examples" / example), ports=itertools.count(20000), router_port=8080,
        python="python", redis_server="/usr/bin/redis-server", state_dir=tmp_path,
    )  # fmt: skip


def targets(config: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """job → [(target, tandem_role)]."""
    return {
        job["job_name"]: [
            (t, g["labels"]["tandem_role"]) for g in job["static_configs"] for t in g["targets"]
        ]
        for job in config["scrape_configs"]
    }


def test_every_gateway_and_engine_of_the_plan_is_a_target_labelled_with_its_service_and_role(
    tmp_path: Path,
) -> None:
    plan = plan_of("local-sim.yaml", tmp_path)
    config = prometheus_config(plan, autoscaler_port=9090)
    assert targets(config) == {
        "tandem-engines": [("127.0.0.1:20001", "prefill"), ("127.0.0.1:20002", "decode"),
                           ("127.0.0.1:20003", "decode")],
        "tandem-router": [("127.0.0.1:8080", "router")],
    }  # fmt: skip
    services = {
        g["labels"]["tandem_service"] for job in config["scrape_configs"] for g in job["static_configs"]
    }
    assert services == {"demo"}


def test_the_autoscaler_is_a_target_only_when_a_pool_is_autoscaled(tmp_path: Path) -> None:
    plan = plan_of("local-autoscale.yaml", tmp_path)
    assert plan.endpoint_file is not None
    assert targets(prometheus_config(plan, autoscaler_port=9191))["tandem-autoscaler"] == [
        ("127.0.0.1:9191", "autoscaler")
    ]


def test_the_file_says_how_to_add_the_kv_pool_exporter_and_promtool_accepts_it(tmp_path: Path) -> None:
    plan = plan_of("local-sim.yaml", tmp_path)
    path = write_prometheus_config(tmp_path / "prometheus.yml", plan, autoscaler_port=9090)
    text = path.read_text()
    assert "tandem kvpool exporter --url redis://127.0.0.1:20000 --port 9400" in text
    assert yaml.safe_load(text) == prometheus_config(plan, autoscaler_port=9090)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed; run `bash scripts/bootstrap.sh dev` (Debian's prometheus)")
    checked = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
