"""InferenceService specs the operator tests share: the examples shipped in deploy/examples and
variants that exercise every branch of the builders."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tandem.core.spec import InferenceServiceSpec
from tandem.core.specrules import parse_inference_service
from tandem.operator.resources import Images, Owner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
OWNER = Owner(name="demo", namespace="ns1", uid="0b8e4c6e-8f7c-4f5e-9d7e-3c2f5b0a9d11")
IMAGES = Images(tandem="ghcr.io/tandem-dev/tandem:test", redis="redis:7.4-alpine")


def example(name: str) -> dict[str, Any]:
    """An example document from deploy/examples (the first one in the file)."""
    document = yaml.safe_load((EXAMPLES / name).read_text())
    assert isinstance(document, dict)
    return document


def spec_of(document: dict[str, Any], **overrides: Any) -> InferenceServiceSpec:
    """The parsed spec of a document, with top-level spec sections replaced by `overrides`."""
    document = copy.deepcopy(document)
    document.setdefault("metadata", {}).setdefault("namespace", OWNER.namespace)
    document["spec"] |= overrides
    return parse_inference_service(document).spec


def gpu(**overrides: Any) -> InferenceServiceSpec:
    return spec_of(example("gpu-qwen7b.yaml"), **overrides)


def sim(**overrides: Any) -> InferenceServiceSpec:
    return spec_of(example("local-sim.yaml"), **overrides)


#: Specs covering every builder branch, by name (used for schema validation of all outputs).
VARIANTS: dict[str, InferenceServiceSpec] = {
    "gpu example": gpu(),
    "cpu demo": sim(),
    "external redis": gpu(kvPool={"redis": {"url": "redis://cache.example:6379"}}),
    "uri source, tp 2, autoscaling": gpu(
        model={"name": "Qwen/Qwen2.5-7B-Instruct", "source": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"}},
        prefill={"replicas": 0, "tensorParallel": 2, "autoscaling": {"enabled": True, "min": 0, "max": 4}},
        decode={"replicas": 2, "tensorParallel": 2, "autoscaling": {"enabled": True, "max": 8}},
        disaggregation={"mode": "auto"},
    ),
    "tandem connector, redis password": gpu(
        kvPool={"connector": "tandem", "redis": {"passwordSecret": {"name": "kv-auth", "key": "password"}}}
    ),
    "lmcache, external redis, password": gpu(
        kvPool={
            "redis": {"url": "redis://cache.example:6379/2", "passwordSecret": {"name": "kv", "key": "pw"}}
        }
    ),
    "cpu demo, redis password": sim(
        kvPool={"redis": {"memory": "1Gi", "passwordSecret": {"name": "kv-auth", "key": "password"}}}
    ),
    "tokenizer from a configmap, 2 workers": gpu(
        model={"name": "Qwen/Qwen2.5-7B-Instruct", "tokenizer": {"configMap": "qwen-tokenizer"}},
        router={"workers": 2},
    ),
    "precise prefix state from kv events": gpu(router={"prefixSource": "precise"}),
    "precise prefix state, simulated engines": sim(router={"prefixSource": "precise"}),
    "lora: pvc adapters, a catalog, a shared cache": gpu(
        engine={"lora": {"maxLoras": 4, "maxRank": 64, "maxCpuLoras": 8}},
        adapters=[
            {"name": "sql", "source": "pvc://loras/sql/v2"},
            {"name": "chat-fr", "source": "pvc://loras/chat-fr"},
            {"name": "legal", "source": "pvc://legal-loras"},
            {"name": "hub", "source": "hf://org/hub-lora"},
        ],
        adapterCatalog={"source": "pvc://catalog/adapters"},
        adapterCache={"pvc": "adapter-cache"},
    ),
    "lora on simulated engines": sim(
        engine={"kind": "sim", "lora": {}}, adapters=[{"name": "sql", "source": "pvc://loras/sql"}]
    ),
    "api keys, tenants, rate limits": gpu(
        router={
            "auth": {"enabled": True, "apiKeysSecret": {"name": "gateway-keys", "key": "keys.yaml"}},
            "rateLimits": {"requestsPerMinute": 600},
            "tenants": [{"name": "gold", "weight": 4}],
        }
    ),
}
