"""The CRD reference of docs/operator.md, generated from the CRD schema (so from the spec model):
one Markdown table row per field with its type, default, allowed values or range, and description.
`tandem crd --reference` prints it; a test keeps the committed document equal to it. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from tandem.operator.crd import CrdKind, openapi_schema

BEGIN = "<!-- BEGIN GENERATED CRD REFERENCE (tandem crd --reference) -->"
END = "<!-- END GENERATED CRD REFERENCE -->"
GATEWAY_BEGIN = "<!-- BEGIN GENERATED GATEWAY REFERENCE (tandem crd --gateway --reference) -->"
GATEWAY_END = "<!-- END GENERATED GATEWAY REFERENCE -->"
#: The markers around each kind's table in docs/operator.md.
MARKERS: dict[CrdKind, tuple[str, str]] = {
    "InferenceService": (BEGIN, END),
    "InferenceGateway": (GATEWAY_BEGIN, GATEWAY_END),
}


def reference_markdown(kind: CrdKind = "InferenceService") -> str:
    """The table of every `spec` field, between the kind's BEGIN and END markers."""
    spec = openapi_schema(kind)["properties"]["spec"]
    begin, end = MARKERS[kind]
    lines = [
        begin,
        "| Field | Type | Default | Allowed | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path, node, required in _fields(spec, "spec"):
        default = "required" if required else _code(node["default"]) if "default" in node else ""
        cells = [f"`{path}`", _type(node), default, _allowed(node), node.get("description", "")]
        lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
    lines.append(end)
    return "\n".join(lines) + "\n"


def _fields(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        sub_path = f"{path}.{name}"
        yield sub_path, sub, name in required
        yield from _fields(sub, sub_path)
        if isinstance(sub.get("items"), Mapping):
            yield from _fields(sub["items"], f"{sub_path}[]")


def _type(node: Mapping[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        kind = "quantity"
    elif node.get("type") == "array":
        kind = f"list of {_type(node['items'])}"
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), Mapping):
        kind = f"map of {_type(node['additionalProperties'])}"
    elif node.get("pattern", "").startswith("^[+]?[0-9]+"):
        kind = "quantity"
    else:
        kind = str(node.get("type", ""))
    return f"{kind} or null" if node.get("nullable") else kind


def _allowed(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return ", ".join(_code(v) for v in node["enum"])
    low = node.get("minimum")
    high = node.get("maximum")
    parts = []
    if low is not None:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {low}")
    if high is not None:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {high}")
    if "minLength" in node:
        parts.append(f"length ≥ {node['minLength']}")
    if "pattern" in node and not _type(node).startswith("quantity"):
        parts.append(f"matches `{node['pattern']}`")
    return ", ".join(parts)


def _code(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
