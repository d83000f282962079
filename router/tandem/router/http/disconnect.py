"""Abandoning work when the client leaves before its response starts.

A long prefill or a queued decode is wasted if the client has gone (closed the connection, timed
out): `until_disconnected` runs the work while listening for `http.disconnect` and cancels the work
when it comes first, which closes the upstream connections it holds. Once a streamed response has
started, Starlette's `StreamingResponse` does the listening (see `relay.RelayResponse`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

from tandem.router.errors import ClientDisconnected

T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    # The body has been read, so the next message the server has for us is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """The result of `work`, or `ClientDisconnected` (work cancelled) if the client leaves first.
    Call only after the request body has been read."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # we are being cancelled: take the work down with us
        work_task.cancel()
        raise
    finally:
        watch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch_task
    if work_task.done():
        return work_task.result()
    work_task.cancel()
    try:
        # Waits for the work's cleanup (closing upstream connections). Returns only if the work
        # finished despite the cancel; its response then goes to the closed connection, and the
        # response's own cleanup runs as usual.
        return await work_task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        raise ClientDisconnected("client disconnected before the response started") from None
