"""Request checks and response shapes (`tandem.sim.protocol`, `tandem.sim.responses`).

Pure: JSON-like dicts in, `Generation`s, `APIError`s and dicts out. Nothing is faked.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest
from tandem.core.tokenizer import VOCAB_SIZE, encode, render_chat
from tandem.sim.protocol import APIError, Generation, parse_json, prepare, sse, validate
from tandem.sim.responses import ResponseMeta, chunk, full_body, usage_chunk

LIMIT = 100


def completion(**fields: Any) -> Generation:
    body = {"model": "qwen", "prompt": "hello there", **fields}
    return prepare(validate(CompletionRequest, body), served_model="qwen", max_model_len=LIMIT)


def chat(**fields: Any) -> Generation:
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **fields}
    return prepare(validate(ChatCompletionRequest, body), served_model="qwen", max_model_len=LIMIT)


def rejected(build: Any, **fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        build(**fields)
    return caught.value


@pytest.mark.parametrize(
    ("fields", "max_tokens"),
    [
        pytest.param({}, 16, id="completions-default-is-16-as-in-vllm"),
        pytest.param(
            {"max_tokens": None},
            LIMIT - len(encode("hello there")),
            id="null-is-the-rest-of-the-context",
        ),
        pytest.param({"max_tokens": 7}, 7, id="given"),
    ],
)
def test_completion_max_tokens_resolution(fields: dict[str, Any], max_tokens: int) -> None:
    assert completion(**fields).max_tokens == max_tokens


@pytest.mark.parametrize(
    ("fields", "max_tokens"),
    [
        pytest.param({}, LIMIT - len(encode(render_chat([{"role": "user", "content": "hi"}]))), id="rest"),
        pytest.param({"max_tokens": 9}, 9, id="max-tokens"),
        pytest.param({"max_tokens": 9, "max_completion_tokens": 4}, 4, id="max-completion-tokens-wins"),
    ],
)
def test_chat_max_tokens_resolution(fields: dict[str, Any], max_tokens: int) -> None:
    assert chat(**fields).max_tokens == max_tokens


@pytest.mark.parametrize(
    ("fields", "status", "param", "words"),
    [
        pytest.param({"model": "gpt-4"}, 404, "model", "does not exist", id="unknown-model"),
        pytest.param({"n": 2}, 400, "n", "n must be 1", id="n-2"),
        pytest.param({"max_tokens": 99}, 400, "max_tokens", "maximum context length is 100", id="too-long"),
        pytest.param({"prompt": "x " * 120}, 400, "messages", "maximum context length", id="prompt-too-long"),
        pytest.param({"max_tokens": "ten"}, 400, "max_tokens", "integer", id="wrong-type"),
        pytest.param({"prompt": []}, 400, "prompt", "empty", id="empty-prompt"),
        pytest.param({"prompt": ["a", "b"]}, 400, "prompt", "one prompt", id="batched-prompts"),
        pytest.param({"prompt": [5, VOCAB_SIZE]}, 400, "prompt", "out of vocabulary", id="bad-token-id"),
        pytest.param({"min_tokens": -1}, 400, "min_tokens", "non-negative", id="bad-min-tokens"),
        pytest.param({"temperature": 3}, 400, "temperature", "less than or equal", id="temperature-range"),
        pytest.param({"cache_salt": ""}, 400, "cache_salt", "non-empty string", id="empty-salt"),
        pytest.param({"cache_salt": 7}, 400, "cache_salt", "non-empty string", id="salt-not-a-string"),
        pytest.param({"cache_salt": "s" * 1025}, 400, "cache_salt", "at most 1024", id="salt-too-long"),
    ],
)
def test_bad_completion_requests_are_rejected_with_the_offending_parameter(
    fields: dict[str, Any], status: int, param: str, words: str
) -> None:
    error = rejected(completion, **fields)
    assert (error.status, error.param) == (status, param)
    assert words in error.message
    assert error.body()["error"]["code"] == status


def test_a_cache_salt_reaches_the_generation_and_none_is_no_salt() -> None:
    assert completion(cache_salt="tenant-a").cache_salt == "tenant-a"
    assert chat(cache_salt="tenant-b").cache_salt == "tenant-b"
    assert completion().cache_salt is None and completion(cache_salt=None).cache_salt is None


def test_a_prompt_may_be_token_ids_or_a_one_element_list() -> None:
    assert completion(prompt=[11, 12, 13]).prompt_token_ids == (11, 12, 13)
    assert completion(prompt=["hi you"]).prompt_token_ids == tuple(encode("hi you"))


def test_chat_prompts_are_the_rendered_template() -> None:
    gen = chat(stop=["x", "y"], seed=3, temperature=0.5, ignore_eos=True, min_tokens=2)
    assert gen.prompt_token_ids == tuple(encode(render_chat([{"role": "user", "content": "hi"}])))
    assert (gen.stop, gen.seed, gen.temperature, gen.ignore_eos, gen.min_tokens) == (
        ("x", "y"),
        3,
        0.5,
        True,
        2,
    )


def test_malformed_json_is_a_400() -> None:
    with pytest.raises(APIError) as caught:
        parse_json(b"{not json")
    assert caught.value.status == 400


def test_an_sse_event_is_one_data_line_and_a_blank_line() -> None:
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'


def test_response_shapes_follow_vllm() -> None:
    meta = ResponseMeta(kind="chat", response_id="chatcmpl-1", created=5, model="qwen", include_usage=True)
    body = full_body(
        meta, text="hi", finish_reason="stop", stop_reason=None, prompt_tokens=3, completion_tokens=1
    )
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "hi"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 4,
        "completion_tokens": 1,
        "prompt_tokens_details": None,
    }
    opening = chunk(meta, text="", role=True)
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert opening["usage"] is None and opening["object"] == "chat.completion.chunk"
    assert usage_chunk(meta, prompt_tokens=3, completion_tokens=1)["choices"] == []
    plain = ResponseMeta(kind="completion", response_id="cmpl-1", created=5, model="qwen")
    assert chunk(plain, text="a", finish_reason="length")["choices"][0]["text"] == "a"
    assert "usage" not in chunk(plain, text="a")


def test_a_chat_can_continue_its_final_message_as_vllm_does() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, wor"}]
    gen = chat(messages=messages, add_generation_prompt=False, continue_final_message=True)
    assert gen.prompt_text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello, wor"
    assert gen.prompt_token_ids == tuple(encode(gen.prompt_text))
    closed = chat(messages=messages, add_generation_prompt=False)
    assert closed.prompt_text is not None and closed.prompt_text.endswith("Hello, wor<|im_end|>\n")


def test_continuing_the_final_message_and_adding_a_generation_prompt_is_a_400() -> None:
    error = rejected(chat, continue_final_message=True)
    assert error.status == 400 and "continue_final_message" in error.message
