"""The bus between sibling gateway workers (`tandem router --workers N`): what one worker learns,
the others learn too, so N processes serving one port route as one gateway.

Each worker listens on a Unix socket in the abstract namespace, `@tandem-router-<key>-<index>` (no
file to clean up; `key` is unique per `tandem router` run), and keeps one connection open to each
sibling. Frames are a 4-byte big-endian length and a msgpack body.

- **Events** (`publish(kind, payload)` → every sibling's `on(kind, handler)`): buffered and sent once
  per event-loop iteration, all events of the iteration in one frame per sibling. Handlers run on
  the receiving worker's loop and must not publish (no echoes). A sibling not connected yet gets
  the events from when it is (up to `MAX_PENDING_FRAMES` frames; beyond that the oldest are dropped
  and counted in `dropped`): the pictures converge, they are not a log.
- **Metrics** (`gather(local)`): the worker that serves `/metrics` asks every sibling for its
  Prometheus text and merges the answers with its own (`tandem.router.workers.exposition`), each
  sample labelled `worker`; a sibling that does not answer within the timeout is left out.

- **Who may connect** (`tandem.router.workers.peer`): a peer of the worker's own uid (`SO_PEERCRED`,
  checked on both ends) whose first frame is `[token, purpose]` with this run's token; anything else
  is closed, counted in `refused` and logged. **What is applied** (`tandem.router.workers.messages`):
  an event whose payload is not valid (a non-finite number, a wrong type) is dropped whole, counted
  in `rejected` and logged; the connection stays open.

With one worker there is no bus (`SoloBus`: publishing does nothing, metrics are the worker's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgpack  # type: ignore[import-untyped]

from tandem.router.workers.exposition import label_worker, merge
from tandem.router.workers.messages import BadMessage
from tandem.router.workers.peer import (
    HELLO_TIMEOUT_S,
    MAX_HELLO,
    Refused,
    check_hello,
    check_peer,
    check_token,
    hello,
    own_uid,
    peer_of,
)

log = logging.getLogger("tandem.router.workers")

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
MAX_PENDING_FRAMES = 10_000
HELLO_EVENTS = "events"
HELLO_METRICS = "metrics"


class Bus(Protocol):
    """What the composition root wires: publish events, handle siblings' events, gather metrics."""

    @property
    def worker(self) -> int | None: ...

    def on(self, kind: str, handler: Callable[[Any], None]) -> None: ...

    def publish(self, kind: str, payload: Any) -> None: ...

    async def gather(self, local: Callable[[], bytes]) -> bytes: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class SoloBus:
    """One worker: nothing to share."""

    worker: int | None = None

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        return None

    def publish(self, kind: str, payload: Any) -> None:
        return None

    async def gather(self, local: Callable[[], bytes]) -> bytes:
        return local()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class ScopedBus:
    """One service's part of the process's bus, in a gateway in front of many services: its event
    kinds carry the service's name (`<scope>/<kind>`), so one service's routes and charges never
    reach another's. The gateway starts, stops and gathers through the bus itself."""

    def __init__(self, bus: Bus, scope: str) -> None:
        self._bus, self._scope = bus, scope

    @property
    def worker(self) -> int | None:
        return self._bus.worker

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        self._bus.on(f"{self._scope}/{kind}", handler)

    def publish(self, kind: str, payload: Any) -> None:
        self._bus.publish(f"{self._scope}/{kind}", payload)

    async def gather(self, local: Callable[[], bytes]) -> bytes:
        return await self._bus.gather(local)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def address(key: str, index: int) -> str:
    return f"\0tandem-router-{key}-{index}"


async def _read_frame(reader: asyncio.StreamReader, *, limit: int = MAX_FRAME) -> Any:
    size = _HEADER.unpack(await reader.readexactly(_HEADER.size))[0]
    if size > limit:
        raise ValueError(f"a frame of {size} bytes is over the limit")
    return msgpack.unpackb(await reader.readexactly(size), strict_map_key=False)


