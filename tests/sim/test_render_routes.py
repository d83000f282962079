"""vLLM's render routes on the simulator: `POST /v1/completions/render` and `/v1/chat/completions/render`.

Real: the app from `create_app` served by uvicorn on 127.0.0.1, called with httpx; the engine runs the
tiny profile at time scale 1000. The expected wire format (keys, their order, the sampling fields vLLM
writes and leaves out) was read off vLLM 0.32's own render server (`vllm launch render`) answering
the same requests; vLLM itself is not installed here, so the tests assert those fields directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.servers import run_uvicorn

from tandem.core.tokenizer import encode, render_chat
from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings

MODEL = "qwen"
MAX_MODEL_LEN = 2048
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about disaggregated inference."},
]
PROMPT = "Once upon a time, in a cluster far away"
#: vLLM 0.32's `GenerateRequest.model_dump()`, in its order.
GENERATE_REQUEST_KEYS = [
    "request_id",
    "token_ids",
    "token_offsets",
    "features",
    "content_parts",
    "sampling_params",
    "model",
    "reasoning_ended",
    "reasoning_parser_kwargs",
    "return_token_ids",
    "output_mode",
    "stream",
    "stream_options",
    "cache_salt",
    "priority",
    "kv_transfer_params",
    "ec_transfer_params",
]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    settings = SimSettings(
        profile="tiny-cpu", served_model_name=MODEL, max_model_len=MAX_MODEL_LEN, time_scale=1000, seed=1
    )
    with run_uvicorn(create_app(settings)) as url, httpx.Client(base_url=url) as client:
        yield client


def render_completion(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/completions/render", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    items = response.json()
    assert isinstance(items, list) and len(items) == 1
    item: dict[str, Any] = items[0]
    return item


def render_chat_request(http: httpx.Client, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/chat/completions/render", json={"model": MODEL, "messages": MESSAGES, **body})
    assert response.status_code == 200, response.text
    item: dict[str, Any] = response.json()
    return item


def test_completion_render_ids_are_the_tokenize_ids_in_a_list_of_one(http: httpx.Client) -> None:
    tokenized = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()["tokens"]
    rendered = render_completion(http, prompt=PROMPT)
    assert rendered["token_ids"] == tokenized == encode(PROMPT)


def test_chat_render_ids_are_the_tokenize_ids_and_what_the_engine_counts(http: httpx.Client) -> None:
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()["tokens"]
    rendered = render_chat_request(http)
    assert rendered["token_ids"] == tokenized == encode(render_chat(MESSAGES))
    reply = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1})
    assert reply.json()["usage"]["prompt_tokens"] == len(rendered["token_ids"])


def test_a_token_id_prompt_renders_to_itself(http: httpx.Client) -> None:
    ids = encode(PROMPT)
    assert render_completion(http, prompt=ids)["token_ids"] == ids


@pytest.mark.parametrize("route", ["completion", "chat"])
def test_the_body_has_vllms_generate_request_fields_in_order(http: httpx.Client, route: str) -> None:
    rendered = render_completion(http, prompt=PROMPT) if route == "completion" else render_chat_request(http)
    assert list(rendered) == GENERATE_REQUEST_KEYS
    assert rendered["model"] == MODEL and rendered["output_mode"] == "tokens"
    assert rendered["stream"] is False and rendered["priority"] == 0
    nulls = ["token_offsets", "features", "content_parts", "reasoning_ended", "reasoning_parser_kwargs"]
    nulls += ["return_token_ids", "stream_options", "cache_salt", "kv_transfer_params", "ec_transfer_params"]
    assert all(rendered[key] is None for key in nulls)


def test_a_plain_completion_has_vllms_default_sampling_params(http: httpx.Client) -> None:
    # max_tokens is the completion default (16), which vLLM's encoder leaves out.
    assert render_completion(http, prompt=PROMPT)["sampling_params"] == {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "min_p": 0.0,
        "stop": [],
        "stop_token_ids": [],
        "output_kind": 2,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }


def test_a_chat_without_a_limit_may_use_the_rest_of_the_context(http: httpx.Client) -> None:
    rendered = render_chat_request(http)
    assert rendered["sampling_params"]["max_tokens"] == MAX_MODEL_LEN - len(rendered["token_ids"])


def test_set_sampling_fields_appear_and_a_stream_asks_for_deltas(http: httpx.Client) -> None:
    params = render_completion(
        http,
        prompt=PROMPT,
        max_tokens=100,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop="!",
        ignore_eos=True,
        min_tokens=2,
        stream=True,
    )["sampling_params"]
    assert (params["temperature"], params["top_p"], params["seed"]) == (0.5, 0.9, 7)
    assert (params["stop"], params["ignore_eos"], params["min_tokens"]) == (["!"], True, 2)
    assert (params["max_tokens"], params["output_kind"]) == (100, 1)


def test_a_greedy_request_leaves_out_top_p_and_min_p(http: httpx.Client) -> None:
    params = render_chat_request(http, temperature=0, top_p=0.5)["sampling_params"]
    assert params["temperature"] == 0.0
    assert "top_p" not in params and "min_p" not in params


def test_stream_options_are_repeated_only_for_a_stream(http: httpx.Client) -> None:
    options = {"include_usage": True}
    streamed = render_chat_request(http, stream=True, stream_options=options)
    assert streamed["stream"] is True
    assert streamed["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    assert render_chat_request(http, stream=False, stream_options=options)["stream_options"] is None


def test_cache_salt_and_priority_are_repeated(http: httpx.Client) -> None:
    rendered = render_completion(http, prompt=PROMPT, cache_salt="salt", priority=-3)
    assert (rendered["cache_salt"], rendered["priority"]) == ("salt", -3)


def test_the_request_id_comes_from_the_header_then_the_body_then_the_response_header(
    http: httpx.Client,
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "request_id": "from-body"}
    by_header = http.post("/v1/chat/completions/render", json=body, headers={"x-request-id": "from-header"})
    assert by_header.json()["request_id"] == "chatcmpl-from-header"
    assert http.post("/v1/chat/completions/render", json=body).json()["request_id"] == "chatcmpl-from-body"
    fresh = http.post("/v1/completions/render", json={"model": MODEL, "prompt": PROMPT})
    assert fresh.json()[0]["request_id"] == f"cmpl-{fresh.headers['x-request-id']}"


BAD_REQUESTS = [
    ("completion", {"model": "other", "prompt": PROMPT}, 404, "model"),
    ("chat", {"model": "other", "messages": MESSAGES}, 404, "model"),
    ("completion", {"model": MODEL}, 400, "prompt"),
    ("completion", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("completion", {"model": MODEL, "prompt": ["one", "two"]}, 400, "prompt"),
    ("completion", {"model": MODEL, "prompt": [0]}, 400, "prompt"),
    ("chat", {"model": MODEL, "messages": []}, 400, "messages"),
    ("chat", {"model": MODEL}, 400, "messages"),
    ("completion", {"model": MODEL, "prompt": PROMPT, "n": 2}, 400, "n"),
    ("completion", {"model": MODEL, "prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ("completion", {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("completion", {"model": MODEL, "prompt": "word " * MAX_MODEL_LEN}, 400, "messages"),
    ("chat", {"model": MODEL, "messages": MESSAGES, "cache_salt": ""}, 400, "cache_salt"),
    ("chat", {"model": MODEL, "messages": MESSAGES, "priority": "high"}, 400, "priority"),
]


@pytest.mark.parametrize(("route", "body", "status", "param"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors_naming_the_parameter(
    http: httpx.Client, route: str, body: dict[str, Any], status: int, param: str
) -> None:
    path = "/v1/completions/render" if route == "completion" else "/v1/chat/completions/render"
    response = http.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (status, param)
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError") and error["message"]


def test_a_body_that_is_not_json_is_a_400(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions/render", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == 400
