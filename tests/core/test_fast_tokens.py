"""The fast encoder is used only where it gives Hugging Face's ids: fastokens matches HF on the
tiny-qwen2 tokenizer and a GPT-2-style one over a generated corpus; a fast encoder that disagrees
anywhere the load-time check looks (short texts, the tokenizer's own added tokens, long texts), raises,
or cannot load is refused with the reason, and HF encodes; the gateway's prompt ids are the same with
and without the fast path.

Real: `tokenizers`, `fastokens`, Jinja2; tokenizer files trained by the tests (tests/core/tokenizer_files.py).
Faked: the disagreeing fast encoders, injected through `load_tokenizer(fast=...)`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.core.tokenizer_files import write_byte_level, write_metaspace, write_qwen2

from tandem.core.fast_tokens import PARITY_TEXTS, FastEncoder, FastEncoderError, check_texts, load_fastokens
from tandem.core.modeltokens import PromptEncoder
from tandem.core.tokenizer_files import HFTokenizer, load_tokenizer

WRITERS: dict[str, Callable[[Path], Path]] = {"tiny-qwen2": write_qwen2, "gpt2-byte-level": write_byte_level}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def directory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return WRITERS[request.param](tmp_path_factory.mktemp(request.param))


def hf_encode(directory: Path) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False).ids)


WORDS = ["the", "of", "and", "to", "in", "is", "you", "that", "it", "was", "for", "on", "are", "as", "with",
         "model", "token", "prompt", "cache", "don't", "it's", "naïve", "café", "O'Neil"]  # fmt: skip
PIECES = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>", "<|im_start", "im_end|>", "\n", "\n\n", "\r\n",
    "\t", "   ", "\u00a0", "\u3000", "\u200b", "😀", "👨\u200d👩\u200d👧", "🇫🇷", "👍🏽", "東京", "한국어",
    "مرحبا", "שלום", "e\u0301", "a\u0301\u0302", "123", "3.14", "0x1F", '{"a": [1, null]}', "def f(x):",
    "    return", "=>", "...",
]  # fmt: skip


def generated_texts(seed: int, count: int) -> list[str]:
    """Word soups (words, special-token text, whitespace, unicode pieces, numbers, random code points),
    JSON, and four long documents of about 8,000 tokens each."""
    rng = random.Random(seed)

    def token() -> str:
        r = rng.random()
        if r < 0.5:
            return rng.choice(WORDS)
        if r < 0.85:
            return rng.choice(PIECES)
        if r < 0.92:
            return str(rng.randrange(10 ** rng.randint(1, 12)))
        code = rng.choice([(0x20, 0x7E), (0xA0, 0xD7FF), (0xE000, 0x10FFFF)])
        return chr(rng.randint(*code))

    def soup(n: int) -> str:
        return "".join(token() + rng.choice([" ", " ", "", "\n", "  ", ", "]) for _ in range(n))

    texts = [soup(rng.randint(1, 80)) for _ in range(count)]
    texts += [json.dumps({"k": soup(5), "n": [rng.random(), 7]}, ensure_ascii=False) for _ in range(50)]
    texts += ["\n\n".join(soup(200) for _ in range(30)) for _ in range(4)]
    return texts


def test_fastokens_gives_hugging_faces_ids_over_a_generated_corpus(directory: Path) -> None:
    fast = load_fastokens((directory / "tokenizer.json").read_text(encoding="utf-8"))
    reference = hf_encode(directory)
    texts = generated_texts(seed=1, count=1500)
    differing = [t for t in texts if fast.encode(t) != reference(t)]
    assert differing == []
    assert fast.name.startswith("fastokens ")


def test_the_tokenizer_uses_fastokens_after_the_check(directory: Path) -> None:
    tokenizer = load_tokenizer(directory)
    assert tokenizer.backend.startswith("fastokens ") and "checked against tokenizers" in tokenizer.backend
    assert tokenizer.fast_refused is None


class Disagreeing:
    """HF's ids, except where `wrong` says: there it drops the last id (or raises, with `raises`)."""

    def __init__(self, directory: Path, wrong: Callable[[str], bool], *, raises: bool = False) -> None:
        self._encode = hf_encode(directory)
        self._wrong = wrong
        self._raises = raises
        self.name = "fake 1.0"
        self.calls = 0

    def encode(self, text: str, /) -> list[int]:
        self.calls += 1
        ids = self._encode(text)
        if not self._wrong(text):
            return ids
        if self._raises:
            raise ValueError("fake refuses this text")
        return ids[:-1]


