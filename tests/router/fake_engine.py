"""A small fake engine speaking the OpenAI surface the router relies on, for router tests.

It answers `/v1/completions` and `/v1/chat/completions` (JSON, or SSE when `stream` is set, with the
usage chunk when `stream_options.include_usage`), `/v1/models` and `/health`. It records every
generation request (body and headers) and whether a stream was cut off by the client (`cancelled`),
and fails on demand through its mutable `Behaviour`: an error status, a slow answer (which gives up
when the client disconnects, as vLLM aborts a request), a slow stream, or dying mid-stream (the
connection breaks without the end of the chunked body). Generated text is `" <name>-<i>"` per token,
so a test can tell which engine answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tandem.core.openai_api import error_body

MODEL = "qwen"
PROMPT_TOKENS = 3


class EngineDied(Exception):
    """Raised inside a stream to make the server drop the connection mid-body."""


@dataclass
class Behaviour:
    """How the engine answers; tests may change it between requests.

    `status`: answer every generation request with this status (an OpenAI error body when >= 400).
    `tokens`: tokens generated (capped by the request's output limit, as vLLM reads it).
    `token_delay`: seconds between streamed tokens. `answer_delay`: seconds before answering at all.
    `die_after`: streamed tokens sent before the connection breaks.
    `kv_transfer_params`: returned in non-streaming answers to requests asking for a remote decode.
    """

    status: int = 200
    tokens: int = 4
    token_delay: float = 0.0
    answer_delay: float = 0.0
    die_after: int | None = None
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class Received:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class FakeEngine:
    name: str
    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a generation request came in
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)  # the client left before the end
    url: str = ""
    open_requests: int = 0  # generation requests being answered now
    most_open: int = 0  # the most it ever held at once

    def __post_init__(self) -> None:
        self.app = FastAPI()
        self.app.post("/v1/completions")(self._completions)
        self.app.post("/v1/chat/completions")(self._chat)
        self.app.get("/v1/models")(self._models)
        self.app.get("/health")(self._health)

    # -- handlers ---------------------------------------------------------------------------

    async def _completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _models(self) -> JSONResponse:
        entry = {"id": MODEL, "object": "model", "created": 0, "owned_by": "fake", "max_model_len": 4096}
        return JSONResponse({"object": "list", "data": [entry]})

    async def _health(self) -> Response:
        return Response(status_code=200)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        self.open_requests += 1
        self.most_open = max(self.most_open, self.open_requests)
        try:
            response = await self._answer_request(request, chat=chat)
        except BaseException:
            self.open_requests -= 1
            raise
        if not isinstance(response, _RecordingStream):
            self.open_requests -= 1
        return response

    async def _answer_request(self, request: Request, *, chat: bool) -> Response:
        body = await request.json()
        self.received.append(Received(request.url.path, body, dict(request.headers)))
        self.arrived.set()
        behaviour = self.behaviour
        if behaviour.answer_delay and not await self._wait_unless_disconnected(request):
            return Response(status_code=499)
        if behaviour.status >= 400:
            message = f"{self.name} fails on purpose"
            return JSONResponse(error_body(behaviour.status, message), status_code=behaviour.status)
        # vLLM's limit: on chat `max_completion_tokens or max_tokens`, on completions `max_tokens`
        limit = (body.get("max_completion_tokens") if chat else None) or body.get("max_tokens")
        n = min(behaviour.tokens, limit or behaviour.tokens)
        if body.get("stream"):
            progress = _StreamProgress()
            return _RecordingStream(self, progress, self._events(body, n=n, chat=chat, progress=progress))
        return JSONResponse(self._answer(body, n=n, chat=chat))

    async def _wait_unless_disconnected(self, request: Request) -> bool:
        deadline = asyncio.get_running_loop().time() + self.behaviour.answer_delay
        while asyncio.get_running_loop().time() < deadline:
            if await request.is_disconnected():
                self.cancelled.set()
                return False
            await asyncio.sleep(0.01)
        return True

    # -- bodies -----------------------------------------------------------------------------

    def _text(self, i: int) -> str:
        return f" {self.name}-{i}"

    def _answer(self, body: dict[str, Any], *, n: int, chat: bool) -> dict[str, Any]:
        text = "".join(self._text(i) for i in range(n))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        )
        answer: dict[str, Any] = {
            "id": f"{self.name}-answer",
            "object": "chat.completion" if chat else "text_completion",
            "created": 0,
            "model": body.get("model", MODEL),
            "choices": [choice],
            "usage": _usage(n),
        }
        requested = body.get("kv_transfer_params") or {}
        if requested.get("do_remote_decode") and self.behaviour.kv_transfer_params is not None:
            answer["kv_transfer_params"] = self.behaviour.kv_transfer_params
        return answer

    def _chunk(self, body: dict[str, Any], *, chat: bool, text: str, finish: str | None) -> bytes:
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        )
        return _sse(
            {
                "id": f"{self.name}-stream",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": body.get("model", MODEL),
                "choices": [choice],
            }
        )

    async def _events(
        self, body: dict[str, Any], *, n: int, chat: bool, progress: _StreamProgress
    ) -> AsyncIterator[bytes]:
        die_after = self.behaviour.die_after
        for i in range(n):
            if die_after is not None and i >= die_after:
                progress.died = True
                raise EngineDied(f"{self.name} died after {i} tokens")
            yield self._chunk(body, chat=chat, text=self._text(i), finish=None)
            if self.behaviour.token_delay:
                await asyncio.sleep(self.behaviour.token_delay)
        yield self._chunk(body, chat=chat, text="", finish="length")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage_chunk = {
                "id": f"{self.name}-stream",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": 0,
                "model": body.get("model", MODEL),
                "choices": [],
                "usage": _usage(n),
            }
            yield _sse(usage_chunk)
        yield b"data: [DONE]\n\n"
        progress.done = True


@dataclass
class _StreamProgress:
    done: bool = False
    died: bool = False


class _RecordingStream(StreamingResponse):
    """Marks the engine `cancelled` when its stream stops early without dying on purpose (the
    client went away: Starlette cancels the stream when it sees the disconnect)."""

    def __init__(self, engine: FakeEngine, progress: _StreamProgress, events: AsyncIterator[bytes]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self._engine = engine
        self._progress = progress

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._engine.open_requests -= 1
            if not (self._progress.done or self._progress.died):
                self._engine.cancelled.set()


def _usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
