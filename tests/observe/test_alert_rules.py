"""The chart's rule file (charts/tandem/alerts/tandem-alerts.yaml) checked by Prometheus' own promtool.

Real: promtool from Debian's `prometheus` package: `check rules`, and `test rules` on the stories in
tandem-alerts.test.yaml (each alert fires on the failure it names, with its labels and rendered
annotations, and stays quiet on the healthy series beside it); docs/alerts.md. Faked: the series,
which are those stories' synthetic inputs; test_prometheus_live.py runs the same rules on a live stack.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.observe.promql import RULES, load_rules, probe

HERE = Path(__file__).resolve().parent
STORIES = HERE / "tandem-alerts.test.yaml"
ALERTS_DOC = HERE.parents[1] / "docs" / "alerts.md"
RUNBOOKS = "https://github.com/tandem-dev/tandem/blob/main/docs/alerts.md#"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed; run `bash scripts/bootstrap.sh dev` (Debian's prometheus)")
    return found


def alerts() -> list[dict[str, object]]:
    return [rule for rule in load_rules() if "alert" in rule]


def test_promtool_accepts_the_rule_file(promtool: str) -> None:
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(load_rules())} rules found" in checked.stdout


def test_every_alert_fires_on_its_failure_and_stays_quiet_beside_it(promtool: str) -> None:
    tested = subprocess.run(
        [promtool, "test", "rules", STORIES.name], capture_output=True, text=True, timeout=120, cwd=HERE
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_firing_story() -> None:
    stories = yaml.safe_load(STORIES.read_text())["tests"]
    fired = {case["alertname"] for story in stories for case in story.get("alert_rule_test", [])}
    assert fired == {rule["alert"] for rule in alerts()}


def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook_in_docs_alerts() -> None:
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", ALERTS_DOC.read_text(), flags=re.MULTILINE)}
    for rule in alerts():
        labels, annotations = rule["labels"], rule["annotations"]
        assert isinstance(labels, dict) and isinstance(annotations, dict)
        assert labels["severity"] in ("critical", "warning"), rule["alert"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, rule["alert"]
        url = annotations["runbook_url"]
        assert url == RUNBOOKS + str(rule["alert"]).lower(), rule["alert"]
        assert url.removeprefix(RUNBOOKS) in anchors, f"docs/alerts.md has no section {rule['alert']}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize(
    ("expr", "probed"),
    [
        ("x == 0", "x == bool 0"),
        ('max by (a) (x{le="1.0", b!="c"}) > 0.5', 'max by (a) (x{le="1.0", b!="c"}) > bool 0.5'),
        ("a > (14.4 * 0.01) and b >= bool 1", "a > bool (14.4 * 0.01) and b >= bool 1"),
        ('label_replace(x, "d", "<", "", "") != y', 'label_replace(x, "d", "<", "", "") != bool y'),
    ],
)
def test_a_probe_turns_every_comparison_into_a_0_or_1_value(expr: str, probed: str) -> None:
    assert probe(expr) == probed


def test_every_alert_expression_can_be_probed() -> None:
    for rule in alerts():
        expr = str(rule["expr"])
        assert probe(expr).count(" bool") >= 1, rule["alert"]
