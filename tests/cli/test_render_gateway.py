"""`tandem render` and `tandem validate` on a file holding an InferenceGateway and its services.

Real: the CLI commands (click's runner), the operator's builders, kubernetes-validate's schemas
(strict) for every rendered object, the shipped example. Nothing is faked; no cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from click.testing import CliRunner

from tandem.cli.main import cli
from tandem.core.gateway import GatewayFile

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "gateway-fleet.yaml"


def render(path: Path) -> list[dict[str, Any]]:
    result = CliRunner().invoke(cli, ["render", "-f", str(path)])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def by_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_every_rendered_object_of_the_example_is_valid_kubernetes() -> None:
    for manifest in render(EXAMPLE):
        kubernetes_validate.validate(manifest, "1.30", strict=True)


def test_the_gateway_renders_once_and_the_services_lose_their_own_gateway() -> None:
    objects = by_name(render(EXAMPLE))
    for kind in ("Deployment", "Service", "ConfigMap", "NetworkPolicy", "ServiceAccount"):
        assert (kind, "fleet-gateway") in objects
    assert ("Secret", "fleet-gateway-keys") in objects
    for service in ("qwen-v1", "qwen-v2"):
        assert ("Deployment", f"{service}-router") not in objects
        assert ("Service", f"{service}-router") not in objects
        assert ("Deployment", f"{service}-decode") in objects
    document = GatewayFile.model_validate(
        yaml.safe_load(objects["ConfigMap", "fleet-gateway"]["data"]["router.yaml"])
    )
    assert [s.name for s in document.services] == ["qwen-v1", "qwen-v2"]
    assert [a.name for a in document.spec.aliases] == ["chat"]
    assert document.services[0].config.service == "qwen-v1"
    assert document.services[0].config.discovery.kind == "kubernetes"


def test_the_gateway_pod_reads_each_services_credentials_from_its_own_variables() -> None:
    objects = by_name(render(EXAMPLE))
    container = objects["Deployment", "fleet-gateway"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env["TANDEM_CACHE_KEY"] == {"name": "fleet-gateway-keys", "key": "salt-key"}
    assert env["TANDEM_KV_POOL_KEY_QWEN_V1"] == {"name": "qwen-v1-cache-keys", "key": "pool-key"}
    assert env["TANDEM_KVPOOL_PASSWORD_QWEN_V2"] == {"name": "qwen-v2-kv-auth", "key": "password"}
    assert env["TANDEM_ENGINE_API_KEY_QWEN_V2"] == {"name": "qwen-v2-engine-key", "key": "api-key"}
    file = yaml.safe_load(objects["ConfigMap", "fleet-gateway"]["data"]["router.yaml"])
    assert file["services"][1]["poolKeyEnv"] == "TANDEM_KV_POOL_KEY_QWEN_V2"
    assert file["services"][1]["kvPoolPasswordEnv"] == "TANDEM_KVPOOL_PASSWORD_QWEN_V2"


def test_the_services_policies_admit_the_gateway_pods() -> None:
    objects = by_name(render(EXAMPLE))
    peers = objects["NetworkPolicy", "qwen-v1-decode"]["spec"]["ingress"][0]["from"]
    assert {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "tandem",
                "app.kubernetes.io/instance": "fleet",
                "tandem.dev/role": "gateway",
            }
        }
    } in peers


def with_documents(tmp_path: Path, edit: Any) -> Path:
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    edit(documents)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda docs: docs[2]["spec"]["model"].update(servedName="qwen-v1"),
            "model name 'qwen-v1' is claimed by services qwen-v1 and qwen-v2",
        ),
        (
            lambda docs: docs[2]["metadata"]["labels"].update({"tandem.dev/gateway": "other"}),
            "qwen-v2 is not a service this gateway selects",
        ),
    ],
    ids=["a name two services claim", "an alias to an unselected service"],
)
def test_render_and_validate_refuse_what_the_operator_refuses(
    tmp_path: Path, edit: Any, message: str
) -> None:
    path = with_documents(tmp_path, edit)
    validated = CliRunner().invoke(cli, ["validate", "-f", str(path)])
    assert validated.exit_code == 1 and message in validated.output, validated.output
    rendered = CliRunner().invoke(cli, ["render", "-f", str(path)])
    assert rendered.exit_code == 1, rendered.output


def test_validate_summarises_the_gateway_and_its_split() -> None:
    result = CliRunner().invoke(cli, ["validate", "-f", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    line = "default/fleet: gateway x2 for qwen-v1 (qwen-v1), qwen-v2 (qwen-v2); aliases chat -> "
    assert line + "qwen-v1:90/qwen-v2:10" in result.output
