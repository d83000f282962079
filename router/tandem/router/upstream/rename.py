"""The answer's `model` as the client asked for it: an alias's requests go to engines under the
target's served name, and their answers say the alias.

The engines' JSON is not parsed: the exact member token is replaced in the bytes, in its two
spellings, compact `"model":"qwen-v2"` (vLLM: pydantic's `model_dump_json`, Starlette's JSON
responses) and spaced `"model": "qwen-v2"` (Python's `json.dumps`). Why that is safe: inside a JSON
string every `"` is escaped (`\\"`), so the unescaped sequence `"model":"qwen-v2"` cannot occur in
generated text, tool arguments or any other string value; it occurs only as a member of an object,
and in OpenAI's completion and chunk objects the only member called `model` is the top-level one. A
served name that itself needs escaping in JSON (a `"` or `\\`) is refused by the names' pattern
(`tandem.core.gateway.MODEL_NAME_PATTERN`).

A stream is relayed as the engine's reads arrive, and a read may end inside the token. So each
stream keeps back what follows the last newline of what it was given (an SSE `data:` line is one
JSON document on one line, so a line ends before a token can span two reads), and sends it with
the next bytes or at the end. A chunk that ends with a newline (the usual case) is replaced and
sent whole. Cost: two `bytes.replace` scans per chunk, only for requests that came by an alias whose
name differs from the target's.
"""

from __future__ import annotations

from tandem.router.upstream.relay import ResponseMeter


class ModelRename:
    """Replaces `target` by `alias` as the answer's `model` (module docstring). One per request."""

    __slots__ = ("_compact", "_held", "_spaced")

    def __init__(self, *, target: str, alias: str) -> None:
        t, a = _quoted(target), _quoted(alias)
        self._compact = (b'"model":' + t, b'"model":' + a)
        self._spaced = (b'"model": ' + t, b'"model": ' + a)
        self._held = b""

    def __call__(self, data: bytes, /) -> bytes:
        """`data` (a whole document) with the alias."""
        return data.replace(*self._compact).replace(*self._spaced)

    def stream(self, data: bytes, /) -> bytes:
        """The next bytes of a stream with the alias; what follows the last newline is kept back."""
        if self._held:
            data, self._held = self._held + data, b""
        if not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            data, self._held = data[:cut], data[cut:]
        return self(data) if data else data

    def flush(self) -> bytes:
        """What was kept back, at the stream's end."""
        held, self._held = self._held, b""
        return self(held) if held else held


def _quoted(name: str) -> bytes:
    return b'"' + name.encode() + b'"'


class RenamingMeter:
    """A `ResponseMeter` that forwards `inner`'s bytes with `rename` applied to the stream."""

    __slots__ = ("_inner", "_rename")

    def __init__(self, inner: ResponseMeter, rename: ModelRename) -> None:
        self._inner, self._rename = inner, rename

    def stream_chunk(self, chunk: bytes, /) -> bytes:
        return self._rename.stream(self._inner.stream_chunk(chunk))

    def stream_end(self) -> bytes:
        return self._rename.stream(self._inner.stream_end()) + self._rename.flush()

    def buffered(self, status: int, body: bytes, /) -> None:
        self._inner.buffered(status, body)

    def close(self) -> None:
        self._inner.close()
