"""The simulator's HTTP API as OpenAI clients see it.

Real: the app from `create_app` served by uvicorn on 127.0.0.1 (`tests.servers.run_uvicorn`), called
with the official `openai` client (sync and async) and, for byte-level checks, with httpx. The engine
runs the tiny profile at time scale 1000. Nothing is faked; no test looks at how fast it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from tests.servers import run_uvicorn

from tandem.core.tokenizer import encode, render_chat
from tandem.sim.app import create_app
from tandem.sim.settings import SimSettings

MODEL = "qwen"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about disaggregated inference."}
]
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    settings = SimSettings(profile="tiny-cpu", served_model_name=MODEL, time_scale=1000, seed=1)
    with run_uvicorn(create_app(settings)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url) as http:
        yield http


def test_a_chat_completion_has_text_usage_and_finish_reason_length(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, extra_body=NO_EOS)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant" and choice.message.content
    assert len(encode(choice.message.content)) == 12
    assert reply.usage is not None
    prompt_tokens = len(encode(render_chat(MESSAGES)))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, 12)
    assert reply.model == MODEL and reply.id.startswith("chatcmpl-")


def test_greedy_and_seeded_requests_repeat_their_text(client: OpenAI) -> None:
    def text(temperature: float, seed: int | None = None) -> str:
        reply = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=temperature, seed=seed
        )
        return reply.choices[0].text

    assert text(0) == text(0)
    assert text(0.7, seed=5) == text(0.7, seed=5)
    assert text(0.7, seed=5) != text(0.7, seed=6)


def test_max_completion_tokens_bounds_a_chat_reply(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=3,
        extra_body=NO_EOS,
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_a_completion_prompt_may_be_token_ids(client: OpenAI) -> None:
    ids = encode("The quick brown fox")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    by_text = client.completions.create(
        model=MODEL, prompt="The quick brown fox", max_tokens=5, temperature=0
    )
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)


def test_a_stop_string_cuts_the_text_before_it(client: OpenAI) -> None:
    free = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=10, temperature=0, extra_body=NO_EOS
    )
    words = free.choices[0].text.split(" ")
    stop = " " + words[4]
    cut = client.completions.create(model=MODEL, prompt="abc", max_tokens=10, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == free.choices[0].text[: free.choices[0].text.index(stop)]


def test_a_stop_string_also_cuts_a_stream(client: OpenAI) -> None:
    free = client.completions.create(
        model=MODEL, prompt="xyz", max_tokens=10, temperature=0, extra_body=NO_EOS
    )
    stop = " " + free.choices[0].text.split(" ")[3]
    stream = client.completions.create(
        model=MODEL, prompt="xyz", max_tokens=10, temperature=0, stop=stop, stream=True
    )
    chunks = list(stream)
    assert (
        "".join(c.choices[0].text for c in chunks) == free.choices[0].text[: free.choices[0].text.index(stop)]
    )
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_completion_stream_is_sse_events_ending_with_done(http: httpx.Client) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-2])
    assert [p["choices"][0]["finish_reason"] for p in payloads] == [None, None, None, "length"]
    assert all(p["object"] == "text_completion" for p in payloads)


async def test_a_chat_stream_with_include_usage_ends_with_a_usage_chunk(base_url: str) -> None:
    async with AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=NO_EOS,
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert len(encode(text)) == 6


def test_n_other_than_1_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    assert caught.value.status_code == 400
    body = caught.value.body  # the client unwraps OpenAI's {"error": {...}}
    assert isinstance(body, dict)
    assert (body["type"], body["param"], body["code"]) == ("BadRequestError", "n", 400)


def test_an_unknown_model_is_a_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="hi")
    assert "gpt-4" in caught.value.message


def test_a_prompt_beyond_the_context_is_a_400_naming_the_limit(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=" word" * 2000, max_tokens=100)
    assert "maximum context length is 2048 tokens" in caught.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param(b"{not json", None, id="malformed-json"),
        pytest.param(
            b'{"model": "qwen", "prompt": "hi", "max_tokens": "ten"}', "max_tokens", id="wrong-type"
        ),
        pytest.param(b'{"model": "qwen"}', "prompt", id="missing-prompt"),
        pytest.param(b"[1, 2]", None, id="not-an-object"),
    ],
)
def test_malformed_bodies_are_400_in_openais_error_shape(
    http: httpx.Client, body: bytes, param: str | None
) -> None:
    response = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    if param is not None:
        assert error["param"] == param


def test_tokenize_and_detokenize_round_trip(http: httpx.Client) -> None:
    tokenized = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello, world!"}).json()
    assert tokenized == {
        "count": len(encode("Hello, world!")),
        "max_model_len": 2048,
        "tokens": encode("Hello, world!"),
        "token_strs": None,
    }
    assert http.post("/detokenize", json={"model": MODEL, "tokens": tokenized["tokens"]}).json() == {
        "prompt": "Hello, world!"
    }


def test_tokenize_counts_chat_messages_as_the_chat_endpoint_does(http: httpx.Client, client: OpenAI) -> None:
    counted = http.post("/tokenize", json={"messages": MESSAGES}).json()["count"]
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert reply.usage is not None and reply.usage.prompt_tokens == counted


def test_detokenize_refuses_ids_no_text_encodes_to(http: httpx.Client) -> None:
    response = http.post("/detokenize", json={"tokens": [0]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "tokens"


def test_models_health_and_version(client: OpenAI, http: httpx.Client) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    health = http.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert http.get("/version").json()["engine"] == "tandem-sim"


def test_the_request_id_header_is_echoed_or_generated(http: httpx.Client) -> None:
    given = http.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "a", "max_tokens": 1},
        headers={"x-request-id": "abc-123"},
    )
    assert given.headers["x-request-id"] == "abc-123"
    assert given.json()["id"] == "cmpl-abc-123"
    generated = http.post("/v1/completions", json={"model": "nope", "prompt": "a"})
    assert generated.status_code == 404 and len(generated.headers["x-request-id"]) == 32


def test_a_chat_streams_first_bytes_come_with_its_first_token() -> None:
    """vLLM sends a chat stream's opening role delta with the first output, after the prefill; a
    gateway reads a stream's first bytes as its first token (TTFT learning, queued work). So when the
    first bytes of a long prompt's stream arrive, the engine has already counted its first token."""
    settings = SimSettings(profile="qwen2.5-7b-h100", served_model_name=MODEL, time_scale=1, seed=1)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 6000}],
        "max_tokens": 2,
        "stream": True,
    }
    first_tokens = 'vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen"}'
    with (
        run_uvicorn(create_app(settings)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as reply,
    ):
        chunks = reply.iter_raw()
        first = next(chunks)
        page = http.get("/metrics").text.splitlines()
        counted = [line for line in page if line.startswith(first_tokens)]
        rest = first + b"".join(chunks)
    opening = json.loads(first.split(b"\n\n")[0].removeprefix(b"data: "))
    assert opening["choices"][0]["delta"]["role"] == "assistant"
    assert counted == [f"{first_tokens} 1.0"]
    assert rest.endswith(b"data: [DONE]\n\n")
