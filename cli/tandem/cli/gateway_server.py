"""uvicorn's server for the gateway, with a main loop that wakes once a second instead of ten times.

uvicorn's `Server.main_loop` sleeps 0.1 s between looks at `should_exit` (refreshing the `Date`
header every tenth look). Each wake-up of an otherwise idle process costs the host CPU whatever the
callback does: about 0.2 ms on the 2-core machine of docs/router-performance.md ("An idle gateway"),
so 2 ms of CPU a second for nothing. Here the loop waits up to `TICK_S` for an event that setting
`should_exit` sets (uvicorn's signal handler does, and so may any thread), so a shutdown starts at
once, and the `Date` header is refreshed on each look, once a second as before.
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

#: Seconds between the main loop's looks when nothing asks it to stop.
TICK_S = 1.0


class GatewayServer(uvicorn.Server):
    """`uvicorn.Server` with the main loop above; otherwise the same (signals, shutdown, start-up)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._should_exit = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        super().__init__(config)

    @property  # uvicorn's is a plain attribute
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        loop, wake = self._loop, self._wake
        if value and loop is not None and wake is not None and not loop.is_closed():
            # From a signal handler or another thread alike: the set runs on the loop.
            loop.call_soon_threadsafe(wake.set)

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):  # counter 0: the Date header is refreshed on every look
            self._wake.clear()
            if self._should_exit:  # set between the look and the clear
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
