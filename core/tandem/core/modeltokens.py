"""A model's own prompt tokens, as the engine counts them, computed cheaply on a gateway's hot path.

Two tokenizers implement `ModelTokenizer`:

- `TandemTokenizer`: `tandem.core.tokenizer`, the simulator's own vocabulary and ChatML template. It is
  *the* model tokenizer of `engine.kind: sim`, and the documented fallback estimate for a real engine
  whose tokenizer files the gateway was not given (`tandem.core.tokenizer_files.load_tokenizer`).
- `HFTokenizer` (`tandem.core.tokenizer_files`): the model's `tokenizer.json` through Hugging Face
  `tokenizers`, with its chat template rendered the way vLLM renders it.

`PromptEncoder` makes repeated prompt text cheap. Tokenizing is linear in the prompt and slow in
pure tokenizers (Hugging Face: about 1.4 ms for 2,000 tokens on this class of machine), while
prompts on a gateway mostly repeat: a system prompt, a few-shot preamble, a conversation's history.
So the encoder cuts a prompt's text into *segments* at points where no pre-tokenizer piece crosses,
tokenizes each distinct segment once (a bounded LRU memo keyed by the segment's text and how it
ends), and concatenates. The cut points:

- before each of the tokenizer's `markers` (its special tokens: `<|im_start|>`, ...). A Hugging Face
  tokenizer splits those out before anything else, so the text before one ends there as it does in
  the whole prompt. Tandem's tokenizer reads them as plain text, so it is cut there only after a
  newline;
- before a letter that follows a blank line (`"...\n\nWord"`): in the byte-level BPE pre-tokenizer
  regexes (GPT-2's, Llama 3's, Qwen2's) and in Tandem's, no piece holds a newline and a letter. Only
  once the segment holds `segment_min_chars` characters (1,024 by default), so paragraphs are taken
  together: each segment costs an encode call and a memo lookup, and a never-seen 8,000-token prompt
  of short paragraphs has about 200 of them (0.6 ms of the gateway's CPU, against 0.24 ms cut at
  1,024: docs/router-performance.md). A segment's cuts depend only on the text from the previous
  marker, so prompts that share a beginning share its segments up to the last cut before they differ;
  the segment where they differ is encoded again (at most about 1,024 characters more).

A segment whose text goes on in the prompt (a paragraph cut, or a marker Tandem's tokenizer reads as
text) is tokenized with a letter appended and that letter's token dropped: the regexes look one
character ahead (`\\s+(?!\\S)`), so trailing whitespace is split as it is in the whole prompt, not as
at the end of a text. Whether all this holds for a given tokenizer is **checked, not assumed**:
`PromptEncoder` tokenizes `SELF_TEST_TEXTS` both ways at construction and cuts nothing if any
differs (SentencePiece-style tokenizers that prepend a space marker to every text fail the check;
they still get the whole-prompt memo). Example: a 2,048-token system prompt plus a 128-token
question costs one memo hit and a 128-token encode instead of a 2,176-token encode.

**Admission: a memo keeps what was seen twice.** Most of a gateway's text is seen once (each
request's new question), and a memo that stored it would fill with entries never read again (an
unbounded-looking RSS climb until its bound: megabytes of token tuples). So both memos admit an
entry on its second sighting: a constant-size doorkeeper (`SeenTwice`, one bit per slot of a fixed
bit array, cleared when half full) remembers the first; a shared system prompt is tokenized twice,
then served from the memo; a question seen once costs one bit.

Block keys (`tandem.core.blockhash`) are chained, so the keys of a prompt's leading blocks depend only
on its leading tokens. `Encoded.marks` records, after each segment, a *chain id* (a hash of the
segment texts so far) and the token count; `PromptEncoder.block_keys` finds the longest mark whose
keys it computed before (for that block size) and hashes only the blocks after it.

A chat whose template cannot be rendered (the tokenizer has none, or the template refuses the
messages with `raise_exception`) is counted from its message texts joined by newlines, an estimate:
the gateway is not where such a request is refused; the engine answers it (vLLM: 400).
`PromptEncoder.template_failures` counts them.

Pure: no I/O (the Hugging Face tokenizer is handed in already loaded); one encoder per process, used
from one thread (the event loop).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.core import tokenizer as tandem_tokenizer
from tandem.core.blockhash import ROOT_KEY, block_keys

#: Texts tokenized split and whole when an encoder is built; any difference turns splitting off.
SELF_TEST_TEXTS = (
    "Intro line\n\nSecond paragraph, with words.\n\nThird one: 42 items\n\n\nand spaces   \n\nEnd",
    "<|im_start|>system\nYou are terse.\n\nBe kind.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "a\n\nb \n\n c\t\n\nD\r\n\r\nE  <|im_end|>  \n\nÉtude naïve 東京\n\nдом\n\n\n\nx<|im_start|>",
    "code:\n\n    def f(x):\n        return x\n\nreturn value\n\n'quoted' text's end",
)
#: Most segments memoised, and most characters they may hold together.
DEFAULT_SEGMENT_MEMO = 8192
DEFAULT_SEGMENT_CHARS = 32 * 1024 * 1024
#: Fewest characters a segment holds before a paragraph may end it (markers always cut).
DEFAULT_SEGMENT_MIN_CHARS = 1024
#: Most (chain id, block size) entries of known leading block keys.
DEFAULT_KEY_MEMO = 4096

#: Slots of the doorkeeper's bit array (128 KiB).
SEEN_SLOTS = 1 << 20

_PARAGRAPH = re.compile(r"\n\n(?=[^\W\d_])")
#: Appended to a segment whose text goes on (module docstring); its one token is dropped.
_SENTINEL = "x"
#: A segment of the prompt: its text, and whether the prompt goes on after it as text.
Segment = tuple[str, bool]


class ModelTokenizer(Protocol):
    """A model's tokenizer as a gateway needs it. `name` says which (the start-up log line)."""

    @property
    def name(self) -> str: ...

    @property
    def markers(self) -> tuple[str, ...]:
        """Special-token strings of its chat template (segment boundaries)."""
        ...

    @property
    def markers_split(self) -> bool:
        """Whether `encode` splits `markers` out before pre-tokenizing (Hugging Face's added tokens)."""
        ...

    @property
    def completion_prefix(self) -> tuple[int, ...]:
        """Ids the engine adds before a completion prompt (a BOS), none for chats."""
        ...

    @property
    def backend(self) -> str:
        """What encodes, for the start-up log line (`tandem`, `tokenizers 0.23.3`, or a fast encoder
        checked against it: `tandem.core.fast_tokens`)."""
        ...

    @property
    def fast_refused(self) -> str | None:
        """Why a fast encoder that was tried is not used; None when none was tried or it is used."""
        ...

    @property
    def max_token_chars(self) -> int:
        """The most characters one token covers: `len(text) // max_token_chars` tokens at least,
        a bound on a prompt's length that costs no tokenizing."""
        ...

    def encode(self, text: str, /) -> list[int]:
        """`text` → ids, special-token strings recognised, nothing added around it."""
        ...

    def render_chat(self, messages: Sequence[Mapping[str, Any]], /) -> str:
        """The chat template applied to `messages` with the generation prompt, as the engine does
        for `/v1/chat/completions`."""
        ...


