"""Continuing a pre-empted stream on an engine (pure): which requests can be continued, what they
generated so far, the body that continues them, and the usage the client is told.

The admission gate may take a running stream off its engine so that a tenant with nothing running
gets its slot at once (`tandem.router.admission.preemption`). The client's stream stays open; once
its tenant's turn comes again the gateway sends the engine a request that **continues** the answer:

- `/v1/completions`: the prompt followed by the text generated so far;
- `/v1/chat/completions`: the messages followed by an assistant message holding the text so far, with
  vLLM's `continue_final_message: true` and `add_generation_prompt: false` (the template leaves that
  message open and the model goes on writing it);
- `max_tokens` / `max_completion_tokens` and `min_tokens` less the tokens already generated.

The engine recomputes the prompt and the text so far (a prefix-cache hit for the prompt's blocks on
the engine that served it), then streams the rest, which the gateway relays into the same response.
What the client sees differs from an uninterrupted stream only in a second `role` chunk (chat) at the
seam and, when it asked for usage, in the usage numbers, which are told as one answer's
(`shift_usage`: completion tokens include those before the seam, the prompt excludes them). The
text is re-tokenized at the seam, so an engine may split it into tokens differently than it had
(the same text; a sampled answer goes on as a new sample).

Only requests whose answer is plain text of one choice can be continued (`continuable`): a stream,
`n` = 1, no tools, no structured output, no log probabilities, no `echo`, a text prompt (completions)
or messages that end with a turn to answer (chat).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tandem.router.types import Route

#: Body fields whose answers are not plain continuable text (present and truthy).
_NOT_CONTINUABLE = (
    "tools",
    "functions",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "suffix",
    "continue_final_message",
)


def continuable(route: Route, body: Mapping[str, Any]) -> bool:
    """Whether a stream for `body` can be pre-empted and continued (module docstring)."""
    if body.get("stream") is not True or body.get("n", 1) not in (1, None):
        return False
    if body.get("best_of", 1) not in (1, None) or any(body.get(key) for key in _NOT_CONTINUABLE):
        return False
    if route is Route.CHAT:
        messages = body.get("messages")
        answer = body.get("add_generation_prompt", True) is True
        return isinstance(messages, list) and bool(messages) and answer
    prompt = body.get("prompt")
    one = isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
    return isinstance(prompt, str) or one


@dataclass(frozen=True, slots=True)
class Generated:
    """What a stream carried before it was cut: its text (choice 0) and whether it had finished
    (a `finish_reason`, or `[DONE]`)."""

    text: str
    finished: bool


#: A string value of the answer's text key as engines write it (compact JSON, still escaped). The key
#: cannot occur inside a string (a `"` there is always escaped); `"reasoning_content"` is refused
#: before these run. The `_SPACED` forms are the general case, used only when the compact ones miss
#: an occurrence of the key.
_CHAT_TEXT = re.compile(rb'"content":"((?:[^"\\]|\\.)*)"')
_COMPLETION_TEXT = re.compile(rb'"text":"((?:[^"\\]|\\.)*)"')
_CHAT_TEXT_SPACED = re.compile(rb'"content"\s*:\s*"((?:[^"\\]|\\.)*)"')
_COMPLETION_TEXT_SPACED = re.compile(rb'"text"\s*:\s*"((?:[^"\\]|\\.)*)"')
#: What plain text of one choice never carries: tool calls, reasoning, another choice.
_NOT_PLAIN = (b'"tool_calls"', b'"function_call"', b'"reasoning')
_OTHER_CHOICE = re.compile(rb'"index":\s*[1-9]')
_FINISHED = (b'"finish_reason":"', b'"finish_reason": "', b"[DONE]")


def whole_events(data: bytes) -> tuple[bytes, bytes]:
    """`data` split after its last complete SSE event: (whole events, the unfinished rest).

    >>> whole_events(b"data: 1\\n\\ndata: 2")
    (b'data: 1\\n\\n', b'data: 2')
    """
    if data.endswith(b"\n\n"):
        return data, b""
    cut = max(data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, 0)
    return data[:cut], data[cut:]


def generated(raw: bytes, *, chat: bool) -> Generated | None:
    """The text of the whole events in `raw` (the engine's SSE bytes); an unfinished last event is
    left out (it was cut with the stream). None when an event is not one choice of plain text (a tool
    call, reasoning, another choice), which cannot be continued. A scan of the bytes, no JSON decode
    per event (it runs over every continuable stream, `Kept`).

    >>> event = b'data: {"choices":[{"index":0,"text":" Hi","finish_reason":null}]}\\n\\n'
    >>> generated(event + b'data: {"cho', chat=False)
    Generated(text=' Hi', finished=False)
    """
    whole, _ = whole_events(raw)
    if any(marker in whole for marker in _NOT_PLAIN) or _OTHER_CHOICE.search(whole):
        return None
    key = b'"content"' if chat else b'"text"'
    pieces = (_CHAT_TEXT if chat else _COMPLETION_TEXT).findall(whole)
    if len(pieces) + whole.count(key + b":null") != whole.count(key):
        pieces = (_CHAT_TEXT_SPACED if chat else _COMPLETION_TEXT_SPACED).findall(whole)
    texts: list[str] = orjson.loads(b'["' + b'","'.join(pieces) + b'"]') if pieces else []
    return Generated("".join(texts), any(marker in whole for marker in _FINISHED))


#: Whole events a continuable stream keeps as bytes before they are reduced to their text.
KEEP_BYTES = 64 * 1024


class Kept:
    """What a continuable stream has carried so far, kept small: the engine's whole events as bytes,
    reduced to their text every `KEEP_BYTES` (`generated`), so a long answer holds its text, not its
    events. `plain` turns False for good once an event is not plain text (the stream is then not
    continuable), and `on_unplain` is told then, once."""

    __slots__ = ("_chat", "_on_unplain", "_raw", "_size", "_texts", "finished", "plain")

    def __init__(self, *, chat: bool, on_unplain: Callable[[], None] | None = None) -> None:
        self._chat = chat
        self._on_unplain = on_unplain
        self._raw: list[bytes] = []
        self._size = 0
        self._texts: list[str] = []
        self.finished = False
        self.plain = True

    def add(self, events: bytes) -> None:
        """Whole SSE events, as relayed. Tool calls and reasoning are noticed at once (a reasoning
        model sends them unasked), so such a stream is never stopped."""
        if self.plain and events:
            if b'"tool_calls"' in events or b'"function_call"' in events or b'"reasoning' in events:
                self._unplain()  # the markers of _NOT_PLAIN, spelt out: this runs for every chunk
                return
            self._raw.append(events)
            self._size += len(events)
            if self._size >= KEEP_BYTES:
                self._reduce()

    def result(self) -> Generated | None:
        """The text so far (None: not continuable)."""
        self._reduce()
        return Generated("".join(self._texts), self.finished) if self.plain else None

    def _reduce(self) -> None:
        raw, self._raw, self._size = b"".join(self._raw), [], 0
        part = generated(raw, chat=self._chat) if self.plain else None
        if part is None:
            self._unplain()
            return
        self._texts.append(part.text)
        self.finished = self.finished or part.finished

    def _unplain(self) -> None:
        was, self.plain, self._raw, self._texts = self.plain, False, [], []
        if was and self._on_unplain is not None:
            self._on_unplain()


def continuation_body(route: Route, body: Mapping[str, Any], text: str, tokens: int) -> dict[str, Any]:
    """The body that continues `body`'s answer after `text` (`tokens` tokens) was streamed.

    >>> continuation_body(Route.COMPLETIONS, {"prompt": "Once", "max_tokens": 8, "stream": True}, " upon", 1)
    {'prompt': 'Once upon', 'max_tokens': 7, 'stream': True}
    """
    out = dict(body)
    if route is Route.CHAT:
        out["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
        out["add_generation_prompt"] = False
        out["continue_final_message"] = True
    else:
        prompt = body["prompt"]
        out["prompt"] = (prompt[0] if isinstance(prompt, list) else prompt) + text
    for key in ("max_tokens", "max_completion_tokens"):
        limit = out.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            out[key] = max(1, limit - tokens)
    floor = out.get("min_tokens")
    if isinstance(floor, int) and not isinstance(floor, bool):
        out["min_tokens"] = max(0, floor - tokens)
    return out


def shift_usage(chunk: bytes, tokens: int) -> bytes:
    """`chunk` with every usage object told as the whole answer's: `tokens` generated before the
    seam move from the prompt to the completion (the total stays). Chunks without usage are returned
    as they are; an event cut across chunks is left alone (its usage is not rewritten).

    >>> shift_usage(b'data: {"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}\\n\\n', 2)
    b'data: {"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}\\n\\n'
    """
    if tokens <= 0 or b'"usage"' not in chunk:
        return chunk
    out: list[bytes] = []
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"usage"' in event:
            try:
                obj = orjson.loads(event[6:])
            except ValueError:
                out.append(event)
                continue
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += tokens
                if isinstance(usage.get("prompt_tokens"), int):
                    usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - tokens)
                event = b"data: " + orjson.dumps(obj)
        out.append(event)
    return b"\n\n".join(out)
