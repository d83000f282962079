"""Tokenizer files built by the tests themselves (nothing is downloaded): byte-level BPEs in the
style of GPT-2 and of Qwen2 and a SentencePiece-style one (Metaspace), each trained in a fraction of a second
on a few standard-library modules, written as `tokenizer.json` plus a `tokenizer_config.json` with a
ChatML template."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("a*.py"))[:12]]


def write_byte_level(directory: Path, *, vocab: int = 2000) -> Path:
    """A byte-level BPE (GPT-2 regex), ChatML specials and template, into `directory`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return _write(directory, tokenizer)


def write_qwen2(directory: Path, *, vocab: int = 4096, full_corpus: bool = False) -> Path:
    """The tokenizer of `tandem dev tiny-model` (.tandem/models/tiny-qwen2, `train_tokenizer`),
    trained on the few modules the other tokenizers here are, or with `full_corpus` on tiny-model's
    own 400 (seconds, not a fraction)."""
    from tandem.local.tiny_model import corpus_files, train_tokenizer

    corpus = _corpus()
    if full_corpus:
        corpus = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    return _write(directory, train_tokenizer(corpus, vocab=vocab))


def write_metaspace(directory: Path, *, vocab: int = 1000) -> Path:
    """A SentencePiece-style BPE (spaces as ▁, a ▁ prepended to every text)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", *SPECIALS], show_progress=False)
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return _write(directory, tokenizer)


def _write(directory: Path, tokenizer: Tokenizer) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
