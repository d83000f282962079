"""Token counting for fair-queue charges: the usage request, and the SSE tap (its byte-count fast
path and its per-event path give the same counts).

Pure: byte strings in, counts and bytes out. Nothing is faked. (Prompt tokens are tested in
tests/core/test_modeltokens.py.)
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.router.types import Usage
from tandem.router.upstream.usage import SSETap, request_usage, usage_from_body


@pytest.mark.parametrize(
    ("body", "sent", "added"),
    [
        ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}, True),
        (
            {"stream": True, "stream_options": {"continuous_usage_stats": False}},
            {"stream": True, "stream_options": {"continuous_usage_stats": False, "include_usage": True}},
            True,
        ),
        (
            {"stream": True, "stream_options": {"include_usage": True}},
            {"stream": True, "stream_options": {"include_usage": True}},
            False,
        ),
        ({"stream": False}, {"stream": False}, False),
        ({}, {}, False),
    ],
)
def test_usage_is_requested_for_streams_that_did_not_ask(
    body: dict[str, Any], sent: dict[str, Any], added: bool
) -> None:
    assert request_usage(body) == (sent, added)


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def chat_chunk(text: str) -> bytes:
    return event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]})


def text_chunk(text: str) -> bytes:
    return event({"object": "text_completion", "choices": [{"index": 0, "text": text}]})


USAGE = event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"


def run(tap: SSETap, chunks: list[bytes]) -> tuple[bytes, list[int]]:
    out, counts = [], []
    for chunk in chunks:
        forward, tokens = tap.feed(chunk)
        out.append(forward)
        counts.append(tokens)
    out.append(tap.flush())
    return b"".join(out), counts


def test_each_event_with_content_is_one_token_and_the_bytes_pass_unchanged() -> None:
    role = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    stream = [role, chat_chunk("Hi"), chat_chunk(" there"), chat_chunk(""), USAGE, DONE]
    tap = SSETap(strip_usage=False)
    relayed, counts = run(tap, stream)
    assert relayed == b"".join(stream)
    assert counts == [0, 1, 1, 0, 0, 0] and tap.tokens == 2
    assert tap.usage == Usage(prompt_tokens=7, completion_tokens=3)


def test_events_split_across_chunks_are_counted_once_and_relayed_as_they_come() -> None:
    whole = text_chunk(" a") + text_chunk(" b") + DONE
    pieces = [whole[:5], whole[5:40], whole[40:41], whole[41:]]
    tap = SSETap(strip_usage=False)
    relayed, counts = run(tap, pieces)
    assert relayed == whole and sum(counts) == 2


def test_the_usage_event_the_router_asked_for_is_stripped_and_nothing_else() -> None:
    stream = text_chunk(" a") + text_chunk(" b") + USAGE + DONE
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]  # events cut anywhere
    tap = SSETap(strip_usage=True)
    relayed, counts = run(tap, pieces)
    assert relayed == text_chunk(" a") + text_chunk(" b") + DONE
    assert sum(counts) == 2 and tap.usage == Usage(prompt_tokens=7, completion_tokens=3)


@pytest.mark.parametrize("strip_usage", [True, False], ids=["strip", "keep"])
@pytest.mark.parametrize(
    "events",
    [
        [chat_chunk(" a"), chat_chunk(" b"), chat_chunk(" c"), USAGE, DONE],
        [chat_chunk(" a"), USAGE, DONE],
        [USAGE, DONE],
        [chat_chunk(" a"), chat_chunk(" b"), DONE],
        [chat_chunk("data: [DONE]"), chat_chunk(" b"), USAGE, DONE],  # the marker as generated text
        [chat_chunk(" a"), chat_chunk('"usage":{'), USAGE, DONE],
        [text_chunk(" a"), text_chunk(" b"), USAGE, DONE],
        [chat_chunk(" a"), USAGE, DONE, b'data: {"cho'],  # and the start of an event after it
    ],
    ids=[
        "tokens-usage-done",
        "one-token",
        "usage-only",
        "no-usage",
        "done-in-text",
        "usage-in-text",
        "completions",
        "unfinished-after",
    ],
)
def test_a_streams_last_read_with_its_usage_counts_as_its_events_one_by_one(
    events: list[bytes], strip_usage: bool
) -> None:
    """A stream's last read often holds its last token events, the usage event and `[DONE]` at once:
    the token events before the usage are counted from their bytes, the rest event by event; the
    counts, the usage and the bytes relayed are those of feeding the events one at a time."""
    whole, apart = SSETap(strip_usage=strip_usage), SSETap(strip_usage=strip_usage)
    relayed, counts = run(whole, [b"".join(events)])
    relayed_apart, counts_apart = run(apart, events)
    assert (relayed, sum(counts), whole.usage) == (relayed_apart, sum(counts_apart), apart.usage)
    assert whole.tokens == apart.tokens


def test_crlf_framed_events_are_understood() -> None:
    stream = [chat_chunk("x").replace(b"\n\n", b"\r\n\r\n"), USAGE.replace(b"\n\n", b"\r\n\r\n")]
    tap = SSETap(strip_usage=True)
    relayed, counts = run(tap, stream)
    assert relayed == stream[0] and counts == [1, 0]


def test_an_unfinished_last_event_is_forwarded_at_the_end() -> None:
    tap = SSETap(strip_usage=True)
    relayed, _ = run(tap, [text_chunk(" a"), b'data: {"choi'])
    assert relayed == text_chunk(" a") + b'data: {"choi'


def test_garbage_is_relayed_and_not_counted() -> None:
    tap = SSETap(strip_usage=True)
    relayed, counts = run(tap, [b"data: not json\n\n", b": comment\n\n", b"event: x\ndata: [1]\n\n"])
    assert relayed == b"data: not json\n\n: comment\n\nevent: x\ndata: [1]\n\n" and counts == [0, 0, 0]


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (b'{"usage": {"prompt_tokens": 4, "completion_tokens": 9}}', Usage(4, 9)),
        (b'{"usage": {"prompt_tokens": -1, "completion_tokens": true}}', Usage(None, None)),
        (b'{"choices": []}', None),
        (b"not json", None),
        (b"[1, 2]", None),
    ],
)
def test_usage_of_a_buffered_answer(body: bytes, usage: Usage | None) -> None:
    assert usage_from_body(body) == usage


def _chat(delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, **extra}]}


#: Event payloads of every shape the byte-level count must either get right or leave to the decoder.
SHAPES: list[Any] = [
    _chat({"role": "assistant", "content": ""}),
    _chat({"content": "Hi"}),
    {**_chat({"content": "Hi"}), "usage": None},  # every chunk, once usage was asked for
    {**_chat({"content": "usage"}), "usage": None},
    {**_chat({"content": ""}), "usage": None},
    {"choices": [{"index": 0, "text": " a"}], "usage": None},
    _chat({"content": ""}, finish_reason="length"),
    _chat({"content": None, "tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
    _chat({"content": "content"}),  # the key's name as its value
    _chat({"content": 'say "content": "x"'}),  # the key's name, quoted, inside the text
    _chat({"content": "\\"}),  # an escaped backslash just before the closing quote
    _chat({"content": "é ü"}),
    _chat({"reasoning_content": "hmm"}),
    _chat({"content": "a"}, logprobs={"content": [{"token": "a", "logprob": -0.1}]}),
    _chat({"text": "not chat"}),
    {"choices": [{"index": 0, "delta": {"content": "x"}}, {"index": 1, "delta": {"content": "y"}}]},
    {"choices": [{"index": 0, "text": " a"}, {"index": 1, "text": ""}]},
    {"choices": [{"index": 0, "text": "text", "logprobs": {"text_offset": [0], "tokens": ["a"]}}]},
    {"choices": [{"index": 0, "text": None}]},
    {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"completion_tokens": 1}},
    {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
    {"error": {"message": "boom", "type": "BadGatewayError"}},
    {"choices": "content"},
]


@pytest.mark.parametrize("compact", [True, False], ids=["compact", "spaced"])
@pytest.mark.parametrize("ascii_only", [True, False], ids=["ascii", "utf8"])
def test_counting_from_the_bytes_agrees_with_decoding_every_event(compact: bool, ascii_only: bool) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    for payload in SHAPES:
        raw = b"data: " + json.dumps(payload, separators=separators, ensure_ascii=ascii_only).encode()
        stream = raw + b"\n\n"
        quick, decoded = SSETap(strip_usage=False), SSETap(strip_usage=False, collect_text=True)
        assert quick.feed(stream)[1] == decoded.feed(stream)[1], payload
        assert quick.usage == decoded.usage, payload
