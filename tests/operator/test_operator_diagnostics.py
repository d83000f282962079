"""The gateway's diagnostics port as the operator renders it: `/metrics` on port 9090 (`metrics`), off the
client port; open only to the operator's metrics namespaces; behind a generated token with
`router.metricsToken`.

Real: the operator's pure builders (`desired_children`) on specs parsed as the API server's would be.
"""

from __future__ import annotations

from typing import Any

from tests.operator.specs import IMAGES, OWNER, sim

from tandem.operator.resources import desired_children


def children(spec: Any, **kwargs: Any) -> dict[tuple[str, str], dict[str, Any]]:
    made = desired_children(spec, owner=OWNER, images=IMAGES, **kwargs)
    return {(c.manifest["kind"], c.manifest["metadata"]["name"]): c.manifest for c in made}


def router_container(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (container,) = objects[("Deployment", "demo-router")]["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_metrics_move_to_the_diagnostics_port_open_to_the_metrics_namespaces_only() -> None:
    objects = children(sim(), metrics_namespaces=["monitoring"])
    container = router_container(objects)
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == "9090"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    assert "TANDEM_METRICS_TOKEN" not in {e["name"] for e in container["env"]}
    assert ("Secret", "demo-metrics-token") not in objects
    service_ports = {p["name"]: p["port"] for p in objects[("Service", "demo-router")]["spec"]["ports"]}
    assert service_ports == {"http": 8080, "metrics": 9090}
    rules = objects[("NetworkPolicy", "demo-router")]["spec"]["ingress"]
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in rules}
    assert by_port[9090] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert {"podSelector": {}} in by_port[8080]


def test_no_metrics_namespace_means_nobody_reaches_the_diagnostics_port() -> None:
    rules = children(sim())[("NetworkPolicy", "demo-router")]["spec"]["ingress"]
    assert [rule["ports"][0]["port"] for rule in rules] == [8080]


def test_metrics_token_generates_a_secret_the_gateway_reads() -> None:
    objects = children(sim(router={"metricsToken": True}))
    secret = objects[("Secret", "demo-metrics-token")]
    assert set(secret["data"]) == {"token"}
    env = {e["name"]: e for e in router_container(objects)["env"]}
    assert env["TANDEM_METRICS_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "demo-metrics-token", "key": "token"}
    }
