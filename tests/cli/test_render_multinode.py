"""`tandem render` of the DeepSeek-V3 example (per-pool GPU types and arguments, P:D 1:4, multi-node
engines): every rendered object is valid Kubernetes, the LeaderWorkerSets valid against their CRD.

Real: the CLI (click's runner), the operator's builders, kubernetes-validate's schemas (strict, 1.30
and 1.34) and LeaderWorkerSet's own CRD schema (v0.9.0, vendored in tests/operator/schemas) with
`jsonschema`, closed to unknown fields wherever the API server would prune them. No cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from click.testing import CliRunner
from tests.operator.lws_schema import lws_errors, pod_templates

from tandem.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "deepseek-v3-pd.yaml"


def render(path: Path) -> list[dict[str, Any]]:
    result = CliRunner().invoke(cli, ["render", "-f", str(path)])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


@pytest.mark.parametrize("version", ["1.30", "1.34"])
def test_every_rendered_object_of_the_example_is_valid(version: str) -> None:
    kinds = set()
    for manifest in render(EXAMPLE):
        kinds.add(manifest["kind"])
        if manifest["kind"] != "LeaderWorkerSet":
            kubernetes_validate.validate(manifest, version, strict=True)
            continue
        assert lws_errors(manifest) == []
        for pod_template in pod_templates(manifest):  # the pods themselves, metadata included
            kubernetes_validate.validate(pod_template, version, strict=True)
    assert {"LeaderWorkerSet", "PodDisruptionBudget", "Deployment", "Service"} <= kinds


def test_the_lws_schema_refuses_what_the_api_server_would() -> None:
    lws = next(m for m in render(EXAMPLE) if m["kind"] == "LeaderWorkerSet")
    lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["bogus"] = True
    errors = lws_errors(lws)
    assert any("restartPolicy" in e and "Sometimes" in e for e in errors)
    assert any("bogus" in e for e in errors)


def test_the_example_has_the_seeds_shape() -> None:
    objects = {(m["kind"], m["metadata"]["name"]): m for m in render(EXAMPLE)}
    prefill = objects["LeaderWorkerSet", "deepseek-v3-prefill"]["spec"]
    decode = objects["LeaderWorkerSet", "deepseek-v3-decode"]["spec"]
    gpus = {
        name: spec["replicas"] * spec["leaderWorkerTemplate"]["size"] * 8
        for name, spec in (("prefill", prefill), ("decode", decode))
    }
    assert gpus == {"prefill": 32, "decode": 128}  # P:D 1:4
    leaders = {
        name: spec["leaderWorkerTemplate"]["leaderTemplate"] for name, spec in (("p", prefill), ("d", decode))
    }
    assert leaders["p"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H800"}
    assert leaders["d"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H20"}
    engines = {
        k: next(c for c in t["spec"]["containers"] if c["name"] == "engine") for k, t in leaders.items()
    }
    assert "--enable-expert-parallel" in engines["d"]["args"]
    assert engines["p"]["args"][-2:] == ["--max-num-batched-tokens", "16384"]
    assert engines["d"]["args"][-2:] == ["--max-num-seqs", "256"]
    assert (
        leaders["p"]["metadata"]["labels"]["tandem.dev/kv-layout"]
        == leaders["d"]["metadata"]["labels"]["tandem.dev/kv-layout"]
    )
    assert objects["PodDisruptionBudget", "deepseek-v3-decode"]["spec"]["maxUnavailable"] == 4
    assert objects["Deployment", "deepseek-v3-router"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "node-role.example.com/cpu": "true"
    }
