"""The names of a gateway in front of many services, and the answer's `model` rewritten to the alias.

Pure: `tandem.router.request.names` (smooth weighted round robin, resolution, LoRA adapters) and
`tandem.router.upstream.rename` (bytes in, bytes out). Nothing is faked.
"""

from __future__ import annotations

import json

import pytest

from tandem.router.errors import ModelNotFound
from tandem.router.request.names import ModelNames, SmoothWeighted
from tandem.router.upstream.rename import ModelRename


@pytest.mark.parametrize(
    ("weights", "sequence"),
    [
        ({"a": 5, "b": 1, "c": 1}, "aabacaa"),  # the module docstring's worked example
        ({"a": 1, "b": 1}, "abab"),
        ({"a": 3, "b": 0}, "aaa"),
        ({"a": 1, "b": 2}, "bab"),
    ],
)
def test_smooth_weighted_round_robin_picks_in_nginxs_order(weights: dict[str, int], sequence: str) -> None:
    split = SmoothWeighted(list(weights.items()))
    assert "".join(split.pick() for _ in sequence) == sequence


@pytest.mark.parametrize(("first", "second"), [(90, 10), (80, 20), (1, 999), (7, 3)])
def test_every_window_of_total_picks_is_exact(first: int, second: int) -> None:
    split = SmoothWeighted([("a", first), ("b", second)])
    total = first + second
    picks = [split.pick() for _ in range(3 * total)]
    for start in (0, total, 2 * total):
        assert picks[start : start + total].count("a") == first


def test_a_served_name_goes_to_its_service_and_an_alias_to_its_split() -> None:
    names = ModelNames({"qwen": "svc-q", "llama": "svc-l"}, {"chat": [("qwen", 1), ("llama", 1)]})
    assert names.resolve("qwen").service == "svc-q" and names.resolve("qwen").alias is None
    picked = [names.resolve("chat") for _ in range(4)]
    assert [p.service for p in picked] == ["svc-q", "svc-l", "svc-q", "svc-l"]
    assert {p.alias for p in picked} == {"chat"}
    assert names.names == {"qwen", "llama", "chat"}


def test_any_other_name_is_vllms_404() -> None:
    names = ModelNames({"qwen": 1}, {})
    with pytest.raises(ModelNotFound, match=r"The model `Qwen` does not exist\."):
        names.resolve("Qwen")


def test_an_alias_over_a_name_nobody_serves_is_refused() -> None:
    with pytest.raises(ValueError, match="not served"):
        ModelNames({"qwen": 1}, {"chat": [("mistral", 1)]})


CHUNK = b'data: {"id":"x","model":"qwen-v2","choices":[{"text":"the \\"model\\":\\"qwen-v2\\" is"}]}\n\n'


def test_the_model_member_is_renamed_and_the_same_words_in_text_are_not() -> None:
    renamed = ModelRename(target="qwen-v2", alias="chat")(CHUNK)
    document = json.loads(renamed[6:])
    assert document["model"] == "chat"
    assert document["choices"][0]["text"] == 'the "model":"qwen-v2" is'


def test_both_spellings_are_renamed() -> None:
    rename = ModelRename(target="qwen-v2", alias="chat")
    assert rename(b'{"model": "qwen-v2"}') == b'{"model": "chat"}'
    assert rename(b'{"model":"qwen-v2x"}') == b'{"model":"qwen-v2x"}'  # another name


@pytest.mark.parametrize("cut", range(1, len(CHUNK)))
def test_a_token_split_between_two_reads_is_renamed(cut: int) -> None:
    rename = ModelRename(target="qwen-v2", alias="chat")
    relayed = rename.stream(CHUNK[:cut]) + rename.stream(CHUNK[cut:] + CHUNK) + rename.flush()
    assert relayed == ModelRename(target="qwen-v2", alias="chat")(CHUNK + CHUNK)


def test_a_stream_without_a_final_newline_is_flushed_at_its_end() -> None:
    rename = ModelRename(target="qwen-v2", alias="chat")
    assert rename.stream(b'data: {"model":"qwen-v2"}') == b""
    assert rename.flush() == b'data: {"model":"chat"}'


def test_an_adapter_goes_to_its_models_service_and_says_it_is_an_adapter() -> None:
    names = ModelNames({"qwen": "svc-q", "llama": "svc-l"}, {"chat": [("llama", 1)]}, {"sql": "qwen"})
    sql = names.resolve("sql")
    assert (sql.service, sql.alias, sql.adapter) == ("svc-q", None, "sql")
    assert names.resolve("qwen").adapter is None and names.resolve("chat").adapter is None
    assert names.names == {"qwen", "llama", "chat", "sql"}


@pytest.mark.parametrize(
    ("adapters", "words"),
    [
        pytest.param({"llama": "qwen"}, "is a served name or an alias", id="named-like-a-model"),
        pytest.param({"chat": "qwen"}, "is a served name or an alias", id="named-like-an-alias"),
        pytest.param({"sql": "mistral"}, "belongs to a name not served: mistral", id="unknown-model"),
    ],
)
def test_an_adapter_that_clashes_or_has_no_model_is_refused(adapters: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ModelNames({"qwen": 1, "llama": 2}, {"chat": [("qwen", 1)]}, adapters)
