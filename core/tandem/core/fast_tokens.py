"""An exact fast path for a model's `tokenizer.json`: `fastokens` where it gives Hugging Face's ids.

Hugging Face `tokenizers` is the reference: it is what vLLM tokenizes with, so its ids are the ones the
engines hash into their KV blocks. It is also slow for text the gateway has not seen before (about
17 ms for 8,000 tokens of a 32,000-token byte-level BPE on a 2-core machine; the segment memo of
`tandem.core.modeltokens` covers text seen twice). `fastokens` (Crusoe, Apache-2.0) reads the same
`tokenizer.json` and encodes the same text in about 0.4 ms. It implements BPE with byte-level
pre-tokenizers (GPT-2, Llama 3, Qwen2 and the like); it refused to load the SentencePiece-style ones
tried (Metaspace, NFKC). docs/router-performance.md has the evaluation.

It is used only when it proves itself on this tokenizer, at load time: `fast_path` builds it from the
text of the `tokenizer.json` HF loaded (one read, so both see the same bytes, and nothing else of the
model's directory) and encodes `check_texts(reference)` with both: the
fixed `PARITY_TEXTS` (whitespace runs, special-token text, digits, CJK, emoji sequences, combining
marks, right-to-left text, code, JSON) plus texts drawn from the tokenizer's own vocabulary and added
tokens, and long texts whose runs of letters, spaces, digits and newlines cross 8 KiB boundaries (where
fastokens cuts a long input to scan it on several threads, on the gateway's own cores). Any id that
differs, or any error, refuses it; `FastPath.refused` says why, and the caller keeps HF.

Once in use, a text the fast encoder raises on (invalid input) is handed to HF, which gives its own
answer or error: the fast path never changes what a text tokenizes to, or how it fails.

Pure apart from `load_fastokens` (it imports fastokens and sets its thread count); the loader is
injected, so tests hand in encoders that disagree.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol


class FastEncoder(Protocol):
    """A tokenizer's `encode` as the gateway calls HF's: text → ids, special-token text split out as its
    id, nothing added around it. `name` says which library and version."""

    @property
    def name(self) -> str: ...

    def encode(self, text: str, /) -> list[int]: ...


class FastEncoderError(Exception):
    """The fast encoder cannot be built for this tokenizer (not installed, or an unsupported part)."""


#: Builds a fast encoder from the text of a `tokenizer.json`; raises `FastEncoderError`.
FastLoader = Callable[[str], FastEncoder]


@dataclass(frozen=True, slots=True)
class FastPath:
    """What encodes: `encoder` when it passed the check, else None and `refused` says why (None too when
    no fast encoder was tried)."""

    encoder: FastEncoder | None
    refused: str | None


#: Fixed texts every fast encoder must tokenize exactly as HF does.
PARITY_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "x",
    "\n",
    "Hello, world! It's 3:45pm; we'll see.  Don't   stop\n\n\nthe  'quoted' text's end",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_start|>b <|im_end|> <|endoftext|><|im_start|><|im_end|>\n\n<|im_start",
    "<s></s><unk><pad>[INST] <<SYS>> <|begin_of_text|><|eot_id|> <think></think> <tool_call>",
    "    def f(x):\n\treturn x  # comment\r\n\r\n    }\n}\n\n\n\n",
    '{"key": [1, 2.5e-3, null, true], "nested": {"emoji": "😀", "esc": "\\u00e9\\n"}}',
    "1 12 123 1234 12345 123456789012345678901234567890 3.14159 -0.5e+10 0x1F600 192.168.0.1",
    "東京都は日本の首都です。こんにちは、世界！한국어 텍스트 中文没有空格的很长的段落",
    "مرحبا بالعالم، هذا اختبار. עברית שלום — Ελληνικά Русский текст नमस्ते दुनिया สวัสดีชาวโลก",
    "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇫🇷🇯🇵 ❤️‍🔥 🧑🏿‍🚀 1️⃣ #️⃣ 🏴󠁧󠁢󠁳󠁣󠁴󠁿 😀😀😀",
    "e\u0301 vs é, A\u030a vs Å vs \u212b, ﬁ ﬂ ①② Ⅻ ½ ｆｕｌｌｗｉｄｔｈ a\u0301\u0302\u0303\u0304",
    "a\u200bb\u200cc\u200dd\ufeffe\u202ef\u2066g\u00adh \u00a0\u3000\u2028\u2029\x0b\x0c\x85 end",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE ’s it's they're I'M O'Neil",
    "trailing spaces   ",
    "   leading spaces",
    " \n \n \n \n \n x\t\t\t\ty \r\n\r\n  \n\n  z",
    "=" * 40 + " " + "-" * 17 + "..." * 9 + "!?" * 5 + " ***",
)

#: Long runs placed across 8 KiB boundaries (fastokens' parallel chunks) in `check_texts`.
_RUNS = ("a" * 1500, " " * 1100, "7" * 700, "\n \n" * 300, "=-" * 500, "東京" * 400, "\r\n" * 500, "\t" * 600)
#: Separators between vocabulary samples.
_GLUE = (" ", "", "\n", "  ", ", ", "\n\n", "\t", ". ", "'s ", "1")


def check_texts(reference: Any, *, seed: int = 0, samples: int = 400) -> list[str]:
    """`PARITY_TEXTS`, then texts drawn from `reference` (a `tokenizers.Tokenizer`): `samples` texts of
    decoded random vocabulary entries and added tokens, and long texts (16 to 24 KiB) holding `_RUNS` at
    8 KiB boundaries. Deterministic for a given tokenizer and seed."""
    rng = random.Random(seed)
    size = reference.get_vocab_size(with_added_tokens=True)
    added = [str(t.content) for t in reference.get_added_tokens_decoder().values()]

    def piece() -> str:
        if added and rng.random() < 0.05:
            return rng.choice(added)
        return str(reference.decode([rng.randrange(size)], skip_special_tokens=False))

    drawn = ["".join(piece() + rng.choice(_GLUE) for _ in range(rng.randint(1, 40))) for _ in range(samples)]
    texts = list(PARITY_TEXTS) + drawn
    body = "".join(drawn + list(PARITY_TEXTS))
    while len(body) < 24 * 1024:
        body += body
    for i, run in enumerate(_RUNS):
        at = 8192 * (1 + i % 2) - len(run) // 2
        texts.append(body[:at] + run + body[at : at + 8 * 1024])
    long = texts[-1]
    texts += [long + " ", long[:-1], "<|im_start|>" + long]  # a previous input sharing a long prefix
    return texts


def first_difference(
    reference: Callable[[str], list[int]], candidate: Callable[[str], list[int]], texts: Sequence[str]
) -> str | None:
    """None when `candidate` gives `reference`'s ids for every text; else what differs, for the log."""
    for text in texts:
        want = reference(text)
        try:
            got = candidate(text)
        except Exception as exc:  # noqa: BLE001 (any failure refuses the candidate; its types are its own)
            return f"it raised {type(exc).__name__} on a text of {len(text)} characters: {exc}"
        if got != want:
            at = next(
                (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)),
            )
            return (
                f"{len(got)} ids for {len(want)} on a text of {len(text)} characters starting {text[:40]!r}, "
                f"first at id {at}: {got[at : at + 3]} instead of {want[at : at + 3]}"
            )
    return None


