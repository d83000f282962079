"""A fake OpenAI endpoint for driver and CLI tests: streamed answers whose shape the test chooses.

The user message (chat) or prompt (completions) selects the behaviour:
- `hang`: never answers, until the client disconnects (the client's timeout must end it);
- `status-500`: answers 500 with an OpenAI error body;
- `error-event`: streams one token, then an SSE error event, then `[DONE]`;
- `no-done`: streams tokens and closes the body without `[DONE]`;
- `broken`: streams one token, then breaks the connection mid-body;
- `long-token`: a normal stream whose tokens are each 300,000 characters (longer than an HTTP client's
  default line limit);
- anything else: a normal stream of `max_tokens` tokens, `token_delay` seconds apart, with a
  role-only first chunk (as vLLM sends), a usage chunk when asked, then `[DONE]`.

`/metrics` serves vLLM's prefix-cache counters in Prometheus text: every answered request adds its
prompt tokens (`PROMPT_TOKENS`) to the queries and half of them to the hits. The app records each
request's body and headers in `state.received`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.responses import Response, StreamingResponse

PROMPT_TOKENS = 10


@dataclass
class FakeState:
    token_delay: float = 0.0
    received: list[tuple[dict[str, Any], dict[str, str]]] = field(default_factory=list)
    answered: int = 0


def _selector(body: dict[str, Any]) -> str:
    if "messages" in body:
        return str(body["messages"][-1]["content"])
    return str(body.get("prompt", ""))


def _chunk(body: dict[str, Any], text: str | None, *, role: bool = False) -> str:
    if "messages" in body:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
    else:
        choice = {"index": 0, "text": "" if role else text, "finish_reason": None}
    return "data: " + json.dumps({"choices": [choice], "usage": None}) + "\n\n"


def create_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    async def generate(request: Request) -> Response:
        body = await request.json()
        state.received.append((body, dict(request.headers)))
        kind = _selector(body)
        while kind == "hang" and (await request.receive())["type"] != "http.disconnect":
            pass  # like vLLM, give up only when the client leaves
        if kind == "status-500":
            error = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
            return JSONResponse(error, status_code=500)
        return StreamingResponse(_stream(body, kind), media_type="text/event-stream")

    async def _stream(body: dict[str, Any], kind: str) -> AsyncIterator[str]:
        tokens = int(body.get("max_tokens", 4))
        yield _chunk(body, None, role=True)
        for i in range(tokens):
            await asyncio.sleep(state.token_delay)
            yield _chunk(body, f" w{i}" + ("x" * 300_000 if kind == "long-token" else ""))
            if kind == "broken":
                raise ConnectionError("the fake engine breaks the stream")
            if kind == "error-event":
                yield 'data: {"error": {"message": "engine died", "code": 502}}\n\n'
                break
        if kind == "no-done":
            return
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": tokens, "total_tokens": tokens + 10}
            yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
        state.answered += 1
        yield "data: [DONE]\n\n"

    app.add_api_route("/v1/chat/completions", generate, methods=["POST"])
    app.add_api_route("/v1/completions", generate, methods=["POST"])

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        queries = state.answered * PROMPT_TOKENS
        text = (
            "# TYPE vllm:prefix_cache_queries counter\n"
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="qwen"}} {queries}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="qwen"}} {queries / 2}\n'
            "# TYPE vllm:request_success counter\n"
            f'vllm:request_success_total{{engine="0",finished_reason="length"}} {state.answered}\n'
        )
        return PlainTextResponse(text)

    return app
