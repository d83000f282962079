"""The gateway's uvicorn server: its main loop looks once a `TICK_S`, and stops at once when asked.

Real: uvicorn on a 127.0.0.1 socket in a background thread, serving a small ASGI app; httpx as the
client. The tick is set by the test (`TICK_S`), so the checks are about what the loop waits for,
not about how fast this machine is.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import parsedate_to_datetime

import httpx
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from tandem.cli import gateway_server
from tandem.cli.gateway_server import GatewayServer


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


class CountingServer(GatewayServer):
    looks = 0

    async def on_tick(self, counter: int) -> bool:
        self.looks += 1
        return await super().on_tick(counter)


@contextmanager
def serving() -> Iterator[tuple[CountingServer, threading.Thread, str]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
    server = CountingServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_asking_the_server_to_stop_wakes_its_main_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_server, "TICK_S", 120.0)  # a stop that waited for the tick would not come
    with serving() as (server, thread, url):
        assert httpx.get(url).text == "ok"
        server.should_exit = True  # from another thread, as a signal handler or a test does
        thread.join(30)
        assert not thread.is_alive()


def test_the_main_loop_looks_once_a_tick_not_ten_times_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway_server, "TICK_S", 0.5)
    with serving() as (server, _, url):
        before = server.looks
        time.sleep(1.2)
        assert server.looks - before <= 4  # uvicorn's own loop: 12
        date = httpx.get(url).headers["date"]  # refreshed on each look
        assert abs(parsedate_to_datetime(date).timestamp() - time.time()) < 60
