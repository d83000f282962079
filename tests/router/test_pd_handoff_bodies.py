"""The P/D handoff bodies as tables (pure functions, no servers)."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.kvkeys import lmcache_salt_tag
from tandem.router.pd.handoff import (
    DEFAULT_DECODE_KV_PARAMS,
    PREFILL_KV_PARAMS,
    away_from_layout_body,
    decode_body,
    kv_params_from_prefill,
    lmcache_tagged,
    prefill_body,
)

PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@pytest.mark.parametrize(
    ("client_body", "prefill"),
    [
        pytest.param(
            {"model": "m", "prompt": "p", "max_tokens": 50},
            {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False},
            id="completion",
        ),
        pytest.param(
            {"model": "m", "prompt": "p", "stream": True, "stream_options": {"include_usage": True}},
            {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False},
            id="streaming-completion",
        ),
        pytest.param(
            {"model": "m", "messages": [], "max_completion_tokens": 9, "max_tokens": 9},
            {"model": "m", "messages": [], "max_tokens": 1, "stream": False},
            id="chat-max-completion-tokens",
        ),
        pytest.param(
            {"model": "m", "prompt": "p", "min_tokens": 5, "ignore_eos": True, "seed": 7},
            {"model": "m", "prompt": "p", "ignore_eos": True, "seed": 7, "max_tokens": 1, "stream": False},
            id="min-tokens-dropped-extensions-kept",
        ),
        pytest.param(
            {"model": "m", "prompt": "p", "kv_transfer_params": {"client": "value"}},
            {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False},
            id="client-kv-params-replaced",
        ),
    ],
)
def test_the_prefill_body_asks_for_one_token_without_streaming_and_a_remote_decode(
    client_body: dict[str, Any], prefill: dict[str, Any]
) -> None:
    original = dict(client_body)
    assert prefill_body(client_body) == {**prefill, "kv_transfer_params": PREFILL_PARAMS}
    assert client_body == original  # the client's body is not modified


def test_the_prefill_params_are_vllms_nixl_remote_decode_request() -> None:
    assert dict(PREFILL_KV_PARAMS) == PREFILL_PARAMS


@pytest.mark.parametrize(
    ("prefill_response", "params"),
    [
        pytest.param(
            {"choices": [], "kv_transfer_params": {"remote_engine_id": "e", "remote_block_ids": [1]}},
            {"remote_engine_id": "e", "remote_block_ids": [1]},
            id="nixl-answer",
        ),
        pytest.param({"choices": []}, dict(DEFAULT_DECODE_KV_PARAMS), id="no-params"),
        pytest.param({"kv_transfer_params": None}, dict(DEFAULT_DECODE_KV_PARAMS), id="null-params"),
        pytest.param({"kv_transfer_params": "x"}, dict(DEFAULT_DECODE_KV_PARAMS), id="not-an-object"),
        pytest.param([1, 2], dict(DEFAULT_DECODE_KV_PARAMS), id="not-a-json-object"),
    ],
)
def test_decode_takes_the_prefills_kv_params_or_the_defaults(
    prefill_response: object, params: dict[str, Any]
) -> None:
    assert kv_params_from_prefill(prefill_response) == params


def test_the_default_decode_params_announce_a_remote_prefill() -> None:
    assert DEFAULT_DECODE_KV_PARAMS["do_remote_prefill"] is True
    assert DEFAULT_DECODE_KV_PARAMS["do_remote_decode"] is False


def test_the_decode_body_is_the_original_with_only_the_kv_params_added() -> None:
    client = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 64, "x": [1]}
    assert decode_body(client, {"a": 1}) == {**client, "kv_transfer_params": {"a": 1}}
    assert "kv_transfer_params" not in client


def test_an_lmcache_tag_reaches_the_prefill_and_the_decode_with_their_own_params() -> None:
    body: dict[str, Any] = {"model": "sql", "prompt": "hi", "max_tokens": 8}
    lmcache_tagged(body, adapter="sql")
    assert body["kv_transfer_params"] == {"lmcache.tag.lora": "sql"}
    assert prefill_body(body)["kv_transfer_params"] == {"lmcache.tag.lora": "sql", **PREFILL_PARAMS}
    answer = {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_block_ids": [1]}
    assert decode_body(body, answer)["kv_transfer_params"] == {"lmcache.tag.lora": "sql", **answer}
    # A body without the gateway's tag gets the handoff's params alone.
    untagged = {"model": "qwen", "prompt": "hi", "kv_transfer_params": {"other": 1}}
    assert prefill_body(untagged)["kv_transfer_params"] == PREFILL_PARAMS
    assert decode_body(untagged, answer)["kv_transfer_params"] == answer


def test_a_salted_body_carries_its_salt_as_an_lmcache_tag_after_the_adapters() -> None:
    """LMCache's keys hold no `cache_salt`: a tenant's salt goes as the tag `salt`, after the
    adapter's (the order LMCache appends them in); a body with neither is left untagged."""
    body: dict[str, Any] = {"model": "sql", "prompt": "hi", "cache_salt": "t1-ab"}
    lmcache_tagged(body, adapter="sql", salt="t1-ab")
    tag = lmcache_salt_tag("t1-ab")
    assert list(body["kv_transfer_params"].items()) == [
        ("lmcache.tag.lora", "sql"),
        ("lmcache.tag.salt", tag),
    ]
    assert tag != "t1-ab" and len(tag) == 32, "a one-way hash of the salt, not the salt"
    tenant: dict[str, Any] = {"model": "qwen", "prompt": "hi"}
    lmcache_tagged(tenant, salt="t1-ab")
    assert tenant["kv_transfer_params"] == {"lmcache.tag.salt": tag}
    shared: dict[str, Any] = {"model": "qwen", "prompt": "hi"}
    lmcache_tagged(shared)
    assert "kv_transfer_params" not in shared


def test_decode_only_away_from_a_layout_moves_the_lmcache_salt_tag_with_the_salt() -> None:
    """A decode-only request after a prefill of another KV layout gets a salt of its own so that it
    finds none of the prefill's chunks; for LMCache engines (a tagged body) the tag follows it, since
    their keys hold the salt only as a tag. An untagged body gets no tag."""
    body: dict[str, Any] = {"model": "sql", "prompt": "hi", "cache_salt": "t1-ab"}
    lmcache_tagged(body, adapter="sql", salt="t1-ab")
    away = away_from_layout_body(body, "g2")
    assert away["cache_salt"] != "t1-ab"
    moved = {"lmcache.tag.lora": "sql", "lmcache.tag.salt": lmcache_salt_tag(away["cache_salt"])}
    assert away["kv_transfer_params"] == moved
    assert body["kv_transfer_params"]["lmcache.tag.salt"] == lmcache_salt_tag("t1-ab"), (
        "the body is not changed"
    )
    assert "kv_transfer_params" not in away_from_layout_body({"prompt": "hi", "cache_salt": "t1-ab"}, "g2")
