"""The deterministic tokenizer and chat template (`tandem.core.tokenizer`).

Pure: strings in, ids out; nothing is faked because nothing does I/O.
"""

from __future__ import annotations

import random
import string

import pytest

from tandem.core.tokenizer import (
    EOS_TOKEN_ID,
    MAX_TOKEN_BYTES,
    VOCAB_SIZE,
    TokenizerError,
    decode,
    encode,
    message_text,
    render_chat,
    token_bytes,
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Hello, world!", id="ascii"),
        pytest.param("The year 2024 had 366 days.", id="digits"),
        pytest.param("héllo wörld, 世界 🎉 — ok", id="unicode"),
        pytest.param("  leading\n\ttabs\r\n  and   trailing  ", id="whitespace"),
        pytest.param("snake_case_name __dunder__", id="underscores"),
        pytest.param("", id="empty"),
    ],
)
def test_decoding_the_encoding_gives_back_the_text(text: str) -> None:
    assert decode(encode(text)) == text


def test_the_documented_example_is_three_tokens() -> None:
    ids = encode("Hi there")
    assert [token_bytes(i) for i in ids] == [b"Hi", b" the", b"re"]


@pytest.mark.parametrize("text", ["a", " the", "世", "🎉", "supercalifragilistic"])
def test_every_token_stands_for_at_most_four_bytes(text: str) -> None:
    assert all(1 <= len(token_bytes(i)) <= MAX_TOKEN_BYTES for i in encode(text))


def test_empty_text_has_no_tokens() -> None:
    assert encode("") == []
    assert decode([]) == ""


@pytest.mark.parametrize(
    "bad_id",
    [
        pytest.param(0, id="zero"),
        pytest.param(-5, id="negative"),
        pytest.param(VOCAB_SIZE, id="vocab-size"),
        pytest.param(257, id="zero-digit"),
    ],
)
def test_ids_that_no_text_encodes_to_are_rejected(bad_id: int) -> None:
    with pytest.raises(TokenizerError):
        decode([bad_id])


def test_no_text_encodes_to_the_end_of_sequence_id() -> None:
    text = "".join(chr(c) for c in range(32, 0x3000, 7))
    assert EOS_TOKEN_ID not in encode(text)
    assert token_bytes(EOS_TOKEN_ID) == b"\xff"


def test_the_chat_template_is_chatml_with_a_generation_prompt() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_chat(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_chat_template_can_leave_out_the_generation_prompt() -> None:
    rendered = render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("plain", "plain"),
        (None, ""),
        (
            [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {}},
                {"type": "text", "text": "b"},
            ],
            "ab",
        ),
    ],
)
def test_message_content_is_a_string_or_the_text_parts(content: object, text: str) -> None:
    assert message_text(content) == text


def _ascii_texts() -> list[str]:
    """Every ASCII character alone and in seven contexts, then 3,000 seeded random strings."""
    texts = [
        ctx
        for c in map(chr, range(128))
        for ctx in (c, f"a{c}b", f" {c} ", c * 3, f"1{c}", f"{c} x", f"  {c}\n", f"_{c}_")
    ]
    rng = random.Random(7)
    alphabet = string.printable + "\x00\x01\x1c\x1d\x1e\x1f\x7f"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    return texts


def test_ascii_text_is_cut_into_the_pieces_the_unicode_rules_give() -> None:
    # ASCII text takes a faster pattern; a leading "€" (one piece of its own, never joined to what
    # follows) sends the same text down the Unicode pattern for comparison.
    (euro,) = encode("€")
    for text in _ascii_texts():
        unicode_ids = encode("€" + text)
        assert unicode_ids[0] == euro
        assert encode(text) == unicode_ids[1:], repr(text)