@pytest.mark.parametrize(
    ("wrong", "raises", "reason"),
    [
        (lambda t: "\t" in t, False, "differs"),
        (lambda t: "<|pad|>" in t, False, "differs"),  # an added token of this tokenizer's own
        (lambda t: len(t) > 16 * 1024, False, "differs"),  # long texts only
        (lambda t: "東京" in t, True, "raised ValueError"),
    ],
    ids=["short-texts", "own-added-token", "long-texts", "raises"],
)
def test_a_fast_encoder_that_disagrees_is_refused_and_hugging_face_encodes(
    tmp_path: Path, wrong: Callable[[str], bool], raises: bool, reason: str
) -> None:
    directory = write_qwen2(tmp_path, vocab=600)
    fake = Disagreeing(directory, wrong, raises=raises)
    tokenizer = load_tokenizer(directory, fast=lambda _: fake)
    assert tokenizer.backend.startswith("tokenizers ")
    assert tokenizer.fast_refused is not None and reason in tokenizer.fast_refused
    assert "fake 1.0" in tokenizer.fast_refused
    asked = fake.calls
    text = "a\tb <|pad|> 東京 " * 2000
    assert tokenizer.encode(text) == hf_encode(directory)(text)
    assert fake.calls == asked, "a refused encoder is never asked again"


def test_a_fast_encoder_that_cannot_load_the_tokenizer_is_refused_with_its_reason(tmp_path: Path) -> None:
    """fastokens implements byte-level BPE; a SentencePiece-style tokenizer (Metaspace, NFKC) stays on HF."""
    tokenizer = load_tokenizer(write_metaspace(tmp_path))
    assert tokenizer.backend.startswith("tokenizers ")
    assert tokenizer.fast_refused is not None and "cannot load this tokenizer" in tokenizer.fast_refused

    def missing(_: str) -> FastEncoder:
        raise FastEncoderError("fastokens is not installed")

    assert load_tokenizer(tmp_path, fast=missing).fast_refused == "fastokens is not installed"
    off = load_tokenizer(tmp_path, fast=None)
    assert off.backend.startswith("tokenizers ") and off.fast_refused is None


def test_a_text_the_fast_encoder_raises_on_is_encoded_by_hugging_face(tmp_path: Path) -> None:
    directory = write_qwen2(tmp_path, vocab=600)
    from tokenizers import Tokenizer

    fast = Disagreeing(directory, lambda t: t == "only this one", raises=True)
    tokenizer = HFTokenizer(
        Tokenizer.from_file(str(directory / "tokenizer.json")),
        name="t",
        chat_template=None,
        special_tokens={},
        fast=fast,
    )
    assert tokenizer.encode("only this one") == hf_encode(directory)("only this one")
    assert fast.calls == 1, "the fast encoder was asked first"


class Marked:
    """A fast encoder whose answer no tokenizer gives, to see that it is the one that encoded."""

    name = "marked 1.0"

    def encode(self, text: str, /) -> list[int]:
        return [7, 7, 7]


def test_an_accepted_fast_encoder_is_the_one_that_encodes(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    directory = write_qwen2(tmp_path, vocab=600)
    reference = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer = HFTokenizer(reference, name="t", chat_template=None, special_tokens={}, fast=Marked())
    assert tokenizer.encode("any text at all") == [7, 7, 7]
    assert HFTokenizer(reference, name="t", chat_template=None, special_tokens={}).encode("x") != [7, 7, 7]


def test_the_check_covers_long_texts_and_the_tokenizers_own_added_tokens(directory: Path) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(directory / "tokenizer.json"))
    texts = check_texts(reference, samples=400)
    assert sum(len(t) > 16 * 1024 for t in texts) >= 8
    drawn = texts[len(PARITY_TEXTS) : len(PARITY_TEXTS) + 400]
    added = [str(t.content) for t in reference.get_added_tokens_decoder().values()]
    assert added and all(any(token in t for t in drawn) for token in added), "each added token is drawn"
    assert "" in texts


def prompts(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    system = "\n\n".join(generated_texts(seed, 40))
    bodies: list[dict[str, Any]] = []
    for text in generated_texts(seed + 1, 60):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        bodies.append({"messages": messages})
        bodies.append({"prompt": system + text if rng.random() < 0.5 else text})
    return bodies


def test_the_gateways_prompt_ids_are_the_same_with_and_without_the_fast_path(directory: Path) -> None:
    fast, slow = PromptEncoder(load_tokenizer(directory)), PromptEncoder(load_tokenizer(directory, fast=None))
    assert fast.tokenizer.backend != slow.tokenizer.backend
    assert fast.splits and slow.splits
    for body in prompts(seed=3):
        if "messages" in body:
            assert fast.chat(body["messages"]).ids == slow.chat(body["messages"]).ids
        else:
            assert fast.completion(body["prompt"]).ids == slow.completion(body["prompt"]).ids
