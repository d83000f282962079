"""The InferenceGateway CRD generated from its spec model: committed copies, structural rules, the
example validated against it, and the field reference in docs/operator.md.

Real: the generator, `tandem crd --gateway`, the committed files and the example. Faked: the API
server's schema validation, by jsonschema over the translated schema (as test_operator_crd.py).
"""

from __future__ import annotations

from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from click.testing import CliRunner
from tests.operator.specs import EXAMPLES, ROOT
from tests.operator.test_operator_crd import as_json_schema, nodes

from tandem.cli.main import cli
from tandem.core.gateway import parse_inference_gateway
from tandem.operator.crd import crd_manifest, crd_yaml, openapi_schema
from tandem.operator.reference import GATEWAY_BEGIN, GATEWAY_END, reference_markdown

COMMITTED = {
    "chart": ROOT / "charts" / "tandem" / "crds" / "inferencegateways.tandem.dev.yaml",
    "kustomize": ROOT / "deploy" / "kustomize" / "base" / "crd-gateway.yaml",
}


@pytest.mark.parametrize("copy_name", sorted(COMMITTED))
def test_the_committed_gateway_crd_equals_what_tandem_crd_gateway_prints(copy_name: str) -> None:
    printed = CliRunner().invoke(cli, ["crd", "--gateway"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == crd_yaml("InferenceGateway")
    assert COMMITTED[copy_name].read_text() == printed.output, "stale: run scripts/generate-crd.sh"


def test_the_gateway_crd_names_the_kind_with_its_columns_and_status() -> None:
    crd = crd_manifest("InferenceGateway")
    assert crd["metadata"]["name"] == "inferencegateways.tandem.dev"
    assert (crd["spec"]["scope"], crd["spec"]["names"]["shortNames"]) == ("Namespaced", ["igw"])
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0]
    assert columns == ["Models", "Ready", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"models", "services", "conditions", "observedGeneration", "readyServices"} <= set(status)


def test_the_gateway_schema_is_structural() -> None:
    for path, node in nodes(openapi_schema("InferenceGateway")):
        assert not {"$ref", "$defs", "title", "const", "allOf", "oneOf", "not", "anyOf"} & set(node), path
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path


def gateway_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(as_json_schema(openapi_schema("InferenceGateway")))
    return sorted(
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)
    )


def test_the_example_gateway_is_valid_for_the_crd_and_the_model() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "gateway-fleet.yaml").read_text()))
    (gateway,) = [d for d in documents if d["kind"] == "InferenceGateway"]
    assert gateway_errors(gateway) == []
    assert [a.name for a in parse_inference_gateway(gateway).spec.aliases] == ["chat"]


def test_the_schema_rejects_an_alias_without_targets_and_a_bad_weight() -> None:
    gateway = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceGateway",
        "metadata": {"name": "fleet"},
        "spec": {"aliases": [{"name": "chat", "targets": [{"service": "a", "weight": -1}]}]},
    }
    assert gateway_errors(gateway) == ["spec.aliases.0.targets.0.weight: -1 is less than the minimum of 0"]


def test_the_gateway_reference_in_the_docs_is_the_generated_one() -> None:
    document = (ROOT / "docs" / "operator.md").read_text()
    start, end = document.index(GATEWAY_BEGIN), document.index(GATEWAY_END) + len(GATEWAY_END) + 1
    assert document[start:end] == reference_markdown("InferenceGateway")
