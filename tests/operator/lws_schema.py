"""LeaderWorkerSet's own schema (the LWS v0.9.0 CRD's openAPIV3Schema, vendored in `schemas/`) as a
validator of rendered LeaderWorkerSets, closed to unknown fields wherever the API server's strict
field validation would refuse them (kubernetes-validate knows only built-in kinds)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]

LWS_SCHEMA = Path(__file__).resolve().parent / "schemas" / "leaderworkerset-v1.json"


def closed(node: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties and
    keeps no unknown fields."""
    if isinstance(node, dict):
        out = {k: closed(v) for k, v in node.items()}
        open_ended = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in node and not open_ended:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [closed(v) for v in node]
    return node


@cache
def lws_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(LWS_SCHEMA.read_text())["openAPIV3Schema"]
    return jsonschema.Draft7Validator(closed(schema))


def lws_errors(manifest: dict[str, Any]) -> list[str]:
    """Every schema error of a LeaderWorkerSet manifest, as `path: message`."""
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in lws_validator().iter_errors(manifest)]


def pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's pod templates as built-in `PodTemplate` objects, for kubernetes-validate."""
    group = manifest["spec"]["leaderWorkerTemplate"]
    return [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": group[name]}
        for name in ("leaderTemplate", "workerTemplate")
    ]