async def _open(path: str, *, uid: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to a sibling's abstract-namespace socket, whose listener runs as `uid`
    (PermissionError otherwise: someone else holds the name). The socket is made here and handed
    over: uvloop's `open_unix_connection(path)` refuses abstract names (EINVAL)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, path)
        check_peer(peer_of(sock), uid=uid)
    except Refused as exc:
        sock.close()
        raise PermissionError(f"{path[1:]}: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_unix_connection(sock=sock)


def _frame(body: Any) -> bytes:
    data: bytes = msgpack.packb(body)
    return _HEADER.pack(len(data)) + data


class _Sibling:
    """The connection to one sibling, opened (and reopened) in the background."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: asyncio.StreamWriter | None = None
        self.pending: deque[bytes] = deque(maxlen=MAX_PENDING_FRAMES)
        self.task: asyncio.Task[None] | None = None


class WorkerBus:
    """The bus of worker `index` of `count` (module docstring): `token` is this run's secret, the
    same for every worker; `uid` the only user a peer may run as (this process's, by default)."""

    def __init__(
        self,
        *,
        key: str,
        index: int,
        count: int,
        token: str,
        timeout_s: float = 1.0,
        uid: int | None = None,
    ) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} is not in [0, {count})")
        self.worker: int | None = index
        self._token = check_token(token)
        self._uid = own_uid() if uid is None else uid
        self._key = key
        self._count = count
        self._timeout = timeout_s
        self._handlers: dict[str, Callable[[Any], None]] = {}
        self._outbox: list[tuple[str, Any]] = []
        self._flush_scheduled = False
        self._siblings = [_Sibling(address(key, i)) for i in range(count) if i != index]
        self._server: asyncio.AbstractServer | None = None
        self._handlers_running: set[asyncio.Task[Any]] = set()
        self._metrics: Callable[[], bytes] = lambda: b""
        self.dropped = 0
        self.received = 0
        self.refused = 0
        self.rejected = 0

    def on(self, kind: str, handler: Callable[[Any], None]) -> None:
        self._handlers[kind] = handler

    def answer_metrics(self, local: Callable[[], bytes]) -> None:
        """What this worker sends a sibling that gathers metrics."""
        self._metrics = local

    def publish(self, kind: str, payload: Any) -> None:
        self._outbox.append((kind, payload))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._outbox:
            return
        frame = _frame(self._outbox)
        self._outbox = []
        for sibling in self._siblings:
            if sibling.writer is not None and not sibling.writer.is_closing():
                sibling.writer.write(frame)
            else:
                if len(sibling.pending) == sibling.pending.maxlen:
                    self.dropped += 1
                sibling.pending.append(frame)

    async def start(self, *, connect_timeout_s: float = 5.0) -> None:
        """Listen, then connect to every sibling; returns once all are connected (they start at the
        same time, so a worker that served before its siblings heard it would route on half a
        picture), or after `connect_timeout_s` with a warning (a sibling that does not come up)."""
        assert self.worker is not None
        self._server = await asyncio.start_unix_server(self._serve, path=address(self._key, self.worker))
        for sibling in self._siblings:
            sibling.task = asyncio.create_task(self._connect(sibling), name=f"bus-{sibling.path[1:]}")
        deadline = asyncio.get_running_loop().time() + connect_timeout_s
        while any(s.writer is None for s in self._siblings):
            if asyncio.get_running_loop().time() >= deadline:
                log.warning("bus: not every sibling worker answered; going on without them")
                return
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        for sibling in self._siblings:
            if sibling.task is not None:
                sibling.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sibling.task
            if sibling.writer is not None:
                sibling.writer.close()
        for task in list(self._handlers_running):
            task.cancel()
        if self._handlers_running:
            await asyncio.gather(*self._handlers_running, return_exceptions=True)
        if self._server is not None:
            self._server.close()

    async def _connect(self, sibling: _Sibling) -> None:
        """Keep a connection to `sibling` open, sending what waited for it first."""
        delay = 0.01
        while True:
            try:
                reader, writer = await _open(sibling.path, uid=self._uid)
            except PermissionError as exc:
                log.warning("bus: not connecting to a sibling's name held by another user: %s", exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 1.5)
                continue
            except OSError:
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 1.5)
                continue
            delay = 0.01
            writer.write(_frame(hello(self._token, HELLO_EVENTS)))
            while sibling.pending:
                writer.write(sibling.pending.popleft())
            sibling.writer = writer
            await reader.read()  # the sibling never writes on this connection: returns when it closes
            sibling.writer = None
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers_running.add(task)
            task.add_done_callback(self._handlers_running.discard)
        try:
            purpose = await self._admit(reader, writer)
            if purpose is None:
                return
            if purpose == HELLO_METRICS:
                writer.write(_frame(self._metrics()))
                await writer.drain()
                return
            while True:
                self._apply(await _read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # a sibling's bad frame must not end this worker's listening
            log.exception("bus: a sibling's frame could not be applied")
        finally:
            writer.close()

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
        """The purpose of a sibling's connection, or None once a stranger's is refused and closed."""
        try:
            check_peer(peer_of(writer.get_extra_info("socket")), uid=self._uid)
            first = await asyncio.wait_for(_read_frame(reader, limit=MAX_HELLO), HELLO_TIMEOUT_S)
            return check_hello(first, token=self._token, purposes=(HELLO_EVENTS, HELLO_METRICS))
        except (Refused, ValueError, TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            self.refused += 1
            log.warning("bus: refused a connection (%s): %r", _describe(writer), exc)
            return None

    def _apply(self, frame: Any) -> None:
        """Hand each event of a sibling's frame to its handler; a bad event is dropped whole."""
        if not isinstance(frame, list):
            frame = [frame]  # counted and dropped below, as one bad event
        for event in frame:
            self.received += 1
            try:
                if not (isinstance(event, list) and len(event) == 2 and isinstance(event[0], str)):
                    raise BadMessage("an event must be [kind, payload]")
                handler = self._handlers.get(event[0])
                if handler is not None:
                    handler(event[1])
            except BadMessage as exc:
                self.rejected += 1
                if self.rejected & (self.rejected - 1) == 0:  # the 1st, 2nd, 4th, 8th...: no flood
                    log.warning("bus: dropped a sibling's invalid event (%d so far): %s", self.rejected, exc)

    async def gather(self, local: Callable[[], bytes]) -> bytes:
        """This worker's metrics and its siblings', merged (module docstring)."""
        assert self.worker is not None
        parts: list[tuple[int, bytes]] = [(self.worker, local())]
        indices = [i for i in range(self._count) if i != self.worker]
        answers = await asyncio.gather(*(self._ask(address(self._key, i)) for i in indices))
        parts += [(i, text) for i, text in zip(indices, answers, strict=True) if text is not None]
        return merge([label_worker(text, worker=i) for i, text in parts])

    async def _ask(self, path: str) -> bytes | None:
        async def ask() -> bytes:
            reader, writer = await _open(path, uid=self._uid)
            try:
                writer.write(_frame(hello(self._token, HELLO_METRICS)))
                text = await _read_frame(reader)
                return bytes(text)
            finally:
                writer.close()

        try:
            return await asyncio.wait_for(ask(), self._timeout)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            return None


def _describe(writer: asyncio.StreamWriter) -> str:
    try:
        peer = peer_of(writer.get_extra_info("socket"))
    except OSError:
        return "peer unknown"
    return "peer unknown" if peer is None else f"peer pid {peer.pid}, uid {peer.uid}"
