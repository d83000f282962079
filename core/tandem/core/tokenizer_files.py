"""Loading a model's own tokenizer from its files: `tokenizer.json` (Hugging Face `tokenizers`) and
`tokenizer_config.json` (its chat template and special tokens; the template in `chat_template.jinja`
when the config has none, as `transformers` saves it since 4.43), as a `ModelTokenizer`.

Where the files come from is the caller's business: the model's local directory (`tandem up
--engine vllm`), the model's volume mounted into the gateway's pod, or a ConfigMap holding the two
files (docs/router.md, "Prompt tokens"). A directory without `tokenizer.json` is an error naming the
path (`TokenizerFilesError`), never a silent fallback.

The chat template is rendered the way vLLM renders it for `/v1/chat/completions` (through
`transformers`' `apply_chat_template`): Jinja2 in a sandboxed environment with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, `raise_exception` and `strftime_now`, the variables
`messages`, `add_generation_prompt=True` and the special tokens named in the config; a message whose
`content` is a list of parts gets the text parts joined with newlines (vLLM's "string" content
format for text-only models). The rendered text is encoded without adding special tokens, as vLLM
does for chats; a completion prompt gets what the tokenizer's post-processor adds (a BOS for
Llama-style models, nothing for Qwen2).

Encoding goes through `fastokens` where it proves it gives Hugging Face's ids for this `tokenizer.json`
at load time, else through Hugging Face (`tandem.core.fast_tokens`); `HFTokenizer.backend` says which,
and `fast_refused` why not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from tandem.core.fast_tokens import FastEncoder, FastLoader, fast_path, load_fastokens, package_version
from tandem.core.modeltokens import ChatTemplateError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class TokenizerFilesError(ValueError):
    """The tokenizer files are missing or unreadable; the message names the path and what is wrong."""


def _token_text(value: object) -> str | None:
    """A special token in `tokenizer_config.json`: a string, or an AddedToken dict with `content`."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _message_content(content: object) -> object:
    if isinstance(content, list):
        texts = [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        ]
        return "\n".join(texts)
    return content


class HFTokenizer:
    """A `ModelTokenizer` over a Hugging Face `tokenizers.Tokenizer` and an optional chat template;
    `fast`, when given, encodes instead (it was checked to give the same ids: `fast_tokens.fast_path`)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        chat_template: str | None,
        special_tokens: Mapping[str, str],
        fast: FastEncoder | None = None,
        fast_refused: str | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.name = name
        self._fast = fast
        hf = f"tokenizers {package_version('tokenizers')}"
        self.backend = f"{fast.name} (checked against {hf})" if fast is not None else hf
        self.fast_refused = fast_refused
        self._specials = dict(special_tokens)
        self.markers_split = True
        self.markers = tuple(
            sorted(
                (t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special),
                key=len,
                reverse=True,
            )
        )
        empty = tokenizer.encode("", add_special_tokens=True).ids
        self.completion_prefix: tuple[int, ...] = tuple(empty)
        # A vocabulary entry's length in its own alphabet (byte-level BPE: a character per byte;
        # SentencePiece: "▁" per space, "<0xE4>" per fallback byte) is at least the characters of
        # text it covers, so the longest entry bounds any token's characters.
        vocabulary = tokenizer.get_vocab(with_added_tokens=True)
        self.max_token_chars: int = max((len(t) for t in vocabulary), default=1)
        self._template = _compile_template(chat_template) if chat_template else None

    def encode(self, text: str, /) -> list[int]:
        if self._fast is not None:
            try:
                return self._fast.encode(text)
            except (ValueError, RuntimeError):  # a text it refuses: Hugging Face's answer, or its error
                pass
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def render_chat(self, messages: Sequence[Mapping[str, Any]], /) -> str:
        """Raises `ChatTemplateError` without a template, or when it refuses the messages."""
        if self._template is None:
            raise ChatTemplateError(
                f"{self.name}: the tokenizer has no chat template ({CONFIG_FILE} or {TEMPLATE_FILE})"
            )
        import jinja2

        prepared = [{**m, "content": _message_content(m.get("content"))} for m in messages]
        try:
            rendered: str = self._template.render(
                messages=prepared, add_generation_prompt=True, tools=None, documents=None, **self._specials
            )
        except (jinja2.exceptions.TemplateError, TypeError, ValueError) as exc:
            raise ChatTemplateError(f"{self.name}: the chat template refused the messages: {exc}") from None
        return rendered


def _compile_template(source: str) -> Any:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: object, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # noqa: DTZ005 (as transformers)
    return env.from_string(source)


def load_tokenizer(directory: str | Path, *, fast: FastLoader | None = load_fastokens) -> HFTokenizer:
    """The tokenizer in `directory` (module docstring); `fast` builds the fast encoder tried on it (None:
    Hugging Face alone). Raises `TokenizerFilesError`."""
    path = Path(directory)
    file = path / TOKENIZER_FILE
    if not file.is_file():
        raise TokenizerFilesError(f"no {TOKENIZER_FILE} in {path} (the model's tokenizer files)")
    try:
        source = file.read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise TokenizerFilesError(f"{file}: cannot read: {exc}") from None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(source)
    except Exception as exc:  # noqa: BLE001 (the Rust loader raises a bare Exception for a bad file)
        raise TokenizerFilesError(f"{file}: cannot load: {exc}") from None
    chosen = fast_path(tokenizer, source, load=fast)
    config: Mapping[str, Any] = {}
    config_file = path / CONFIG_FILE
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenizerFilesError(f"{config_file}: cannot read: {exc}") from None
        config = loaded if isinstance(loaded, Mapping) else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: vLLM takes "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if template is None:  # transformers >= 4.43 saves it beside the config
        template = _read_optional(path / TEMPLATE_FILE)
    specials = {k: v for k in _SPECIAL_NAMES if (v := _token_text(config.get(k))) is not None}
    return HFTokenizer(
        tokenizer,
        name=f"hf:{path}",
        chat_template=template if isinstance(template, str) else None,
        special_tokens=specials,
        fast=chosen.encoder,
        fast_refused=chosen.refused,
    )


def _read_optional(file: Path) -> str | None:
    if not file.is_file():
        return None
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenizerFilesError(f"{file}: cannot read: {exc}") from None
