"""The CRD generated from the spec model: committed copies, structural-schema rules, and the
example InferenceServices validated against it.

Real: the generator (tandem.operator.crd), the `tandem crd` command, the committed files, the
examples. Faked: the API server's schema validation, by `jsonschema`'s Draft 4 validator over
the schema translated from OpenAPI 3.0 (`nullable`, int-or-string) to plain JSON Schema; the
Kubernetes schema of the CRD object itself is checked in test_operator_manifests.py.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from click.testing import CliRunner
from tests.operator.specs import EXAMPLES, ROOT, example

from tandem.cli.main import cli
from tandem.core.specrules import SpecInvalid, parse_inference_service
from tandem.operator.crd import crd_manifest, crd_yaml
from tandem.operator.reference import BEGIN, END, reference_markdown

COMMITTED = {
    "chart": ROOT / "charts" / "tandem" / "crds" / "inferenceservices.tandem.dev.yaml",
    "kustomize": ROOT / "deploy" / "kustomize" / "base" / "crd.yaml",
}


@functools.cache
def openapi_schema() -> dict[str, Any]:
    """The generated schema (cached: read-only in these tests)."""
    version = crd_manifest()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 as Kubernetes reads it → Draft 4 JSON Schema (what jsonschema understands)."""
    if isinstance(node, list):
        return [as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf")
        out["type"] = ["integer", "string"]
    if node.get("nullable"):
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in node:
        out["properties"] = {name: as_json_schema(sub) for name, sub in node["properties"].items()}
    return out


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(as_json_schema(openapi_schema()))
    return sorted(
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)
    )


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("copy_name", sorted(COMMITTED))
def test_the_committed_crd_equals_what_tandem_crd_prints(copy_name: str) -> None:
    printed = CliRunner().invoke(cli, ["crd"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == crd_yaml()
    assert COMMITTED[copy_name].read_text() == printed.output, (
        f"{COMMITTED[copy_name]} is stale: run scripts/generate-crd.sh"
    )


def test_the_crd_names_the_resource_as_documented() -> None:
    spec = crd_manifest()["spec"]
    assert crd_manifest()["metadata"]["name"] == "inferenceservices.tandem.dev"
    assert (spec["group"], spec["scope"]) == ("tandem.dev", "Namespaced")
    assert spec["names"]["shortNames"] == ["tisvc"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0] == [
        "Ready",
        "Prefill",
        "Decode",
        "Adapters",
        "Endpoint",
        "Age",
    ]
    assert columns["Adapters"]["jsonPath"] == ".status.adapterSummary"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Age"]["type"] == "date"


def test_the_schema_is_structural() -> None:
    for path, node in nodes(openapi_schema()):
        assert not {"$ref", "$defs", "title", "const", "allOf", "oneOf", "not"} & set(node), path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: OpenAPI 3.0 bounds are booleans"


def test_every_default_satisfies_its_own_schema() -> None:
    for path, node in nodes(openapi_schema()):
        if "default" in node:
            jsonschema.Draft4Validator(as_json_schema(node)).validate(node["default"])
            assert path  # the root has no default


def test_metadata_only_restricts_the_name() -> None:
    metadata = openapi_schema()["properties"]["metadata"]
    assert set(metadata["properties"]) == {"name"}
    assert metadata["properties"]["name"]["maxLength"] == 52


def test_the_schema_keeps_the_model_defaults_enums_and_ranges() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["engine"]["properties"]["kind"]["enum"] == ["vllm", "sim"]
    replicas = spec["decode"]["properties"]["replicas"]
    assert (replicas["default"], replicas["minimum"], replicas["maximum"]) == (2, 0, 1000)
    ttft = spec["prefill"]["properties"]["autoscaling"]["properties"]["targetTtftSeconds"]
    assert (ttft["minimum"], ttft["exclusiveMinimum"], ttft["maximum"]) == (0, True, 600)
    assert spec["model"]["required"] == ["name"]
    assert spec["model"]["properties"]["servedName"]["nullable"] is True
    assert spec["kvPool"]["properties"]["redis"]["properties"]["evictionPolicy"]["default"] == "allkeys-lru"
    assert spec["router"]["default"] == {}  # so that the API server fills in the nested defaults


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_is_valid_for_the_crd_and_for_the_model(name: str) -> None:
    for document in yaml.safe_load_all((EXAMPLES / name).read_text()):
        if document.get("kind") == "InferenceGateway":
            continue  # test_gateway_crd.py
        assert schema_errors(document) == []
        parse_inference_service(document)


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("decode", "replicas"), -1, "spec.decode.replicas: -1 is less than the minimum of 0"),
        (("engine", "kind"), "tgi", "spec.engine.kind: 'tgi' is not one of ['vllm', 'sim']"),
        (("kvPool", "chunkSize"), 8, "spec.kvPool.chunkSize: 8 is less than the minimum of 16"),
        (
            ("kvPool", "redis", "evictionPolicy"),
            "lru",
            "spec.kvPool.redis.evictionPolicy: 'lru' is not one of",
        ),
        (("kvPool", "redis", "memory"), "lots", "spec.kvPool.redis.memory: 'lots' does not match"),
        (
            ("router", "fairness", "inputWeight"),
            0,
            "spec.router.fairness.inputWeight: 0 is less than or equal",
        ),
        (("model", "name"), "", "spec.model.name: '' should be non-empty"),
    ],
)
def test_the_schema_rejects_what_the_model_rejects_structurally(
    path: tuple[str, ...], value: Any, error: str
) -> None:
    document = example("gpu-qwen7b.yaml")
    node = document["spec"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    errors = schema_errors(document)
    assert len(errors) == 1 and errors[0].startswith(error), errors
    with pytest.raises(SpecInvalid):
        parse_inference_service(document)


def test_integer_resource_quantities_are_accepted_as_kubernetes_does() -> None:
    document = example("gpu-qwen7b.yaml")
    assert document["spec"]["decode"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert schema_errors(document) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"decode": {"autoscaling": {"min": 9, "max": 4}}},
        {"prefill": {"replicas": 0}, "disaggregation": {"mode": "always"}},
        {"kvPool": {"chunkSize": 100}},
    ],
    ids=["min above max", "always without prefill", "chunk not a block multiple"],
)
def test_cross_field_rules_pass_the_schema_and_are_left_to_the_operator(spec: dict[str, Any]) -> None:
    document = copy.deepcopy(example("local-sim.yaml"))
    for key, value in spec.items():
        document["spec"][key] = document["spec"].get(key, {}) | value
    assert schema_errors(document) == []
    with pytest.raises(SpecInvalid):
        parse_inference_service(document)


def test_the_crd_reference_in_the_docs_is_the_generated_one() -> None:
    document = (ROOT / "docs" / "operator.md").read_text()
    start, end = document.index(BEGIN), document.index(END) + len(END) + 1
    assert document[start:end] == reference_markdown(), (
        "docs/operator.md's CRD reference is stale: run scripts/generate-crd.sh"
    )


def test_the_reference_lists_every_spec_field_with_its_default_and_range() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in reference_markdown().splitlines()[3:-1]}
    assert "spec.decode.replicas" in rows
    assert "`2`" in rows["spec.decode.replicas"] and "≥ 0, ≤ 1000" in rows["spec.decode.replicas"]
    assert "required" in rows["spec.model.name"]
    leaves = [
        path
        for path, node in nodes(openapi_schema()["properties"]["spec"], "spec")
        if "properties" not in node
    ]
    assert all(path.replace("{}", "") in rows for path in leaves if "[]" not in path)
