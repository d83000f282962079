"""The per-request context: prompt tokens counted once and only when asked, an estimate otherwise,
and what a stream's expected length is (the handover needs it).

Pure: `RequestContext` over a counting tokenizer; no server.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.modeltokens import PromptEncoder, TandemTokenizer
from tandem.router.pipeline.context import CHARS_PER_TOKEN, RequestContext, estimate_tokens
from tandem.router.types import Route


class CountingTokenizer(TandemTokenizer):
    """Tandem's tokenizer, counting the texts it is asked to encode."""

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, /) -> list[int]:
        self.calls += 1
        return super().encode(text)


def context(
    body: dict[str, Any], *, route: Route = Route.CHAT, encoder: PromptEncoder | None = None
) -> RequestContext:
    return RequestContext(
        request_id="r",
        upstream_id="r.0",
        path="/v1/chat/completions",
        started=0.0,
        route=route,
        body=body,
        encoder=encoder,
    )


CHAT = {"messages": [{"role": "system", "content": "x" * 2_400}, {"role": "user", "content": "y" * 600}]}


def test_a_prompt_nobody_counted_is_estimated_and_never_tokenized() -> None:
    tokenizer = CountingTokenizer()
    ctx = context(dict(CHAT), encoder=PromptEncoder(tokenizer))
    calls_at_start = tokenizer.calls  # the encoder's own self-test at construction
    assert ctx.prompt_size() == 3_000 // CHARS_PER_TOKEN  # the docstring's example
    assert tokenizer.calls == calls_at_start
    exact = ctx.prompt_length()  # a policy asks: now it is tokenized, once
    assert tokenizer.calls > calls_at_start
    assert ctx.prompt_size() == exact
    before = tokenizer.calls
    assert ctx.prompt_length() == exact and tokenizer.calls == before


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"prompt": "a" * 30}, 10),
        ({"prompt": ["a" * 30, "b" * 30]}, 20),
        ({"prompt": [1, 2, 3, 4]}, 4),  # token ids count as themselves
        ({"prompt": [[1, 2], [3]]}, 3),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "c" * 90}]}]}, 30),
        ({"prompt": ""}, 1),  # never 0: a request always costs something
        ({}, 1),
    ],
)
def test_the_estimate_reads_the_prompt_text(body: dict[str, Any], tokens: int) -> None:
    assert estimate_tokens(body) == tokens


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"stream": True, "max_tokens": 64}, 64),
        ({"stream": True, "max_completion_tokens": 32}, 32),
        ({"stream": True, "max_tokens": 64, "n": 2}, None),  # several choices: their counts mix
        ({"stream": True, "max_tokens": 64, "best_of": 3}, None),
        ({"stream": True}, None),  # no stated length
        ({"stream": False, "max_tokens": 64}, None),  # buffered answers are not watched
        ({"stream": True, "max_tokens": True}, None),
    ],
)
def test_a_streams_expected_length_is_its_max_tokens_for_one_choice(
    body: dict[str, Any], expected: int | None
) -> None:
    ctx = context(body)
    ctx.stream = bool(body.get("stream"))
    assert ctx.expected_output() == expected
