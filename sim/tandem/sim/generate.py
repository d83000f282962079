"""`POST /v1/completions` and `POST /v1/chat/completions`: check, consult the KV pool, run, respond.

A request's way: parse and check it (`protocol.prepare`); as a KV consumer, find how much of the
prompt the pool holds beyond the local prefix cache and fetch it; submit it to the engine loop; turn
its outputs into one JSON body or an SSE stream. As a KV producer, the prompt's chunks are written
to the pool once the prompt is computed (at the first token), and the write is awaited before the
final body or the stream's last chunk, so whoever reads the response can rely on the pool.
If the client goes away mid-stream, the request is aborted in the engine.
A request whose `model` names a LoRA adapter runs under it (`SimApp.resolve_model`) and uses the KV
pool in its adapter's scope both ways, as Tandem's connector does (`PoolScope(cache_salt=...,
lora_name=...)`): the base model's and each adapter's chunks of one prompt are different keys.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from tandem.core.logs import REQUEST_ID
from tandem.core.openai_api import ChatCompletionRequest, CompletionRequest, error_body
from tandem.kvpool.keys import PoolScope
from tandem.sim.engine.generation import garbled, stream_seed
from tandem.sim.engine.loop import EngineDead, RequestStream
from tandem.sim.engine.lora import LoRARef
from tandem.sim.engine.requests import NewRequest, RequestOutput, SamplingParams
from tandem.sim.kvpool import PoolRead
from tandem.sim.middleware import log_fields
from tandem.sim.protocol import SSE_DONE, Generation, parse_json, prepare, sse, validate
from tandem.sim.responses import ResponseMeta, chunk, full_body, usage_chunk
from tandem.sim.state import Runtime, SimApp, sim_state
from tandem.sim.tracing import RequestSpan, request_traceparent

logger = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _generate(request: Request, *, chat: bool) -> Response:
    arrival_ns = time.time_ns()
    sim = sim_state(request)
    runtime = sim.running()
    body = parse_json(await request.body())
    parsed = validate(ChatCompletionRequest, body) if chat else validate(CompletionRequest, body)
    lora = sim.resolve_model(parsed.model)
    gen = prepare(
        parsed,
        served_model=sim.settings.served_model_name,
        max_model_len=sim.settings.max_model_len,
        adapter=lora.name if lora is not None else None,
    )
    # Adapters use the pool too, in their own scope, as Tandem's connector keys vLLM's request.
    scope = PoolScope(
        cache_salt=gen.cache_salt,
        lora_name=lora.name if lora is not None else None,
        kv_layout=sim.settings.kv_layout,
    )
    found = await _pool_lookup(runtime, gen, lora, scope) if sim.settings.consumes_kv else None
    pool_tokens = None if found is None else found.tokens
    foreign = found is not None and found.foreign_chunks > 0
    engine_id = uuid.uuid4().hex
    sampling = _sampling(sim, gen, lora, foreign=foreign)
    stream = runtime.loop.submit(
        NewRequest(engine_id, gen.prompt_token_ids, sampling, pool_tokens, gen.cache_salt, lora)
    )
    fields = log_fields(request)
    fields.update(prompt_tokens=len(gen.prompt_token_ids), kv_pool_tokens=pool_tokens, stream=gen.stream)
    if foreign and found is not None:
        logger.warning(
            "loaded KV another generation wrote: the answer is garbage",
            extra={**fields, "foreign_chunks": found.foreign_chunks},
        )
    if lora is not None:
        fields.update(lora_name=lora.name)
    meta = ResponseMeta(
        kind=gen.kind,
        response_id=f"{'chatcmpl' if chat else 'cmpl'}-{REQUEST_ID.get() or engine_id}",
        created=int(time.time()),
        model=lora.name if lora is not None else sim.settings.served_model_name,
        include_usage=gen.include_usage,
    )
    job = _Job(
        sim=sim,
        runtime=runtime,
        gen=gen,
        stream=stream,
        engine_id=engine_id,
        fields=fields,
        pool_scope=scope,
    )
    if sim.tracer is not None:
        job.span = RequestSpan(
            request_id=meta.response_id, model=meta.model, traceparent=request_traceparent(request.headers),
            arrival_ns=arrival_ns, first_token_ns=None, prompt_tokens=len(gen.prompt_token_ids),
            completion_tokens=0, max_tokens=gen.max_tokens, temperature=gen.temperature,
            top_p=body.get("top_p") if isinstance(body, dict) else None,
        )  # fmt: skip
    if gen.stream:
        return StreamingResponse(job.events(meta), media_type="text/event-stream")
    return JSONResponse(await job.collect(meta))


def _sampling(sim: SimApp, gen: Generation, lora: LoRARef | None, *, foreign: bool) -> SamplingParams:
    """`foreign`: the prompt's KV came partly from another generation (`generation.garbled`)."""
    seed = stream_seed(
        gen.prompt_token_ids,
        temperature=gen.temperature,
        seed=gen.seed,
        entropy=sim.rng.getrandbits(64),
        adapter=lora.name if lora is not None else None,
    )
    return SamplingParams(
        max_tokens=gen.max_tokens,
        stream_seed=garbled(seed) if foreign else seed,
        stop=gen.stop,
        ignore_eos=gen.ignore_eos,
        min_tokens=gen.min_tokens,
    )


