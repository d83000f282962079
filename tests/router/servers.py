"""Real uvicorn servers on 127.0.0.1 inside the test's own event loop (async tests only).

`tests.servers.run_uvicorn` runs each server in a thread with its own loop; the router tests use
this in-loop variant instead because (1) the fake engines signal what they saw (a request arrived,
a stream was cancelled) with `asyncio.Event`s the test awaits, which only works on one loop, and
(2) a test starts up to five servers, and asking them all to stop at once (`Served.request_stop`)
keeps teardown to one uvicorn tick instead of one per server.

Each server gets a socket bound to a free port before it starts (no port races), runs its lifespan,
and is shut down (connections closed, lifespan ended) when the context exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp
from tests.servers import LOOPBACK, free_port


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Several servers share the test process; none may take over its signal handlers.
        yield


@dataclass(frozen=True)
class Served:
    url: str  # http://127.0.0.1:PORT
    server: uvicorn.Server

    def request_stop(self) -> None:
        """Ask the server to stop without waiting (servers notice within 0.1 s); lets a test stop
        several servers in parallel before their contexts exit."""
        self.server.should_exit = True


@contextlib.asynccontextmanager
async def serve(app: ASGIApp) -> AsyncIterator[Served]:
    """Serve `app` until the block ends (lifespan included)."""
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP, and without it every second small write waits ~40 ms for an ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", ws="none", timeout_graceful_shutdown=2
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # start-up failed: raise why
                raise RuntimeError("server stopped before it started")
            await asyncio.sleep(0.01)
        yield Served(url=f"http://{LOOPBACK}:{port}", server=server)
    finally:
        server.should_exit = True
        await task
        sock.close()


def closed_port_url() -> str:
    """The URL of a loopback port nothing listens on (connections are refused)."""
    return f"http://{LOOPBACK}:{free_port()}"
