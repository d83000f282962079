"""`tandem router --workers N`: N gateway processes serving one port.

The parent reserves the address (a socket bound with `SO_REUSEPORT`, not listening) and starts N
worker processes (`multiprocessing`'s spawn: a fresh interpreter each, given only the settings), each
an ordinary gateway with `RouterSettings.workers` telling it its index, the count and this run's bus
key and token (so the workers find each other, and only each other: `tandem.router.workers.bus`; the
token travels in the pickled settings, never in argv or the environment). Each worker listens on the
same address with `SO_REUSEPORT`, and the kernel spreads new connections over the workers by a hash of
their addresses: a shared accept queue instead let one worker take every connection of a client that
opens a few keep-alive connections at once (measured: all 500 requests of 8 connections on one of 2).

The parent supervises: a worker that dies is started again (after 1 s, then backing off to 30 s if
it keeps dying); a worker that exits with the configuration-error code (2) stops the whole run with
that code, since its siblings would fail the same way. SIGTERM or SIGINT to
the parent stops every worker (SIGTERM, then SIGKILL after the grace period) and exits 0.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from pydantic import SecretStr

from tandem.router.settings import RouterSettings

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

    from tandem.cli.gateway_server import GatewayServer
    from tandem.router.observe.metrics import ConnectionTally

log = logging.getLogger("tandem.router")

GRACE_S = 10.0
FIRST_RESTART_S = 1.0
MAX_RESTART_S = 30.0
EXIT_BAD_CONFIG = 2


@dataclass(frozen=True)
class WorkerPlan:
    """What a worker process needs to serve (picklable: it crosses the spawn)."""

    config_path: Path
    api_keys_file: Path | None
    settings: RouterSettings
    log_level: str
    log_format: str
    host: str = "127.0.0.1"
    port: int = 0


def bind(host: str, port: int, *, listen: bool) -> socket.socket:
    """A socket on (`host`, `port`) with `SO_REUSEPORT` (port 0: a free one), listening if asked."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


def server_config(
    app: ASGIApp,
    *,
    log_level: str,
    tally: ConnectionTally,
    header_seconds: float,
    host: str = "127.0.0.1",
    port: int = 0,
) -> uvicorn.Config:
    """uvicorn's settings for a gateway process, alone or as a worker (a worker's socket is given to
    `run`, so its host and port are unused).

    `proxy_headers` is off: the gateway reads neither the client's address nor the scheme, and the
    middleware that would rewrite them from `X-Forwarded-*` wrapped every request
    (docs/router-performance.md). Access logs are off: the gateway logs one line per request itself.
    The HTTP protocol is uvicorn's httptools one with a deadline on each request's head and a cap on
    the connections served, counted in `tally` (`tandem.cli.connections`); WebSocket is off (the
    gateway serves none, and an upgraded connection would leave the count).
    """
    import uvicorn

    from tandem.cli.connections import guarded_protocol

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(tally, header_seconds=header_seconds),
        ws="none",
        log_config=None,
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def gateway_server(
    app: ASGIApp, tally: ConnectionTally, *, settings: RouterSettings, log_level: str, host: str, port: int
) -> GatewayServer:
    """The server for one gateway process: `server_config` with `settings.access`'s limits, and the
    process's open-files limit raised for the cap (`tandem.cli.connections.open_files_for`)."""
    from tandem.cli.connections import open_files_for
    from tandem.cli.gateway_server import GatewayServer

    warning = open_files_for(tally.cap)
    if warning is not None:
        log.warning(warning)
    config = server_config(
        app,
        log_level=log_level,
        tally=tally,
        header_seconds=settings.access.header_seconds,
        host=host,
        port=port,
    )
    return GatewayServer(config)


def serve_worker(plan: WorkerPlan) -> None:
    """A worker's body: one ordinary gateway on the inherited socket (runs in the child)."""
    from tandem.cli.router import load_config
    from tandem.core.logs import configure_logging
    from tandem.router.app import create_app
    from tandem.router.observe.metrics import ConnectionTally

    configure_logging(plan.log_level, json_lines=plan.log_format == "json")
    if plan.log_level != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_config(plan.config_path)
    if plan.api_keys_file is not None:
        config = config.model_copy(update={"api_keys_file": str(plan.api_keys_file)})
    tally = ConnectionTally(cap=plan.settings.access.max_connections)  # this worker's own
    app = create_app(config, settings=plan.settings, own_process=True, connections=tally)
    server = gateway_server(
        app, tally, settings=plan.settings, log_level=plan.log_level, host=plan.host, port=plan.port
    )
    sockets = [bind(plan.host, plan.port, listen=True)]
    if plan.settings.access.metrics_port is not None:  # the diagnostics port, shared as the client one
        sockets.append(bind(plan.host, plan.settings.access.metrics_port, listen=True))
    server.run(sockets=sockets)
    if not server.started:
        raise SystemExit(1)


class Supervisor:
    """Starts, watches and stops the workers (module docstring)."""

    def __init__(self, plan: WorkerPlan, *, count: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._plan = plan
        self._clock = clock
        self._count = count
        self._key = f"{os.getpid()}-{secrets.token_hex(4)}"
        #: The bus's secret (`tandem.router.workers.peer`): travels to each worker in its pickled plan.
        self._token = SecretStr(secrets.token_hex(32))
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, BaseProcess] = {}
        self._started_at: dict[int, float] = {}
        self._restart_after: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._stopping = False

    def _start(self, index: int) -> None:
        workers = self._plan.settings.workers.model_copy(
            update={"count": self._count, "index": index, "key": self._key, "token": self._token}
        )
        plan = replace(self._plan, settings=self._plan.settings.model_copy(update={"workers": workers}))
        process = self._context.Process(
            target=serve_worker, args=(plan,), name=f"tandem-router-{index}", daemon=False
        )
        process.start()
        self._workers[index] = process
        self._started_at[index] = self._clock()
        log.info("worker started", extra={"worker": index, "pid": process.pid})

    def run(self, *, sleep: Callable[[float], None] = time.sleep) -> int:
        """Run until stopped; returns the exit code (module docstring)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for index in range(self._count):
                self._start(index)
            while not self._stopping:
                code = self._watch()
                if code is not None:
                    self._stop_all()
                    return code
                sleep(0.2)
            self._stop_all()
            return 0
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> int | None:
        now = self._clock()
        for index, process in list(self._workers.items()):
            if process.is_alive():
                if now - self._started_at[index] > MAX_RESTART_S:
                    self._backoff.pop(index, None)  # it has been serving: a later death starts afresh
                continue
            if index in self._restart_after:  # dead, its restart scheduled
                if now >= self._restart_after[index]:
                    del self._restart_after[index]
                    self._start(index)
                continue
            code = process.exitcode
            if code == EXIT_BAD_CONFIG:
                log.error("worker exited with a configuration error; stopping", extra={"worker": index})
                return EXIT_BAD_CONFIG
            delay = self._backoff.get(index, FIRST_RESTART_S / 2) * 2
            self._backoff[index] = min(MAX_RESTART_S, delay)
            self._restart_after[index] = now + self._backoff[index]
            log.warning(
                "worker died; starting it again",
                extra={"worker": index, "exit_code": code, "in_s": self._backoff[index]},
            )
        return None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _stop_all(self) -> None:
        for process in self._workers.values():
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for process in self._workers.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)
