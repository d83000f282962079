"""The C = 1 probe's client: its HTTP/1.1 reading (chunked and plain bodies, fed in any split) and when
it counts the first token; end to end it runs in the overhead sweep (tests/bench/test_bench_harness.py)."""

from __future__ import annotations

import socket

import pytest

from tandem.bench.wireprobe import ProbeError, ProbeResult, ResponseReader, carries_text, probe


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (b'data: {"choices":[{"index":0,"text":"a"}]}', True),
        (b'data: {"choices":[{"delta":{"content":" hi"}}]}', True),
        (b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}', False),  # the role chunk
        (b'data: {"choices":[{"text":""}],"usage":null}', False),
        (b'data: {"choices":[{"text":""},{"text":"b"}]}', True),  # a second choice with text
        (b"data: [DONE]", False),
    ],
)
def test_an_event_carries_text_when_a_choice_has_some(event: bytes, expected: bool) -> None:
    assert carries_text(event) is expected


def chunked(*parts: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


ROLE = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_a_chunked_stream_is_read_whole_whatever_the_reads(step: int) -> None:
    raw = chunked(ROLE, TOKEN[:20], TOKEN[20:], b"data: [DONE]\n\n")
    response = ResponseReader()
    seen_at = None
    for i in range(0, len(raw), step):
        response.feed(raw[i : i + step])
        if seen_at is None and response.first_text:
            seen_at = i + step
    assert response.done and response.status == 200 and response.chunked
    # The first token counts once its event is whole: after the role chunk and both halves of it.
    whole = raw.index(TOKEN[20:]) + len(TOKEN[20:])
    assert seen_at is not None and whole <= seen_at < whole + step + 2


def test_a_response_with_a_length_ends_at_it_and_an_error_never_counts_a_token() -> None:
    body = b'{"error":{"message":"data: {\\"text\\":\\"x\\"}\\n\\n"}}'
    raw = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    response = ResponseReader()
    response.feed(raw[:30])
    assert not response.done
    response.feed(raw[30:])
    assert response.done and response.status == 429 and not response.first_text


@pytest.mark.parametrize(
    "raw",
    [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"],
)
def test_bad_framing_is_a_probe_error(raw: bytes) -> None:
    with pytest.raises(ProbeError):
        ResponseReader().feed(raw)


def test_the_added_ttft_is_the_gateways_p50_less_the_engines() -> None:
    row = ProbeResult(direct_ms=(0.5, 0.6, 0.7), gateway_ms=(1.0, 1.2, 1.9), errors=1).row("rr", 0)
    assert row["pairs"] == 3 and row["errors"] == 1
    assert row["direct_ttft_p50_ms"] == pytest.approx(0.6) and row["gateway_ttft_p50_ms"] == pytest.approx(
        1.2
    )
    assert row["added_ttft_p50_ms"] == pytest.approx(0.6)
    assert ProbeResult((), (), 0).row("rr", 0)["added_ttft_p50_ms"] is None


def test_a_gateway_that_cannot_be_reached_fails_its_pairs_and_ends_the_probe_cleanly() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    result = probe(url, url, model="m", pairs=3, prompt_tokens=4, output_tokens=2, warmup_pairs=1)
    assert (result.direct_ms, result.gateway_ms, result.errors) == ((), (), 3)
