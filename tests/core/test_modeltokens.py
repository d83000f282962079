"""The model's own prompt tokens: the segment-memoised encoder gives exactly what one whole encode
gives, for Tandem's tokenizer (checked against the simulator's own request preparation) and for Hugging
Face tokenizers built here; prefix-memoised block keys equal a fresh hash; loading errors name the file.

Real: `tokenizers`, Jinja2, the simulator's `prepare`. Nothing is faked; tokenizer files are trained
by the tests (tests/core/tokenizer_files.py).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core.tokenizer_files import write_byte_level, write_metaspace

from tandem.core.blockhash import block_keys
from tandem.core.modeltokens import (
    ChatTemplateError,
    ModelTokenizer,
    PromptEncoder,
    SeenTwice,
    TandemTokenizer,
)
from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest
from tandem.core.tokenizer_files import HFTokenizer, TokenizerFilesError, load_tokenizer
from tandem.sim.protocol import prepare

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief.\n\nAnswer in English."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
    ],
}


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    return load_tokenizer(write_byte_level(tmp_path_factory.mktemp("byte-level")))


@pytest.fixture(scope="module")
def metaspace(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    return load_tokenizer(write_metaspace(tmp_path_factory.mktemp("metaspace")))


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": "Once upon a time, in a land far away"},
        {"model": "m", "prompt": ["only one prompt"]},
        {"model": "m", "prompt": [101, 202, 303]},
        {"model": "m", "prompt": "A system prompt.\n\nQuestion: why?\n\n\nAnswer:  "},
        CHAT,
    ],
    ids=["text", "list-of-one", "token-ids", "paragraphs", "chat"],
)
def test_tandem_prompt_tokens_are_what_the_simulator_computes(body: dict[str, Any]) -> None:
    encoder = PromptEncoder(TandemTokenizer())
    if "messages" in body:
        chat = ChatCompletionRequest.model_validate(body)
        ids = encoder.chat([m.model_dump() for m in chat.messages]).ids
        expected = prepare(chat, served_model="m", max_model_len=4096).prompt_token_ids
    else:
        completion = CompletionRequest.model_validate(body)
        ids = encoder.completion(body["prompt"]).ids
        expected = prepare(completion, served_model="m", max_model_len=4096).prompt_token_ids
    assert ids == expected


def test_several_prompt_strings_are_counted_together() -> None:
    assert len(PromptEncoder(TandemTokenizer()).completion(["a b", "c"]).ids) == 3


def test_byte_level_and_tandem_tokenizers_pass_the_self_test_and_metaspace_does_not(
    byte_level: HFTokenizer, metaspace: HFTokenizer
) -> None:
    assert PromptEncoder(TandemTokenizer()).splits
    assert PromptEncoder(byte_level).splits
    assert not PromptEncoder(metaspace).splits  # every text gets a ▁ prepended: cutting would change ids


_PIECES = st.sampled_from([*"ab Zé東 \n\n\n\t.,:'!?0123-_", "<|im_start|>", "<|im_end|>", "\r\n", "Word"])
_TEXT = st.lists(_PIECES, max_size=60).map("".join)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(_TEXT, min_size=1, max_size=4))
def test_segmented_encoding_equals_one_whole_encode_for_every_tokenizer(
    texts: list[str], byte_level: HFTokenizer, metaspace: HFTokenizer
) -> None:
    tokenizer: ModelTokenizer
    for tokenizer in (TandemTokenizer(), byte_level, metaspace):
        for least in (0, 7):  # every paragraph cut, and paragraphs taken together
            encoder = PromptEncoder(tokenizer, segment_min_chars=least)
            for text in texts:  # later texts hit the memo of earlier ones' segments
                assert list(encoder.text(text).ids) == tokenizer.encode(text), (tokenizer.name, least, text)


def test_paragraphs_are_taken_together_up_to_the_least_size_and_markers_always_cut(
    byte_level: HFTokenizer,
) -> None:
    encoder = PromptEncoder(byte_level, segment_min_chars=100)
    paragraphs = [f"Paragraph {i} is about {'x' * (i % 5 * 9)} caching." for i in range(40)]
    prompt = "<|im_start|>system\n" + "\n\n".join(paragraphs) + "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    segments = encoder.segments(prompt)
    assert "".join(text for text, _ in segments) == prompt
    markers = ("<|im_start|>", "<|im_end|>")
    for (text, goes_on), (following, _) in itertools.pairwise(segments):
        if goes_on:  # a paragraph cut: only once the segment holds 100 characters
            assert len(text) >= 100 and text.endswith("\n\n") and following[0].isalpha()
        else:
            assert following.startswith(markers)
    assert sum(goes_on for _, goes_on in segments) >= 5, "the 40 paragraphs were cut somewhere"
    assert sum(text.startswith(markers) for text, _ in segments) == 4, "every marker starts a segment"
    changed_at = prompt.index("Paragraph 30 is")
    changed = encoder.segments(prompt.replace("Paragraph 30 is", "Paragraph thirty is"))
    before, end = [], 0
    for segment in segments:
        end += len(segment[0])
        if end > changed_at:
            break
        before.append(segment)
    assert len(before) >= 3 and changed[: len(before)] == before, "a shared beginning is cut the same"
    assert list(encoder.text(prompt).ids) == byte_level.encode(prompt)
    with pytest.raises(ValueError, match="segment_min_chars"):
        PromptEncoder(byte_level, segment_min_chars=-1)


def test_a_shared_system_prompt_is_tokenized_twice_then_served_from_the_memo(byte_level: HFTokenizer) -> None:
    """The memo admits a segment on its second sighting (the doorkeeper remembers the first)."""
    encoder = PromptEncoder(byte_level)
    system = "\n\n".join(f"Rule {i}: answer politely and briefly." for i in range(30))
    calls: list[str] = []
    real = byte_level.encode

    def counting(text: str, /) -> list[int]:
        calls.append(text)
        return real(text)

    def chat(question: str) -> tuple[tuple[int, ...], int]:
        calls.clear()
        byte_level.encode = counting  # type: ignore[method-assign]
        try:
            encoded = encoder.chat(
                [{"role": "system", "content": system}, {"role": "user", "content": question}]
            )
        finally:
            del byte_level.encode
        return encoded.ids, sum(len(c) for c in calls)

    first, first_chars = chat("Hi?")
    _, second_chars = chat("How?")
    third, third_chars = chat("Why?")
    assert first_chars > len(system) and second_chars > len(system), "seen once, then twice: encoded"
    assert third_chars < 60, "the third time only the new question's segment was encoded"
    rendered = byte_level.render_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
    )
    assert list(third) == byte_level.encode(rendered)
    assert first[:100] == third[:100]


def test_text_seen_once_takes_no_room_in_the_memos() -> None:
    """A thousand different questions after one system prompt: the memos hold the system prompt's
    pieces, not the questions (each question costs a bit in the doorkeeper)."""
    encoder = PromptEncoder(TandemTokenizer())
    system = "\n\n".join(f"Paragraph {i} says something about caching." for i in range(20))
    for i in range(1000):
        question = f"Question number {i}: what about item {i * 7919}?"
        encoded = encoder.chat([{"role": "system", "content": system}, {"role": "user", "content": question}])
        assert encoder.block_keys(encoded, 16) == tuple(block_keys(encoded.ids, 16))
    assert len(encoder._segments) < 40 and len(encoder._keys) < 40


def test_the_doorkeeper_says_again_on_a_second_sighting_and_forgets_when_half_full() -> None:
    seen = SeenTwice(slots=64)
    assert [seen.again(7), seen.again(7), seen.again(8), seen.again(7 + 64)] == [False, True, False, True]
    for h in range(100, 131):  # 32 of 64 slots set: the next new one clears it first
        seen.again(h)
    assert seen.again(7) is False, "cleared when half full: old sightings are forgotten"
    with pytest.raises(ValueError, match="power of two"):
        SeenTwice(slots=100)


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
def test_prefix_memoised_block_keys_equal_a_fresh_hash(block_size: int) -> None:
    encoder = PromptEncoder(TandemTokenizer())
    system = "\n\n".join(f"Paragraph {i} says something about caching." for i in range(20))
    for question in ("What is cached?", "And what is not?", "What is cached?"):
        encoded = encoder.chat([{"role": "system", "content": system}, {"role": "user", "content": question}])
        assert encoder.block_keys(encoded, block_size) == tuple(block_keys(encoded.ids, block_size))


def test_the_chat_template_joins_text_parts_with_newlines_as_vllm_does(byte_level: HFTokenizer) -> None:
    rendered = byte_level.render_chat(CHAT["messages"])
    assert rendered == (
        "<|im_start|>system\nBe brief.\n\nAnswer in English.<|im_end|>\n"
        "<|im_start|>user\nHello \nthere<|im_end|>\n<|im_start|>assistant\n"
    )
    assert byte_level.markers_split and "<|im_start|>" in byte_level.markers


def test_missing_tokenizer_files_are_an_error_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(TokenizerFilesError, match=f"no tokenizer.json in {tmp_path}"):
        load_tokenizer(tmp_path)


def test_a_malformed_tokenizer_file_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerFilesError, match=r"tokenizer\.json: cannot load"):
        load_tokenizer(tmp_path)


def test_a_chat_without_a_usable_template_is_counted_from_its_texts(tmp_path: Path) -> None:
    """No template, or one that refuses the messages: the tokenizer says so by name, and the encoder
    estimates from the message texts (the engine, not the gateway, refuses such a chat)."""
    write_byte_level(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({}), encoding="utf-8")
    tokenizer = load_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tokenizer.render_chat(messages)
    encoder = PromptEncoder(tokenizer)
    assert encoder.chat(messages).ids == tuple(tokenizer.encode("be brief\nhi there"))
    assert encoder.template_failures == 1
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": strict}), encoding="utf-8")
    refusing = load_tokenizer(tmp_path)
    with pytest.raises(ChatTemplateError, match="user first"):
        refusing.render_chat(messages)
    assert PromptEncoder(refusing).chat(messages).ids == tuple(refusing.encode("be brief\nhi there"))


def test_a_template_saved_beside_the_config_is_the_chat_template(tmp_path: Path) -> None:
    """transformers (since 4.43) saves the template as chat_template.jinja, not in the config."""
    write_byte_level(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), encoding="utf-8")
    template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    messages = [{"role": "user", "content": "hi"}]
    assert load_tokenizer(tmp_path).render_chat(messages) == "[user]hi"
    inline = "{{ messages[0]['content'] }}!"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": inline}), encoding="utf-8")
    assert load_tokenizer(tmp_path).render_chat(messages) == "hi!"  # the config's own wins


@pytest.mark.parametrize("name", ["byte_level", "metaspace"])
def test_no_token_covers_more_characters_than_max_token_chars(
    name: str, request: pytest.FixtureRequest
) -> None:
    """The bound the gateway refuses over-long prompts by, unread (`request.context_limit`)."""
    tokenizer: HFTokenizer = request.getfixturevalue(name)
    text = "The gateway refuses a prompt longer than the model's context, internationally and quickly. " * 20
    ids = tokenizer.encode(text)
    assert len(ids) >= len(text) // tokenizer.max_token_chars
    widest = max(len(tokenizer._tokenizer.decode([i])) for i in set(ids))
    assert widest <= tokenizer.max_token_chars
    assert TandemTokenizer.max_token_chars == 4


def test_memoised_block_keys_of_two_roots_never_mix() -> None:
    encoder = PromptEncoder(TandemTokenizer())
    encoded = encoder.text("shared system prompt " * 40)
    for _ in range(3):  # memoised after the second sighting
        a = encoder.block_keys(encoded, 16, root=1)
        b = encoder.block_keys(encoded, 16)
    assert (
        a != b
        and a == tuple(block_keys(encoded.ids, 16, parent=1))
        and b == tuple(block_keys(encoded.ids, 16))
    )
