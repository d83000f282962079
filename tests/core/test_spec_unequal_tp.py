"""Unequal prefill and decode tensor parallelism: refused with LMCache's connector (its keys carry the
world size and worker id), allowed with Tandem's (it stores KV per head on a TP-independent grid)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.specrules import SpecInvalid, check_rules, parse_inference_service


def document(*, connector: str, prefill_tp: int, decode_tp: int, kind: str = "vllm") -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "qwen"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
            "engine": {"kind": kind},
            "kvPool": {"connector": connector},
            "prefill": {"tensorParallel": prefill_tp},
            "decode": {"tensorParallel": decode_tp},
        },
    }


@pytest.mark.parametrize(("prefill_tp", "decode_tp"), [(2, 1), (1, 2), (4, 8)])
def test_lmcache_with_unequal_tp_is_refused_naming_the_field(prefill_tp: int, decode_tp: int) -> None:
    doc = document(connector="lmcache", prefill_tp=prefill_tp, decode_tp=decode_tp)
    with pytest.raises(SpecInvalid) as caught:
        parse_inference_service(doc)
    (error,) = [e for e in caught.value.errors if e.path == "spec.decode.tensorParallel"]
    assert "lmcache" in error.message and "world size" in error.message
    assert "\n" not in error.message


@pytest.mark.parametrize(
    ("connector", "prefill_tp", "decode_tp", "kind"),
    [("tandem", 2, 1, "vllm"), ("tandem", 1, 4, "vllm"), ("lmcache", 2, 2, "vllm"), ("lmcache", 2, 1, "sim")],
)
def test_tandems_connector_equal_tp_and_the_simulator_pass(
    connector: str, prefill_tp: int, decode_tp: int, kind: str
) -> None:
    service = parse_inference_service(
        document(connector=connector, prefill_tp=prefill_tp, decode_tp=decode_tp, kind=kind)
    )
    assert check_rules(service.spec) == []


def test_the_kv_layout_label_ignores_tp_with_tandems_connector_only() -> None:
    """The operator's `tandem.dev/kv-layout` label pairs prefill and decode pods of one generation:
    a pool's TP changes LMCache's keys (the label changes) but not Tandem's (it does not)."""
    from tandem.operator.resources import Images
    from tandem.operator.resources.kvlayout import kv_layout

    images = Images(tandem="ghcr.io/tandem-dev/tandem:test", redis="redis:7.4-alpine")

    def label(connector: str, prefill_tp: int, decode_tp: int) -> str:
        spec = parse_inference_service(
            document(connector=connector, prefill_tp=prefill_tp, decode_tp=decode_tp)
        ).spec
        return kv_layout(spec, images, model="/models/qwen")

    assert label("tandem", 1, 1) == label("tandem", 2, 1) == label("tandem", 1, 4)
    assert label("lmcache", 1, 1) != label("lmcache", 2, 2)
