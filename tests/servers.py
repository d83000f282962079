"""Real servers on 127.0.0.1 for component tests, shared by every test package.

- `run_uvicorn(app)`: serves an ASGI app with uvicorn in a background thread (its own event loop, the
  app's lifespan run), yields the base URL, and shuts it down (connections drained, lifespan ended).
  It is a plain context manager, so sync and async tests can both use it; the socket is bound before
  the server starts, so there is no port race.
- `run_redis_server()`: a throwaway `redis-server` child process (no persistence), stopped by its pid.
- `free_port()`: a loopback port that nothing holds now, below the ephemeral range, never the same twice
  in a run (for a child server's port, or a "nothing listens here" URL).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import redis
import uvicorn
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.types import ASGIApp

from tandem.local.binaries import find_redis_server
from tandem.local.ports import free_ports

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 15.0


# One draw for the whole test run, so no two calls give the same port.
_PORTS = free_ports(LOOPBACK)


def free_port() -> int:
    """A loopback port nothing holds now, below the ephemeral range (`tandem.local.ports`): no outgoing
    connection or port-0 bind is handed it before the test's server binds it."""
    return next(_PORTS)


def unretried_redis(port: int, *, password: str | None = None) -> redis.Redis:
    """A client of the Redis on 127.0.0.1:`port` that does not retry: redis-py retries an
    authentication error with backoff by default (about 4 s before it raises), and a test of a
    refused client wants the refusal itself (as Tandem's own clients, `tandem.kvpool.client`)."""
    return redis.Redis(port=port, password=password, retry=Retry(NoBackoff(), 0))


@contextlib.contextmanager
def run_uvicorn(app: ASGIApp, *, graceful_timeout_s: int = 5) -> Iterator[str]:
    """Serve `app` until the block ends; yields `http://127.0.0.1:PORT`. Start-up errors raise here."""
    # With an explicit IPPROTO_TCP asyncio sets TCP_NODELAY on accepted connections (no 40 ms Nagle stalls).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=graceful_timeout_s,
    )
    server = uvicorn.Server(config)  # off the main thread, uvicorn leaves signal handlers alone
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                # A failed lifespan start-up ends the thread (uvicorn logs why).
                raise RuntimeError(f"uvicorn did not start on port {port}")
            time.sleep(0.005)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(graceful_timeout_s + 5)
        sock.close()


@dataclass(frozen=True)
class RedisServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        """A new synchronous client (close it when done)."""
        return redis.Redis(host=self.host, port=self.port)


@contextlib.contextmanager
def run_redis_server(*, port: int | None = None, binary: str | None = None) -> Iterator[RedisServer]:
    """A fresh redis-server on `port` (default: a free one) of 127.0.0.1, without persistence;
    stopped afterwards."""
    path = binary or find_redis_server()
    if path is None:
        raise FileNotFoundError("redis-server not found")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="tandem-redis-") as workdir:
        argv = [path, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no"]
        argv += ["--dir", workdir]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            server = RedisServer(LOOPBACK, port)
            _wait_for_redis(server, process)
            yield server
        finally:
            stop_process(process)


def stop_process(process: subprocess.Popen[Any], *, timeout_s: float = 5.0) -> None:
    """Ask a child to stop (SIGTERM), kill it if it has not after `timeout_s`, and reap it."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_for_redis(server: RedisServer, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with server.client() as client:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {server.port}") from None
                time.sleep(0.01)


def wait_healthy(url: str, process: subprocess.Popen[str], *, timeout_s: float = 90.0) -> None:
    """Poll `url/health` until it answers 200; fail if `process` exits first or `timeout_s` passes.

    The deadline is generous because a loaded CI machine starts Python processes slowly.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server behind {url} exited early"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not become healthy within {timeout_s:.0f}s")
