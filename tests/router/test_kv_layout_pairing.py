"""Pairing prefill and decode engines by KV layout: the rule, the registry's filter, and the P/D
step's choice of a prefill engine.

Real: `kv_compatible`, the `EndpointRegistry`, the `Disaggregator` with its `Prefiller` and
`Dispatcher` sending to fake engines on loopback (`tests.router.fake_engine`) through the whole
gateway. Faked: the engines. The rollout under load with simulated engines and a real KV pool is
tests/router/test_rollout_pd_layout.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.router.harness import MODEL, NIXL_PARAMS, Launcher, metric

from tandem.core.routerconfig import RouterConfig
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.discovery.sources import EndpointFile
from tandem.router.pd.handoff import away_from_layout_body
from tandem.router.types import kv_compatible

A, B, C = "http://127.0.0.1:8101", "http://127.0.0.1:8102", "http://127.0.0.1:8103"


@pytest.mark.parametrize(
    ("prefill", "decode", "pairs"),
    [
        ("g1", "g1", True),
        ("g1", "g2", False),
        (None, "g2", True),
        ("g1", None, True),
        (None, None, True),
    ],
)
def test_engines_pair_when_their_layouts_are_equal_or_one_is_unknown(
    prefill: str | None, decode: str | None, pairs: bool
) -> None:
    assert kv_compatible(prefill, decode) is pairs


def registry() -> EndpointRegistry:
    return EndpointRegistry(failure_threshold=1, cooldown_seconds=10, clock=lambda: 0.0)


def test_candidates_pairing_with_a_layout_are_those_of_that_layout_or_of_none() -> None:
    reg = registry()
    reg.set_pool("prefill", [A, B, C], layouts={A: "g1", B: "g2"})

    def urls(layout: str | None) -> list[str]:
        return [v.endpoint.url for v in reg.candidates("prefill", pairs_with=layout)]

    assert urls("g1") == [A, C]
    assert urls("g2") == [B, C]
    assert urls(None) == [A, B, C]
    reg.record_failure(reg.endpoints("prefill")[0])  # out of rotation: never a candidate
    assert urls("g1") == [C]


def test_an_engine_listed_again_with_another_layout_takes_it_and_keeps_its_state() -> None:
    reg = registry()
    reg.set_pool("decode", [A], layouts={A: "g1"})
    endpoint = reg.endpoints("decode")[0]
    reg.begin(endpoint)
    reg.set_pool("decode", [A], layouts={A: "g2"})
    assert reg.endpoints("decode")[0].layout == "g2"
    view = reg.snapshots("decode")[0]
    assert (view.endpoint.layout, view.in_flight) == ("g2", 1)
    reg.set_pool("decode", [A])
    assert reg.endpoints("decode")[0].layout is None


def config_for(path: Path) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "service": "pairing",
            "spec": {"model": {"name": "m", "servedName": MODEL}, "disaggregation": {"mode": "always"}},
            "discovery": {"kind": "file", "path": str(path), "pollSeconds": 0.02},
        }
    )


async def test_a_decode_engine_without_a_prefill_engine_of_its_layout_goes_decode_only(
    launcher: Launcher, tmp_path: Path
) -> None:
    old = await launcher.engine("p-old", kv_transfer_params=NIXL_PARAMS)
    new = await launcher.engine("d-new")
    path = Path(str(tmp_path)) / "endpoints.json"
    path.write_text(
        EndpointFile(
            prefill=[old.url], decode=[new.url], layouts={old.url: "g1", new.url: "g2"}
        ).model_dump_json()
    )
    router = await launcher.router_for(config_for(path))
    answer = await router.http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert answer.status_code == 200
    assert answer.headers["x-tandem-pd-fallback"] == "layout_mismatch"
    assert old.received == []  # never prefilled on the other generation
    assert "kv_transfer_params" not in new.received[0].body
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="layout_mismatch") == 1


async def test_a_prefilled_request_whose_layout_left_the_decode_pool_decodes_alone_under_another_salt(
    launcher: Launcher, tmp_path: Path
) -> None:
    """The last old decode engine leaves while an old prefill runs: the decode request goes to a new
    engine without `kv_transfer_params` and under a salt where the old prefill's chunks are not."""
    prefill = await launcher.engine("p-old", kv_transfer_params=NIXL_PARAMS, answer_delay=1.0)
    old, new = await launcher.engine("d-old"), await launcher.engine("d-new")
    path = tmp_path / "endpoints.json"
    layouts = {prefill.url: "g1", old.url: "g1", new.url: "g2"}
    path.write_text(EndpointFile(prefill=[prefill.url], decode=[old.url], layouts=layouts).model_dump_json())
    router = await launcher.router_for(config_for(path))
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    request = asyncio.create_task(router.http.post("/v1/completions", json=body))
    for _ in range(1000):
        if prefill.received:
            break
        await asyncio.sleep(0.01)
    path.write_text(EndpointFile(prefill=[prefill.url], decode=[new.url], layouts=layouts).model_dump_json())
    answer = await request
    assert answer.status_code == 200
    assert answer.headers["x-tandem-pd-fallback"] == "layout_mismatch"
    assert old.received == []
    sent = new.received[0].body
    assert "kv_transfer_params" not in sent
    prefilled = prefill.received[0].body
    assert (
        sent["cache_salt"]
        == away_from_layout_body(prefilled, "g1")["cache_salt"]
        != prefilled.get("cache_salt")
    )
    assert await metric(router, "tandem_router_pd_fallbacks_total", reason="layout_mismatch") == 1


def test_the_salt_away_from_a_layout_depends_on_the_clients_salt_and_the_layout_only() -> None:
    plain = away_from_layout_body({"prompt": "x"}, "g1")
    assert plain["prompt"] == "x" and plain["cache_salt"].startswith("kv-layout-")
    assert away_from_layout_body({"prompt": "y"}, "g1")["cache_salt"] == plain["cache_salt"]
    assert away_from_layout_body({}, "g2")["cache_salt"] != plain["cache_salt"]
    assert away_from_layout_body({"cache_salt": "t1"}, "g1")["cache_salt"] != plain["cache_salt"]
