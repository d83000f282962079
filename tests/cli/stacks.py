"""A small planned stack for the local runtime's tests: the real plan of a real spec, every process
replaced by `sleep 60` so that starting it costs nothing."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from tandem.core.specrules import parse_inference_service
from tandem.local.plan import LocalPlan, build_plan


def small_plan(state_dir: Path) -> LocalPlan:
    """Redis, one prefill and one decode engine, the gateway (ports 9000-9002 and 8080)."""
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "m/7b", "servedName": "m"}, "engine": {"kind": "sim"},
                 "prefill": {"replicas": 1}, "decode": {"replicas": 1}},
    }  # fmt: skip
    plan = build_plan(
        parse_inference_service(doc), ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=state_dir,
    )  # fmt: skip
    sleeping = tuple(dataclasses.replace(p, argv=("sleep", "60")) for p in plan.processes)
    return dataclasses.replace(plan, processes=sleeping)
