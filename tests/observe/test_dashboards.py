"""The chart's Grafana dashboards (charts/tandem/dashboards/*.json) read as files, and the names they use.

Real: the JSON files, the rule file, docs/*.md (where every metric of the gateway, the autoscaler and
the KV pool is documented), the simulator's own registry (vLLM's names as it exports them) and the KV
connector's counter table. Faked: nothing; no Prometheus or Grafana runs here (test_prometheus_live.py
runs every query).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from tests.observe.promql import BUILTINS, ROOT, load_dashboards, load_rules, metric_names

from tandem.kvpool.connector_plan import COUNTER_HELP
from tandem.sim.metrics import SimMetrics

BOARDS = load_dashboards()
#: Written for this chart, so they do not count as the components' own documentation.
OWN_DOCS = {"observability.md", "alerts.md"}


def known_names() -> set[str]:
    """Every metric name a Tandem component exports or the rules record, as far as it can be known
    without running them: documented names, the simulator's exposition, the connector's counters."""
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md") if p.name not in OWN_DOCS)
    names = set(re.findall(r"[A-Za-z_:][\w:]*", docs))
    registry = CollectorRegistry()
    SimMetrics(registry, model_name="m", block_size=16, num_gpu_blocks=8)
    exposition = generate_latest(registry).decode()
    names |= {
        line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if not line.startswith("#")
    }
    names |= {f"tandem_kvpool_connector_{name}_total" for name in COUNTER_HELP}
    names |= {rule["record"] for rule in load_rules() if "record" in rule}
    return names | {"up"}


def targets(board: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(panel, target) for panel in board["panels"] for target in panel.get("targets", [])]


def test_there_is_a_dashboard_for_the_gateway_the_engines_the_kv_pool_and_the_autoscaler() -> None:
    assert {board["uid"] for board in BOARDS.values()} == {
        "tandem-gateway", "tandem-engines", "tandem-kvpool", "tandem-autoscaler"
    }  # fmt: skip
    for board in BOARDS.values():
        assert "tandem" in board["tags"] and board["title"].startswith("Tandem / ")


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_panel_has_its_place_a_description_and_queries_on_the_chosen_data_source(name: str) -> None:
    board = BOARDS[name]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"] == panel["datasource"], panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_variable_a_query_uses_is_defined_and_every_variable_is_used(name: str) -> None:
    board = BOARDS[name]
    defined = {v["name"] for v in board["templating"]["list"]}
    used: set[str] = set()
    for _, target in targets(board):
        used |= set(re.findall(r"\$(\w+)", target["expr"]))
    builtins = {name.removeprefix("$") for name in BUILTINS}
    assert used - builtins <= defined
    assert defined - {"datasource"} <= used


def test_every_metric_the_dashboards_and_rules_name_is_one_tandem_or_vllm_exports() -> None:
    known = known_names()
    named = {rule.get("record") or rule["alert"]: metric_names(rule["expr"]) for rule in load_rules()}
    for board in BOARDS.values():
        for panel, target in targets(board):
            expr = re.sub(r"\$\w+", "1", target["expr"])  # variables are values, not metrics
            named[f"{board['uid']} / {panel['title']}"] = metric_names(expr)
    # A histogram is documented by its name; Prometheus has its _bucket, _count and _sum series.
    unknown = {
        where: sorted(lacking)
        for where, names in named.items()
        if (
            lacking := {
                n for n in names if n not in known and re.sub(r"_(bucket|count|sum)$", "", n) not in known
            }
        )
    }
    assert unknown == {}