def fast_path(
    reference: Any, tokenizer_json: str, *, load: FastLoader | None, texts: Sequence[str] | None = None
) -> FastPath:
    """A fast encoder for the tokenizer `reference` was loaded from (`tokenizer_json`, its text), if `load`
    builds one and it gives HF's ids on `texts` (default `check_texts(reference)`)."""
    if load is None:
        return FastPath(None, None)
    try:
        fast = load(tokenizer_json)
    except FastEncoderError as exc:
        return FastPath(None, str(exc))

    def hf(text: str) -> list[int]:
        ids: list[int] = reference.encode(text, add_special_tokens=False).ids
        return ids

    differs = first_difference(hf, fast.encode, check_texts(reference) if texts is None else texts)
    if differs is not None:
        reference_name = f"tokenizers {package_version('tokenizers')}"
        return FastPath(None, f"{fast.name} differs from {reference_name}: {differs}")
    return FastPath(fast, None)


class _Fastokens:
    def __init__(self, tokenizer: Any, name: str) -> None:
        self._tokenizer = tokenizer
        self.name = name

    def encode(self, text: str, /) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def load_fastokens(tokenizer_json: str) -> FastEncoder:
    """`fastokens` over the text of a `tokenizer.json`, encoding on the calling thread. Raises
    `FastEncoderError`.

    fastokens spreads one long encode over a pool of threads sized by the machine's cores; the pool is
    made at the first such encode, and `FASTOKENS_BPE_THREADS` caps it. The gateway wants the
    least CPU per request, and one thread was also the fastest on a 2-core machine (8,000 tokens:
    0.33 ms and 0.33 ms CPU, against 0.44 ms and 0.44 ms with the pool; 32,000 tokens: 0.57 ms and
    0.58 ms CPU, against 0.81 ms and 1.06 ms), so this sets it to 1 unless the process was started
    with a value of its own (the one environment write below the app layer: the library reads no
    other setting, and it must happen before the first encode)."""
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    try:
        import fastokens
    except ImportError:
        raise FastEncoderError("fastokens is not installed") from None
    name = f"fastokens {package_version('fastokens')}"
    try:
        tokenizer = fastokens.Tokenizer.from_json_str(tokenizer_json)
    except (ValueError, RuntimeError) as exc:
        raise FastEncoderError(f"{name} cannot load this tokenizer: {exc}") from None
    return _Fastokens(tokenizer, name)


def package_version(package: str) -> str:
    """The installed version of `package` ("?" when its metadata is missing), for log lines."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"
