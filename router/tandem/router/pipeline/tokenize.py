"""A big prompt's tokens, counted off the event loop: the `Parse` stage and the model-routing
stage (`pipeline.route`) call `tokenize_big` for bodies of at least `off_loop_bytes`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from tandem.router.pipeline.context import RequestContext
from tandem.router.request.context_limit import ContextLimit


async def tokenize_big(
    ctx: RequestContext, *, context: ContextLimit | None, tokenizing: asyncio.Semaphore | None
) -> None:
    """A big prompt: refused unread when it cannot fit the context (`request.context_limit`), else
    tokenized in a worker thread, one at a time (`tokenizing`), its bytes still counted in the
    reading budget, so big prompts cannot pile their tokens up in memory at once."""
    if context is not None:
        context.check_unread(ctx.body)
    if tokenizing is None:
        await asyncio.to_thread(ctx.encoded)
    else:
        async with tokenizing:
            await asyncio.to_thread(ctx.encoded)
    if context is not None and _one_prompt(ctx.body):
        context.check_tokens(ctx.prompt_length())


def _one_prompt(body: Mapping[str, object]) -> bool:
    """Whether `body` holds one prompt (a chat, a string, token ids), not a batch of them."""
    prompt = body.get("prompt")
    return not isinstance(prompt, list) or all(isinstance(t, int) for t in prompt)
