"""Prompts longer than the model's context, refused by the gateway before they cost it anything.

The attack (a 4 MiB prompt, a million tokens, read, tokenized and hashed by the gateway for an answer
that is always the engine's 400): the gateway learns `max_model_len` from the engines' /v1/models and
refuses such a prompt from its characters alone, or after tokenizing it, in the engine's words. Unit
tests of `ContextLimit` first; then a real gateway in front of a `FakeEngine` stating 4,096 tokens.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tests.router.harness import MODEL, MODEL_NAME, Launcher

from tandem.router.errors import InvalidRequest
from tandem.router.request.context_limit import ContextLimit, prompt_sizes


def limit(tokens: int | None = 2048) -> ContextLimit:
    context = ContextLimit(max_token_chars=4, model_names={MODEL, MODEL_NAME})
    if tokens is not None:
        context.learn(
            "http://e0", [{"id": "other", "max_model_len": 10}, {"id": MODEL, "max_model_len": tokens}]
        )
    return context


def test_the_smallest_context_an_engine_states_for_this_model_is_the_limit() -> None:
    context = limit(None)
    assert context.tokens is None
    context.learn("http://e0", [{"id": "unrelated", "max_model_len": 8}])
    assert context.tokens is None  # another model's card says nothing about ours
    context.learn("http://e1", [{"id": "x", "root": MODEL_NAME, "max_model_len": 4096}])
    context.learn("http://e2", [{"id": MODEL, "max_model_len": 2048}])
    context.learn("http://e3", [{"id": MODEL, "max_model_len": True}])  # not a number
    assert context.tokens == 2048 and not context.knows("http://e3")
    context.forget({"http://e1"})
    assert context.tokens == 4096


def test_the_worked_example_of_the_module_docstring() -> None:
    context = limit(2048)
    with pytest.raises(InvalidRequest, match="has at least 2250 input tokens"):
        context.check_unread({"prompt": "x" * 9000})
    context.check_unread({"prompt": "x" * 6000})  # at least 1,500: tokenized next
    with pytest.raises(InvalidRequest, match=r"maximum context length is 2048 tokens\..*has 2100 input"):
        context.check_tokens(2100)
    context.check_tokens(1900)


def test_each_prompt_of_a_batch_is_checked_alone_and_token_ids_exactly() -> None:
    context = limit(2048)
    assert prompt_sizes({"prompt": ["ab", [1, 2, 3]]}) == [(2, False), (3, True)]
    context.check_unread({"prompt": ["x" * 8000] * 16})  # 16 prompts of 2,000 at least: each fits
    with pytest.raises(InvalidRequest, match="has 2048 input tokens"):
        context.check_unread({"prompt": [7] * 2048})
    with pytest.raises(InvalidRequest, match="at least 2500"):
        context.check_unread(
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 10_000}]}]}
        )
    limit(None).check_unread({"prompt": "x" * 10**6})  # no engine stated a limit: the engine decides


def test_an_estimating_tokenizer_refuses_only_what_no_tokenizer_could_fit() -> None:
    context = ContextLimit(max_token_chars=4, model_names={MODEL}, exact=False)
    context.learn("http://e0", [{"id": MODEL, "max_model_len": 2048}])
    context.check_unread({"prompt": "x" * 100_000})  # 1,562 tokens at 64 characters each: may fit
    context.check_tokens(10**6)  # an estimate's count decides nothing
    with pytest.raises(InvalidRequest, match="at least 2048"):
        context.check_unread({"prompt": "x" * 64 * 2048})


async def learned(router_http: httpx.AsyncClient, body: dict[str, object]) -> httpx.Response:
    """POST `body` once the gateway has read the engine's /v1/models (in the background at start)."""
    for _ in range(100):
        response = await router_http.post("/v1/completions", json=body)
        if response.status_code == 400:
            return response
        await asyncio.sleep(0.05)
    return response


async def test_a_prompt_over_the_engines_context_never_reaches_the_engine(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")  # states max_model_len 4096
    router = await launcher.router(decode=[engine])
    response = await learned(router.http, {"model": MODEL, "prompt": "x" * 70_000, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("This model's maximum context length is 4096 tokens")
    assert "at least 17500 input tokens" in error["message"]
    sent = len(engine.received)
    assert (
        await router.http.post("/v1/completions", json={"model": MODEL, "prompt": "x" * 70_000})
    ).status_code == 400
    assert len(engine.received) == sent  # the refused prompt was not forwarded


async def test_a_prompt_that_passes_the_character_bound_is_counted_exactly(launcher: Launcher) -> None:
    engine = await launcher.engine("d0")
    router = await launcher.router(decode=[engine])
    # 16,000 characters (at least 4,000 tokens: under 4,096) that tokenize to 5,334 tokens, in a body
    # padded past the size at which the gateway tokenizes it off the event loop.
    body = {"model": MODEL, "prompt": "ab" + " ab" * 5333, "user": "u" * 70_000, "max_tokens": 1}
    response = await learned(router.http, body)
    assert response.status_code == 400
    assert "has 5334 input tokens" in response.json()["error"]["message"]
    small = {"model": MODEL, "prompt": "ab" + " ab" * 100, "user": "u" * 70_000, "max_tokens": 1}
    assert (await router.http.post("/v1/completions", json=small)).status_code == 200