class ChatTemplateError(ValueError):
    """The chat template cannot be applied to these messages (none, or it refused them)."""


class TandemTokenizer:
    """`tandem.core.tokenizer` as a `ModelTokenizer` (the simulator's vocabulary, ChatML)."""

    name = "tandem"
    markers = (tandem_tokenizer.CHAT_START,)
    markers_split = False
    completion_prefix: tuple[int, ...] = ()
    backend = "tandem"
    fast_refused: str | None = None

    #: A token is at most `MAX_TOKEN_BYTES` bytes of UTF-8, so at most as many characters.
    max_token_chars = tandem_tokenizer.MAX_TOKEN_BYTES

    def encode(self, text: str, /) -> list[int]:
        return tandem_tokenizer.encode(text)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], /) -> str:
        return tandem_tokenizer.render_chat(messages)


@dataclass(frozen=True, slots=True)
class Encoded:
    """A prompt's ids, and after each segment `(chain id, tokens so far)` (module docstring)."""

    ids: tuple[int, ...]
    marks: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.ids)


class SeenTwice:
    """A doorkeeper of constant size: `again(h)` says whether hash `h` was (probably) offered before,
    and remembers it. One bit per slot of `slots` (a power of two); cleared when half the slots are
    set, so it forgets old sightings rather than growing. A collision only admits a once-seen entry
    early. Example: again(7) → False, again(7) → True, again(8) → False."""

    def __init__(self, slots: int = SEEN_SLOTS) -> None:
        if slots < 8 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two of at least 8, not {slots}")
        self._bits = bytearray(slots // 8)
        self._mask = slots - 1
        self._set = 0
        self._limit = slots // 2

    def again(self, h: int) -> bool:
        slot = h & self._mask
        byte, bit = slot >> 3, 1 << (slot & 7)
        if self._bits[byte] & bit:
            return True
        if self._set >= self._limit:
            self._bits = bytearray(len(self._bits))
            self._set = 0
        self._bits[byte] |= bit
        self._set += 1
        return False


class PromptEncoder:
    """Segment-memoised tokenization and prefix-memoised block keys (module docstring)."""

    def __init__(
        self,
        tokenizer: ModelTokenizer,
        *,
        segment_memo: int = DEFAULT_SEGMENT_MEMO,
        segment_chars: int = DEFAULT_SEGMENT_CHARS,
        segment_min_chars: int = DEFAULT_SEGMENT_MIN_CHARS,
        key_memo: int = DEFAULT_KEY_MEMO,
    ) -> None:
        if segment_min_chars < 0:
            raise ValueError(f"segment_min_chars must be at least 0, not {segment_min_chars}")
        self.tokenizer = tokenizer
        self.template_failures = 0
        self._segments: OrderedDict[Segment, tuple[int, ...]] = OrderedDict()
        self._segment_limit = segment_memo
        self._char_limit = segment_chars
        self._chars = 0
        self._keys: OrderedDict[tuple[int, int, int], tuple[int, ...]] = OrderedDict()
        self._key_limit = key_memo
        self._seen = SeenTwice()
        markers = [m for m in tokenizer.markers if m]
        self._marker = re.compile("|".join(re.escape(m) for m in markers)) if markers else None
        self._min_chars = segment_min_chars
        self.splits = all(self._split_is_exact(text) for text in SELF_TEST_TEXTS)
        self._segments.clear()
        self._chars = 0
        self._seen = SeenTwice()

    # -- prompts ------------------------------------------------------------------------------

    def completion(self, prompt: str | Sequence[str] | Sequence[int]) -> Encoded:
        """A completion prompt: a string, strings (each encoded and concatenated, as the engine
        does for its one prompt), or token ids (kept as they are)."""
        prefix = self.tokenizer.completion_prefix
        if isinstance(prompt, str):
            return self.text(prompt, prefix=prefix)
        ids: list[int] = []
        for part in prompt:
            if isinstance(part, str):
                ids.extend(prefix)
                ids.extend(self.text(part).ids)
            else:
                ids.append(part)
        return Encoded(tuple(ids), ())

    def chat(self, messages: Sequence[Mapping[str, Any]]) -> Encoded:
        """A chat: the template rendered, then encoded (no completion prefix: templates carry it);
        an estimate from the message texts when the template cannot be applied (module docstring)."""
        try:
            rendered = self.tokenizer.render_chat(messages)
        except ChatTemplateError:
            self.template_failures += 1
            rendered = "\n".join(_plain(m.get("content")) for m in messages)
        return self.text(rendered)

    def text(self, text: str, *, prefix: Sequence[int] = ()) -> Encoded:
        """`prefix` + the ids of `text`, segment by segment (module docstring)."""
        ids: list[int] = list(prefix)
        marks: list[tuple[int, int]] = []
        chain = hash(tuple(prefix))
        for segment in self.segments(text):
            ids.extend(self._segment_ids(segment))
            chain = hash((chain, segment))
            marks.append((chain, len(ids)))
        return Encoded(tuple(ids), tuple(marks))

    def segments(self, text: str) -> list[Segment]:
        """`text` cut at the points of the module docstring (whole when cutting is off): before every
        marker, and at a paragraph only once the segment holds `segment_min_chars` characters."""
        if not self.splits or not text:
            return [(text, False)] if text else []
        return self._cut(text, least=self._min_chars)

    def _cut(self, text: str, *, least: int) -> list[Segment]:
        """`text` (not empty) cut before every marker, and at a paragraph `least` characters or more
        past the previous cut."""
        out: list[Segment] = []
        start = 0
        for edge, goes_on in self._marker_cuts(text):
            at = start + least
            while at < edge:  # paragraph cuts before this marker, each `least` past the last cut
                found = _PARAGRAPH.search(text, at, edge)
                if found is None:
                    break
                cut = found.end()
                out.append((text[start:cut], True))
                start, at = cut, cut + least
            if edge > start:
                out.append((text[start:edge], goes_on))
                start = edge
        return out

    def _marker_cuts(self, text: str) -> list[tuple[int, bool]]:
        """Where `text` is cut before a marker, and whether the text goes on there; then its end."""
        cuts: list[tuple[int, bool]] = []
        if self._marker is not None:
            native = self.tokenizer.markers_split
            for found in self._marker.finditer(text):
                at = found.start()
                if native:
                    cuts.append((at, False))  # the tokenizer ends the text before it there too
                elif text[at - 1 : at] == "\n":
                    cuts.append((at, True))
        cuts.append((len(text), False))
        return cuts

    # -- block keys ---------------------------------------------------------------------------

    def block_keys(self, encoded: Encoded, block_size: int, *, root: int = ROOT_KEY) -> tuple[int, ...]:
        """`block_keys(encoded.ids, block_size, parent=root)`, reusing the keys of the longest known
        leading segments under the same root and remembering this prompt's for the next. `root` is
        the request's key space (`tandem.core.blockhash.scope_key`: its tenant's cache salt), so a
        memo never carries one tenant's keys into another's."""
        full = len(encoded.ids) // block_size
        known: tuple[int, ...] = ()
        for chain, count in reversed(encoded.marks):
            hit = self._keys.get((chain, block_size, root))
            if hit is not None and len(hit) == count // block_size:
                self._keys.move_to_end((chain, block_size, root))
                known = hit
                break
        start = len(known) * block_size
        parent = known[-1] if known else root
        keys = known + tuple(block_keys(encoded.ids[start : full * block_size], block_size, parent=parent))
        for chain, count in encoded.marks:
            entry = (chain, block_size, root)
            if count // block_size > len(known) and entry not in self._keys and self._seen.again(hash(entry)):
                self._keys[entry] = keys[: count // block_size]
        while len(self._keys) > self._key_limit:
            self._keys.popitem(last=False)
        return keys

    # -- internals ----------------------------------------------------------------------------

    def _segment_ids(self, segment: Segment) -> tuple[int, ...]:
        ids = self._segments.get(segment)
        if ids is not None:
            self._segments.move_to_end(segment)
            return ids
        text, goes_on = segment
        ids = tuple(self.tokenizer.encode(text + _SENTINEL)[:-1] if goes_on else self.tokenizer.encode(text))
        if len(text) <= self._char_limit // 4 and self._seen.again(hash(segment)):
            self._segments[segment] = ids
            self._chars += len(text)
            while len(self._segments) > self._segment_limit or self._chars > self._char_limit:
                (old, _), _ = self._segments.popitem(last=False)
                self._chars -= len(old)
        return ids

    def _split_is_exact(self, text: str) -> bool:
        """Whether cutting `text` at every point (whatever `segment_min_chars` skips) keeps its ids."""
        pieces = [self._segment_ids(s) for s in self._cut(text, least=0)]
        return [t for piece in pieces for t in piece] == self.tokenizer.encode(text)


def _plain(content: object) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""
