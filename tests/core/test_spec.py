"""The InferenceService spec model: defaults, structural validation and cross-field rules.

Pure: documents are built in memory; nothing is faked because nothing does I/O.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.core.specrules import SpecInvalid, check_rules, parse_inference_service

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "local-sim.yaml"


def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}},
    }


def with_spec(**sections: Any) -> dict[str, Any]:
    doc = minimal()
    doc["spec"].update(sections)
    return doc


def error_paths(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecInvalid) as caught:
        parse_inference_service(doc)
    return [e.path for e in caught.value.errors]


def test_a_minimal_document_gets_the_documented_defaults() -> None:
    spec = parse_inference_service(minimal()).spec
    assert spec.engine.kind == "vllm"
    assert (spec.prefill.replicas, spec.decode.replicas) == (1, 2)
    assert spec.disaggregation.mode == "auto"
    assert spec.disaggregation.min_uncached_tokens == 512
    assert spec.kv_pool.chunk_size == 256
    assert spec.kv_pool.redis.eviction_policy == "allkeys-lru"
    assert spec.router.fairness.tenant_header == "x-tenant-id"
    assert (spec.router.fairness.input_weight, spec.router.fairness.output_weight) == (1, 2)
    assert spec.model.public_name == "Qwen/Qwen2.5-7B-Instruct"


def test_the_served_name_is_what_clients_send_when_given() -> None:
    doc = minimal()
    doc["spec"]["model"]["servedName"] = "qwen"
    assert parse_inference_service(doc).spec.model.public_name == "qwen"


def test_the_shipped_example_is_valid() -> None:
    isvc = parse_inference_service(yaml.safe_load(EXAMPLE.read_text()))
    assert isvc.spec.engine.kind == "sim"
    assert isvc.metadata.name == "demo"


def test_gpu_quantities_given_as_numbers_are_kept_as_strings() -> None:
    doc = with_spec(decode={"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "32Gi"}}})
    limits = parse_inference_service(doc).spec.decode.resources.limits
    assert limits == {"nvidia.com/gpu": "1", "memory": "32Gi"}


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        pytest.param({"engine": {"kind": "tgi"}}, "spec.engine.kind", id="unknown-engine"),
        pytest.param({"decode": {"replicas": 0}}, "spec.decode.replicas", id="no-decode"),
        pytest.param({"prefill": {"replicas": -1}}, "spec.prefill.replicas", id="negative"),
        pytest.param({"kvPool": {"chunkSize": 8}}, "spec.kvPool.chunkSize", id="tiny-chunk"),
        pytest.param(
            {"kvPool": {"redis": {"evictionPolicy": "lru"}}},
            "spec.kvPool.redis.evictionPolicy",
            id="bad-eviction-policy",
        ),
        pytest.param({"kvPool": {"redis": {"memory": "lots"}}}, "spec.kvPool.redis.memory", id="quantity"),
        pytest.param({"kvPool": {"redis": {"url": "http://x"}}}, "spec.kvPool.redis.url", id="url-scheme"),
        pytest.param({"router": {"scoring": {"prefix": -1}}}, "spec.router.scoring.prefix", id="weight"),
        pytest.param({"router": {"slo": {"ttftSeconds": 0}}}, "spec.router.slo.ttftSeconds", id="slo"),
        pytest.param(
            {"decode": {"autoscaling": {"targetKVUtilization": 1.5}}},
            "spec.decode.autoscaling.targetKVUtilization",
            id="kv-target-above-one",
        ),
        pytest.param({"disaggregation": {"mode": "sometimes"}}, "spec.disaggregation.mode", id="mode"),
        pytest.param({"routr": {}}, "spec.routr", id="unknown-field"),
    ],
)
def test_a_structural_error_names_the_field(sections: dict[str, Any], path: str) -> None:
    assert path in error_paths(with_spec(**sections))


def test_every_structural_error_is_reported_not_only_the_first() -> None:
    paths = error_paths(with_spec(decode={"replicas": -1}, engine={"kind": "tgi"}))
    assert {"spec.decode.replicas", "spec.engine.kind"} <= set(paths)


def test_a_missing_model_is_reported() -> None:
    doc = minimal()
    del doc["spec"]["model"]
    assert error_paths(doc) == ["spec.model"]


def test_a_bad_object_name_is_reported() -> None:
    doc = minimal()
    doc["metadata"]["name"] = "Not_A_DNS_Label"
    assert error_paths(doc) == ["metadata.name"]


@pytest.mark.parametrize(
    ("sections", "path"),
    [
        pytest.param(
            {"decode": {"autoscaling": {"min": 5, "max": 2}}},
            "spec.decode.autoscaling.min",
            id="min-above-max",
        ),
        pytest.param(
            {"prefill": {"replicas": 9, "autoscaling": {"enabled": True, "min": 1, "max": 8}}},
            "spec.prefill.replicas",
            id="replicas-outside-bounds",
        ),
        pytest.param(
            {"prefill": {"replicas": 0}, "disaggregation": {"mode": "always"}},
            "spec.prefill.replicas",
            id="always-without-prefill",
        ),
        pytest.param({"kvPool": {"chunkSize": 250}}, "spec.kvPool.chunkSize", id="chunk-not-block-multiple"),
        pytest.param(
            {"decode": {"autoscaling": {"panicWindowSeconds": 90, "stableWindowSeconds": 60}}},
            "spec.decode.autoscaling.panicWindowSeconds",
            id="panic-window-longer-than-stable",
        ),
        pytest.param(
            {"router": {"auth": {"enabled": True}}}, "spec.router.auth.apiKeysSecret", id="auth-without-keys"
        ),
        pytest.param(
            {"router": {"tenants": [{"name": "a"}, {"name": "a", "weight": 2}]}},
            "spec.router.tenants[1].name",
            id="duplicate-tenant",
        ),
    ],
)
def test_a_cross_field_rule_names_the_field(sections: dict[str, Any], path: str) -> None:
    assert error_paths(with_spec(**sections)) == [path]


def test_autoscaling_behavior_router_limits_and_connector_have_documented_defaults() -> None:
    spec = parse_inference_service(minimal()).spec
    for scaling in (spec.prefill.autoscaling, spec.decode.autoscaling):
        assert (scaling.stable_window_seconds, scaling.panic_window_seconds) == (60.0, 6.0)
        assert (scaling.panic_threshold, scaling.tolerance) == (2.0, 0.1)
        assert scaling.scale_down_delay_seconds == 300.0
        assert scaling.max_scale_up_step is None
    assert spec.kv_pool.connector == "lmcache"
    assert spec.kv_pool.redis.password_secret is None
    assert not spec.router.auth.enabled
    assert spec.router.rate_limits.requests_per_minute is None
    assert spec.router.tenants == []
    assert not spec.router.log_prompts


def test_tenants_limits_and_secrets_parse_from_camel_case() -> None:
    doc = with_spec(
        kvPool={"connector": "tandem", "redis": {"passwordSecret": {"name": "pool", "key": "password"}}},
        router={
            "auth": {"enabled": True, "apiKeysSecret": {"name": "keys", "key": "api-keys.yaml"}},
            "rateLimits": {"requestsPerMinute": 600},
            "tenants": [{"name": "gold", "weight": 4, "rateLimits": {"tokensPerMinute": 1e6}}],
        },
    )
    spec = parse_inference_service(doc).spec
    assert spec.kv_pool.connector == "tandem"
    assert spec.kv_pool.redis.password_secret is not None
    assert spec.kv_pool.redis.password_secret.name == "pool"
    assert spec.router.auth.api_keys_secret is not None
    assert spec.router.auth.api_keys_secret.key == "api-keys.yaml"
    assert spec.router.rate_limits.requests_per_minute == 600
    gold = spec.router.tenants[0]
    assert (gold.name, gold.weight) == ("gold", 4)
    assert gold.rate_limits is not None
    assert gold.rate_limits.tokens_per_minute == 1e6


def test_autoscaled_replicas_outside_bounds_are_fine_when_autoscaling_is_off() -> None:
    doc = with_spec(prefill={"replicas": 9, "autoscaling": {"min": 1, "max": 8}})
    assert check_rules(parse_inference_service(doc).spec) == []


def test_prefill_may_be_empty_when_disaggregation_is_off() -> None:
    doc = with_spec(prefill={"replicas": 0}, disaggregation={"mode": "off"})
    assert parse_inference_service(doc).spec.prefill.replicas == 0


def test_parsing_does_not_modify_the_input_document() -> None:
    doc = with_spec(decode={"replicas": 3})
    before = copy.deepcopy(doc)
    parse_inference_service(doc)
    assert doc == before


def test_spec_models_are_immutable() -> None:
    spec = parse_inference_service(minimal()).spec
    with pytest.raises(ValueError, match="frozen"):
        spec.decode.replicas = 5  # type: ignore[misc]


def test_zero_decode_replicas_need_autoscaling_from_zero() -> None:
    assert "spec.decode.replicas" in error_paths(with_spec(decode={"replicas": 0}))
    scaled = {"replicas": 0, "autoscaling": {"enabled": True, "min": 0, "max": 4}}
    assert parse_inference_service(with_spec(decode=scaled)).spec.decode.replicas == 0