async def _pool_lookup(
    runtime: Runtime, gen: Generation, lora: LoRARef | None, scope: PoolScope
) -> PoolRead | None:
    """Prompt tokens the pool holds in `scope` and the shell fetched (None: no pool, or it is down)."""
    if runtime.pool is None:
        return None
    local = runtime.loop.core.local_prefix_tokens(gen.prompt_token_ids, cache_salt=gen.cache_salt, lora=lora)
    return await runtime.pool.read(gen.prompt_token_ids, skip_tokens=local, scope=scope)


@dataclass
class _Job:
    """One submitted request on its way back to the client."""

    sim: SimApp
    runtime: Runtime
    gen: Generation
    stream: RequestStream
    engine_id: str
    fields: dict[str, Any]
    pool_scope: PoolScope = field(default_factory=PoolScope)  # the request's salt and adapter
    store: asyncio.Task[None] | None = field(default=None)
    #: The request's span so far (`--otlp-traces-endpoint`), None when not traced.
    span: RequestSpan | None = None

    async def collect(self, meta: ResponseMeta) -> dict[str, Any]:
        parts: list[str] = []
        last: RequestOutput | None = None
        finished = False
        try:
            async for output in self.stream:
                await self._on_output(output)
                parts.append(output.text_delta)
                last = output
            finished = True
        finally:
            if not finished:
                self.runtime.loop.abort(self.engine_id)
        assert last is not None  # a stream always ends with a finishing output
        return full_body(
            meta,
            text=self._echo() + "".join(parts),
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            prompt_tokens=last.num_prompt_tokens,
            completion_tokens=last.num_output_tokens,
        )

    async def events(self, meta: ResponseMeta) -> AsyncIterator[bytes]:
        finished = False
        try:
            # vLLM opens a chat stream with the role delta when the first output arrives, after the
            # prefill: a gateway reads a stream's first bytes as its first token.
            opening = meta.kind == "chat"
            prefix = self._echo()
            async for output in self.stream:
                await self._on_output(output)
                if opening:
                    opening = False
                    yield sse(chunk(meta, text="", role=True))
                if output.text_delta or output.finished or prefix:
                    text, prefix = prefix + output.text_delta, ""
                    yield sse(
                        chunk(
                            meta,
                            text=text,
                            finish_reason=output.finish_reason,
                            stop_reason=output.stop_reason,
                        )
                    )
                if output.finished:
                    finished = True
                    if meta.include_usage:
                        yield sse(
                            usage_chunk(
                                meta,
                                prompt_tokens=output.num_prompt_tokens,
                                completion_tokens=output.num_output_tokens,
                            )
                        )
            yield SSE_DONE
        except EngineDead as exc:  # headers are sent: report in-band, as vLLM does
            yield sse(error_body(500, str(exc)))
            yield SSE_DONE
        finally:
            if not finished:
                self.runtime.loop.abort(self.engine_id)

    def _echo(self) -> str:
        return (self.gen.prompt_text or "") if self.gen.echo else ""

    async def _on_output(self, output: RequestOutput) -> None:
        """Start the producer's pool write when the prompt is done; finish it before the end."""
        pool = self.runtime.pool
        if self.store is None and pool is not None and self.sim.settings.produces_kv:
            self.store = self.runtime.spawn(pool.store(self.gen.prompt_token_ids, scope=self.pool_scope))
        span = self.span
        if span is not None and span.first_token_ns is None:
            span = self.span = replace(span, first_token_ns=time.time_ns())
        if output.finished:
            if self.store is not None:
                await asyncio.shield(self.store)  # a cancelled client must not cancel the write
            self.fields.update(completion_tokens=output.num_output_tokens, finish_reason=output.finish_reason)
            if span is not None and self.sim.tracer is not None:  # vLLM traces finished requests only
                self.sim.tracer.finished(replace(span, completion_tokens=output.num_output_tokens))
