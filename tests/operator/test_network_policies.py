"""The NetworkPolicies of a service leave open only the documented paths (docs/security.md, Network
policies), checked over the output of `tandem render`.

Real: the `tandem render` command (the operator's own builders) and the NetworkPolicy semantics of
the Kubernetes API, applied by the small evaluator in netpol_eval.py to every pod the rendered
Deployments create and every port they declare. Faked: the network plugin that would enforce them
(none runs here); the evaluator's own semantics are pinned by the first tests.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.operator.netpol_eval import Pod, allowed, selects
from tests.operator.specs import example

from tandem.cli.main import cli

NAMESPACE = "llm"
#: Ports no Tandem pod declares, which must be refused too (ssh, a debug port, Prometheus' own).
OTHER_PORTS = (22, 5000, 9090)


def render(tmp_path: Path, spec: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    document = example("local-sim.yaml")
    document["metadata"] = {"name": "demo", "namespace": NAMESPACE}
    document["spec"] |= spec
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(cli, ["render", "-f", str(path), *args])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def pods(manifests: list[dict[str, Any]]) -> dict[str, Pod]:
    """The pod of each rendered Deployment, by Deployment name."""
    found = {}
    for d in manifests:
        if d["kind"] != "Deployment":
            continue
        template = d["spec"]["template"]
        containers = [*template["spec"]["containers"], *template["spec"].get("initContainers", [])]
        ports = {p["name"]: p["containerPort"] for c in containers for p in c.get("ports", [])}
        found[d["metadata"]["name"]] = Pod(d["metadata"]["namespace"], template["metadata"]["labels"], ports)
    return found


def policies(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in manifests if d["kind"] == "NetworkPolicy"]


def open_paths(manifests: list[dict[str, Any]], sources: dict[str, Pod]) -> set[tuple[str, str, int]]:
    """Every (source, destination, port) the policies allow, over every declared and other port."""
    destinations = pods(manifests)
    opened = set()
    for (src_name, source), (dst_name, destination) in itertools.product(
        sources.items(), destinations.items()
    ):
        for port in (*destination.named_ports.values(), *OTHER_PORTS):
            if allowed(policies(manifests), source=source, destination=destination, port=port):
                opened.add((src_name, dst_name, port))
    return opened


def strangers(namespace: str, manifests: list[dict[str, Any]]) -> dict[str, Pod]:
    """Pods in `namespace`: one without labels, and one forging each Tandem pod's labels."""
    forged = {f"forged {name}": Pod(namespace, pod.labels) for name, pod in pods(manifests).items()}
    return {"unlabelled": Pod(namespace, {"app": "other"}), **forged}


PRECISE = {"router": {"prefixSource": "precise"}}
GATEWAY, PREFILL, DECODE, REDIS = "demo-router", "demo-prefill", "demo-decode", "demo-kv"


def test_the_evaluator_follows_the_selector_and_isolation_rules_of_the_api() -> None:
    assert selects({}, {"a": "1"})
    assert selects({"matchExpressions": [{"key": "r", "operator": "In", "values": ["x"]}]}, {"r": "x"})
    assert not selects({"matchLabels": {"a": "1"}}, {"a": "2"})
    target = Pod("ns", {"app": "db"}, {"db": 5432})
    policy = {
        "kind": "NetworkPolicy",
        "metadata": {"namespace": "ns"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "db"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "db"}]}
            ],
        },
    }
    web_here, web_elsewhere = Pod("ns", {"app": "web"}), Pod("other", {"app": "web"})
    assert allowed([policy], source=web_here, destination=target, port=5432)
    assert not allowed([policy], source=web_here, destination=target, port=22)  # isolated: other ports shut
    assert not allowed([policy], source=web_elsewhere, destination=target, port=5432)  # same namespace only
    assert allowed(
        [policy], source=web_elsewhere, destination=Pod("ns", {"app": "web"}), port=1
    )  # unselected


