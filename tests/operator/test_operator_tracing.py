"""`spec.tracing` as the operator renders it: the engines get vLLM's `--otlp-traces-endpoint` and the
OpenTelemetry SDK's variables (protocol, a parent-based ratio sampler, a service name per pool); the
gateway reads the same section from its config; a `file://` endpoint (for `tandem up`) is refused.

Real: the operator's pure builders on specs parsed as the API server's would be, and the cluster
rules `tandem render` and the operator apply.
"""

from __future__ import annotations

from typing import Any

import yaml
from tests.operator.specs import IMAGES, OWNER, gpu, sim

from tandem.core.specrules import cluster_adapter_rules
from tandem.operator.resources import desired_children

TRACING = {"endpoint": "http://otel-collector.observability:4317", "samplingRatio": 0.25}


def engine_container(spec: Any, pool: str) -> dict[str, Any]:
    made = {(c.manifest["kind"], c.manifest["metadata"]["name"]): c.manifest for c in
            desired_children(spec, owner=OWNER, images=IMAGES)}  # fmt: skip
    containers = made[("Deployment", f"demo-{pool}")]["spec"]["template"]["spec"]["containers"]
    (engine,) = [c for c in containers if c["name"] == "engine"]
    return dict(engine)


def test_vllm_engines_export_their_spans_where_the_gateway_does() -> None:
    spec = gpu(tracing=TRACING)
    for pool in ("prefill", "decode"):
        engine = engine_container(spec, pool)
        args = engine["args"]
        assert args[args.index("--otlp-traces-endpoint") + 1] == TRACING["endpoint"]
        env = {e["name"]: e.get("value") for e in engine["env"]}
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"] == f"demo-{pool}"
    made = desired_children(spec, owner=OWNER, images=IMAGES)
    (configmap,) = [c.manifest for c in made if c.ref.kind == "ConfigMap" and c.ref.name == "demo-router"]
    config = yaml.safe_load(configmap["data"]["router.yaml"])
    assert config["spec"]["tracing"]["endpoint"] == TRACING["endpoint"]


def test_simulated_engines_get_the_same_flag_and_untraced_services_nothing() -> None:
    engine = engine_container(sim(tracing=TRACING), "decode")
    assert "--otlp-traces-endpoint" in engine["args"]
    plain = engine_container(gpu(), "decode")
    assert "--otlp-traces-endpoint" not in plain["args"]
    assert not any(e["name"].startswith("OTEL_") for e in plain["env"])


def test_a_file_endpoint_is_for_tandem_up_only() -> None:
    errors = [str(e) for e in cluster_adapter_rules(sim(tracing={"endpoint": "file:///tmp/spans"}))]
    assert errors == [
        "spec.tracing.endpoint: file:// works with tandem up only; in a cluster give an OTLP collector's URL"
    ]
