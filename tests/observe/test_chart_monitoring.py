"""The chart's monitoring objects: ServiceMonitor, PodMonitor, PrometheusRule and dashboard ConfigMaps.

Real: the chart rendered and linted by Helm's Go SDK (helm-python-sdk), the operator's own Service and
Deployment builders (what the monitors must select), kubernetes-validate --strict for the ConfigMaps,
and the chart's files they wrap. Not here: the Prometheus Operator's CRD schemas (no copy is vendored;
the monitors' fields are checked by name below) and a running Prometheus (test_prometheus_live.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from tests.observe.promql import CHART, DASHBOARDS, RULES
from tests.operator.specs import IMAGES, OWNER, VARIANTS

from tandem.operator.resources import desired_children

ON: dict[str, Any] = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "dashboards": {"enabled": True},
}
MONITORED: dict[str, Any] = {"autoscaler": {"enabled": True}, "monitoring": ON}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    rendered = helm.Chart.load(CHART).render(values, name="tandem", namespace="tandem-system")
    return [
        d
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]


def only(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in documents if d["kind"] == kind]


def test_monitoring_is_off_by_default() -> None:
    kinds = {d["kind"] for d in render(None)}
    assert not kinds & (MONITORING_KINDS | {"ConfigMap"})


def test_each_dashboard_ships_in_a_configmap_with_the_grafana_sidecars_label() -> None:
    configmaps = {d["metadata"]["name"]: d for d in only(render(MONITORED), "ConfigMap")}
    assert set(configmaps) == {
        f"tandem-dashboard-{name}" for name in ("gateway", "engines", "kvpool", "autoscaler")
    }
    for path in DASHBOARDS.glob("*.json"):
        configmap = configmaps[f"tandem-dashboard-{path.stem.removeprefix('tandem-')}"]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(configmap["data"][path.name]) == json.loads(path.read_text())


def test_the_dashboards_label_annotations_and_namespace_can_be_chosen() -> None:
    dashboards = {
        "enabled": True, "label": "example.com/dashboard", "labelValue": "tandem",
        "annotations": {"grafana_folder": "Tandem"}, "namespace": "monitoring",
    }  # fmt: skip
    for configmap in only(render({"monitoring": {"dashboards": dashboards}}), "ConfigMap"):
        assert configmap["metadata"]["namespace"] == "monitoring"
        assert configmap["metadata"]["labels"]["example.com/dashboard"] == "tandem"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "Tandem"}


@pytest.mark.parametrize("version", ["1.30", "1.34"])
def test_the_dashboard_configmaps_pass_strict_validation(version: str) -> None:
    for configmap in only(render(MONITORED), "ConfigMap"):
        kubernetes_validate.validate(configmap, version, strict=True)


def test_the_prometheus_rule_is_the_rule_file() -> None:
    (rule,) = only(render(MONITORED), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_runbook_links_can_point_elsewhere_and_keep_their_anchors() -> None:
    values = {
        "monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://wiki.example/t/"}}
    }
    (rule,) = only(render(values), "PrometheusRule")
    urls = [
        r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r
    ]
    assert urls and all(url.startswith("https://wiki.example/t#tandem") for url in urls)


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions with In) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def service_discovery_label(key: str) -> str:
    """Prometheus' `__meta_kubernetes_service_label_<name>` of a Kubernetes label key."""
    return "__meta_kubernetes_service_label_" + "".join(c if c.isalnum() else "_" for c in key)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_service_monitor_scrapes_the_gateway_and_engine_services_the_operator_builds(
    variant: str,
) -> None:
    (monitor,) = only(render(MONITORED), "ServiceMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"http", "metrics"}
    services = [c.manifest for c in desired_children(VARIANTS[variant], owner=OWNER, images=IMAGES)]
    selected = {}
    for service in (s for s in services if s["kind"] == "Service"):
        if matches(monitor["spec"]["selector"], service["metadata"]["labels"]):
            selected[service["metadata"]["labels"]["tandem.dev/role"]] = service
    assert set(selected) == {"router", "prefill", "decode"}  # not the KV pool's Redis
    # Each Service is scraped on exactly one endpoint: engines on http, the gateway on its diagnostics
    # port (its client port has no /metrics); a `keep` relabeling on the role says which.
    for role, service in selected.items():
        scraped = []
        for port, endpoint in endpoints.items():
            keep = next(r for r in endpoint["relabelings"] if r.get("action") == "keep")
            if re.fullmatch(keep["regex"], role):
                scraped.append(port)
                assert port in {p["name"] for p in service["spec"]["ports"]}
        assert scraped == (["metrics"] if role == "router" else ["http"]), role
    for endpoint in endpoints.values():
        # The relabelings read labels every selected Service has.
        for relabeling in endpoint["relabelings"]:
            for source in relabeling["sourceLabels"]:
                if source.startswith("__meta_kubernetes_service_label_"):
                    for service in selected.values():
                        keys = {service_discovery_label(k) for k in service["metadata"]["labels"]}
                        assert source in keys
        targets = [r["targetLabel"] for r in endpoint["relabelings"] if "targetLabel" in r]
        assert targets == ["tandem_service", "tandem_role"]


@pytest.mark.parametrize(
    ("operator", "selector"),
    [
        ({}, {"matchNames": ["tandem-system"]}),
        ({"clusterWide": True}, {"any": True}),
        ({"watchNamespaces": ["team-a", "team-b"]}, {"matchNames": ["team-a", "team-b"]}),
    ],
)
def test_the_service_monitor_looks_where_the_operator_watches(
    operator: dict[str, Any], selector: dict[str, Any]
) -> None:
    (monitor,) = only(render({**MONITORED, "operator": operator}), "ServiceMonitor")
    assert monitor["spec"]["namespaceSelector"] == selector


def test_the_pod_monitor_scrapes_the_autoscalers_metrics_port_and_keeps_its_service_label() -> None:
    documents = render(MONITORED)
    (monitor,) = only(documents, "PodMonitor")
    (deployment,) = [d for d in only(documents, "Deployment") if d["metadata"]["name"] == "tandem-autoscaler"]
    template = deployment["spec"]["template"]
    assert matches(monitor["spec"]["selector"], template["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == [{"targetLabel": "tandem_role", "replacement": "autoscaler"}]


def test_without_the_autoscaler_there_is_no_pod_monitor() -> None:
    kinds = [d["kind"] for d in render({"monitoring": ON})]
    assert "PodMonitor" not in kinds and "ServiceMonitor" in kinds


def test_the_chart_with_monitoring_lints_without_errors_or_warnings() -> None:
    report = helm.lint(CHART, MONITORED, strict=True, namespace="tandem-system")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize(
    ("monitoring", "error"),
    [
        ({"serviceMonitor": {"interval": "15 seconds"}}, "/monitoring/serviceMonitor/interval"),
        ({"dashboards": {"label": "not a label"}}, "/monitoring/dashboards/label"),
        ({"prometheusRule": {"runbookBaseUrl": "wiki/page"}}, "/monitoring/prometheusRule/runbookBaseUrl"),
        ({"prometheusRule": {"namespace": "Not_A_Namespace"}}, "/monitoring/prometheusRule/namespace"),
        ({"grafana": {"enabled": True}}, "grafana"),
    ],
)
def test_the_values_schema_rejects_invalid_monitoring_values(monitoring: dict[str, Any], error: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=error):
        helm.Chart.load(CHART).render({"monitoring": monitoring})