def test_inside_the_namespace_only_the_documented_paths_are_open(tmp_path: Path) -> None:
    manifests = render(tmp_path, PRECISE)
    inside = {**pods(manifests), **strangers(NAMESPACE, manifests)}
    # A forged pod carries the same labels as the real one: labels are the identity inside a namespace.
    inside = {k: v for k, v in inside.items() if not k.startswith("forged")}
    # The client port; the diagnostics port (9090) is for the metrics namespaces only.
    gateway_from_everyone = {(src, GATEWAY, 8080) for src in inside}
    assert open_paths(manifests, inside) == gateway_from_everyone | {
        (GATEWAY, PREFILL, 8000),
        (GATEWAY, DECODE, 8000),
        (GATEWAY, PREFILL, 5557),
        (GATEWAY, PREFILL, 5558),
        (GATEWAY, DECODE, 5557),
        (GATEWAY, DECODE, 5558),
        (GATEWAY, REDIS, 6379),
        (PREFILL, REDIS, 6379),
        (DECODE, REDIS, 6379),
    }


@pytest.mark.parametrize("spec", [{}, PRECISE], ids=["approximate", "precise prefix source"])
def test_from_a_pod_in_another_namespace_every_tandem_port_is_refused(
    tmp_path: Path, spec: dict[str, Any]
) -> None:
    manifests = render(tmp_path, spec)
    assert len(pods(manifests)) == 4
    assert open_paths(manifests, strangers("elsewhere", manifests)) == set()


def test_client_namespaces_open_the_gateway_port_and_nothing_else(tmp_path: Path) -> None:
    manifests = render(tmp_path, {**PRECISE, "networkPolicy": {"clientNamespaces": ["apps"]}})
    opened = open_paths(manifests, strangers("apps", manifests))
    assert {(dst, port) for _, dst, port in opened} == {(GATEWAY, 8080)}
    assert open_paths(manifests, strangers("elsewhere", manifests)) == set()


def test_a_metrics_namespace_reaches_the_ports_where_metrics_are_but_not_the_client_port_redis_or_kv_events(
    tmp_path: Path,
) -> None:
    manifests = render(tmp_path, PRECISE, "--metrics-namespace", "tandem-system")
    opened = open_paths(manifests, strangers("tandem-system", manifests))
    # The gateway's diagnostics port (its /metrics, behind the metrics token), the engines' port.
    assert {(dst, port) for _, dst, port in opened} == {(GATEWAY, 9090), (PREFILL, 8000), (DECODE, 8000)}


def test_with_lora_the_metrics_namespace_reaches_the_adapter_sidecars_and_nobody_else_does(
    tmp_path: Path,
) -> None:
    lora = {"engine": {"kind": "sim", "lora": {"maxLoras": 2}}}
    manifests = render(tmp_path, lora, "--metrics-namespace", "tandem-system")
    assert pods(manifests)[DECODE].named_ports["adapter-sync"] == 8095
    operator_side = open_paths(manifests, strangers("tandem-system", manifests))
    assert {(dst, port) for _, dst, port in operator_side} == {
        (GATEWAY, 9090), (PREFILL, 8000), (DECODE, 8000), (PREFILL, 8095), (DECODE, 8095),
    }  # fmt: skip
    inside = open_paths(manifests, strangers(NAMESPACE, manifests))
    assert not {path for path in inside if path[2] == 8095}, "not even the service's own gateway"


def test_an_external_redis_gets_no_policy_and_switching_them_off_renders_none(tmp_path: Path) -> None:
    external = render(tmp_path, {"kvPool": {"redis": {"url": "redis://cache.example:6379"}}})
    assert sorted(p["metadata"]["name"] for p in policies(external)) == [DECODE, PREFILL, GATEWAY]
    assert policies(render(tmp_path, {"networkPolicy": {"enabled": False}})) == []
