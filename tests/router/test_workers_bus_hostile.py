"""The workers' bus against a hostile local process: strangers are refused, bad numbers are dropped.

Real: two `WorkerBus`es on abstract Unix sockets in this process, a real `VTCQueue` and `RateLimiter`
behind them, and an attacker that speaks the bus's wire format (4-byte length, msgpack) over its own
socket; as root, a second attacker runs as `nobody` in a child process. Nothing is faked but the
uid a bus expects, in the tests that name it.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgpack  # type: ignore[import-untyped]
import pytest
from tests.router.harness import FakeClock

from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.admission.ratelimit import Limits, RateLimiter
from tandem.router.workers import messages
from tandem.router.workers.bus import WorkerBus, address
from tandem.router.workers.share import ROUTE, SERVICE, apply_limits, apply_routes, apply_service

TOKEN = "f00dfeed" * 8


def _frame(body: Any) -> bytes:
    data: bytes = msgpack.packb(body)
    return struct.pack(">I", len(data)) + data


async def _connect(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, path)
    return await asyncio.open_unix_connection(sock=sock)


async def _closed_by_the_other_end(reader: asyncio.StreamReader) -> bool:
    """True once the bus closed the connection (a reset: it closed with our frames unread)."""
    try:
        return await asyncio.wait_for(reader.read(), timeout=5.0) == b""
    except ConnectionResetError:
        return True


async def _until(condition: Any) -> None:
    for _ in range(300):
        if condition():
            return
        await asyncio.sleep(0.01)


@pytest.fixture
async def target() -> AsyncIterator[tuple[WorkerBus, VTCQueue[str], list[tuple[str, list[int]]]]]:
    """Worker 1 of 2 (its sibling is never started), its fair queue and its prefix records behind it."""
    queue: VTCQueue[str] = VTCQueue()
    queue.add_service("gold", 500.0)
    routes: list[tuple[str, list[int]]] = []
    bus = WorkerBus(key=f"hostile-{os.getpid()}", index=1, count=2, token=TOKEN)
    bus.on(SERVICE, apply_service(queue.add_service))
    bus.on(ROUTE, apply_routes(lambda url, keys: routes.append((url, list(keys)))))
    await bus.start(connect_timeout_s=0.0)
    yield bus, queue, routes
    await bus.stop()


async def test_a_stranger_without_the_token_is_closed_and_changes_no_counter(
    target: tuple[WorkerBus, VTCQueue[str], list[tuple[str, list[int]]]],
) -> None:
    bus, queue, _ = target
    reader, writer = await _connect(address(f"hostile-{os.getpid()}", 1))
    writer.write(_frame("events"))  # the old hello, without a token
    writer.write(_frame([[SERVICE, {"gold": -500.0, "mallory": -1e9}]]))
    assert await _closed_by_the_other_end(reader)
    writer.close()
    assert bus.refused == 1
    assert queue.counters() == {"gold": 500.0}


async def test_a_stranger_with_a_wrong_token_or_an_oversized_hello_is_closed(
    target: tuple[WorkerBus, VTCQueue[str], list[tuple[str, list[int]]]],
) -> None:
    bus, queue, _ = target
    path = address(f"hostile-{os.getpid()}", 1)
    for first in (_frame(["0" * len(TOKEN), "events"]), struct.pack(">I", 1 << 30) + b"x" * 1024):
        reader, writer = await _connect(path)
        writer.write(first + _frame([[SERVICE, {"gold": -500.0}]]))
        assert await _closed_by_the_other_end(reader)
        writer.close()
    assert bus.refused == 2
    assert queue.counters() == {"gold": 500.0}


async def test_a_peer_with_the_token_but_another_uid_is_refused() -> None:
    """The bus expects a uid that is not ours: even the right token does not get in."""
    queue: VTCQueue[str] = VTCQueue()
    key = f"hostile-uid-{os.getpid()}"
    bus = WorkerBus(key=key, index=1, count=2, token=TOKEN, uid=os.geteuid() + 1)
    bus.on(SERVICE, apply_service(queue.add_service))
    await bus.start(connect_timeout_s=0.0)
    try:
        reader, writer = await _connect(address(key, 1))
        writer.write(_frame([TOKEN, "events"]) + _frame([[SERVICE, {"mallory": -1e9}]]))
        assert await _closed_by_the_other_end(reader)
        writer.close()
        assert bus.refused == 1
        assert queue.counters() == {}
    finally:
        await bus.stop()


async def test_a_worker_sends_nothing_to_a_listener_of_another_uid() -> None:
    """A sibling's name held by someone else (it bound first): the metrics gather skips it, and the
    listener never even receives the first frame with the token."""
    key = f"hostile-squat-{os.getpid()}"
    squatter = WorkerBus(key=key, index=1, count=2, token=TOKEN)
    squatter.answer_metrics(lambda: b"# HELP up up\n# TYPE up gauge\nup 1\n")
    await squatter.start(connect_timeout_s=0.0)
    worker = WorkerBus(key=key, index=0, count=2, token=TOKEN, uid=os.geteuid() + 1, timeout_s=2.0)
    try:
        page = await worker.gather(lambda: b"# HELP up up\n# TYPE up gauge\nup 0\n")
        await _until(lambda: squatter.refused == 1)
    finally:
        await squatter.stop()
    assert [line for line in page.decode().split("\n") if line.startswith("up")] == ['up{worker="0"} 0']
    assert squatter.refused == 1  # a connection that closed before its first frame


def _attack_as_nobody(path: str, first: bytes) -> str:
    """In a forked child running as `nobody`: connect, send `first`, and tell whether the bus
    closed the connection ("closed") or kept it ("open"); "error" when the child could not connect."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: blocking calls only, then out without running the parent's cleanup
        verdict = b"error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(path)
            try:  # the bus may close as soon as it reads the peer's uid, before or after the send
                sock.sendall(first)
                verdict = b"closed" if sock.recv(1) == b"" else b"open"
            except (BrokenPipeError, ConnectionResetError):
                verdict = b"closed"
        finally:
            os.write(write_end, verdict)
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another user needs root")
async def test_a_process_of_another_user_with_the_token_is_refused(
    target: tuple[WorkerBus, VTCQueue[str], list[tuple[str, list[int]]]],
) -> None:
    bus, queue, _ = target
    path = address(f"hostile-{os.getpid()}", 1)
    first = _frame([TOKEN, "events"]) + _frame([[SERVICE, {"mallory": -1e9}]])
    verdict = await asyncio.get_running_loop().run_in_executor(None, _attack_as_nobody, path, first)
    assert verdict == "closed"
    assert bus.refused == 1
    assert queue.counters() == {"gold": 500.0}


BAD_SERVICE = [
    {"gold": math.nan},
    {"gold": math.inf},
    {"gold": -math.inf},
    {"gold": -1e308},
    {"gold": "12"},
    {"gold": True},
    {"gold": None},
    {"gold": 1.0, "": 2.0},
    {7: 1.0},
    ["gold", 1.0],
    "gold",
]


async def test_a_sibling_event_with_a_bad_number_is_dropped_whole_and_counted(
    target: tuple[WorkerBus, VTCQueue[str], list[tuple[str, list[int]]]],
) -> None:
    bus, queue, routes = target
    _, writer = await _connect(address(f"hostile-{os.getpid()}", 1))
    events: list[Any] = [[SERVICE, payload] for payload in BAD_SERVICE]
    events += [[ROUTE, ["http://e:1", [-1]]], [ROUTE, ["file:///etc", [1]]]]
    events += [[ROUTE, ["http://e:1", [1.5, "2"]]]]
    events += [["no kind"], 42]
    writer.write(_frame([TOKEN, "events"]) + _frame(events))
    writer.write(_frame([[SERVICE, {"gold": 25.0}], [ROUTE, ["http://e:1", [1, 2]]]]))  # still heard
    await _until(lambda: queue.counter("gold") != 500.0)
    writer.close()
    assert bus.rejected == len(events)
    assert bus.refused == 0
    assert queue.counters() == {"gold": 525.0}
    assert routes == [("http://e:1", [1, 2])]


async def test_a_limits_event_with_a_negative_or_fractional_count_leaves_the_buckets_alone() -> None:
    limiter = RateLimiter(default=Limits(requests_per_minute=3), per_tenant={}, clock=FakeClock())
    apply = apply_limits(limiter.absorb)
    for payload in ({"t": [-5, 0]}, {"t": [1.5, 0]}, {"t": [1, math.nan]}, {"t": [1]}, {"t": [1 << 50, 0]}):
        with pytest.raises(messages.BadMessage):
            apply(payload)
    assert [limiter.admit("t", prompt_tokens=lambda: 1) for _ in range(3)] == [None, None, None]
    apply({"t": [1, 0]})
    assert limiter.admit("t", prompt_tokens=lambda: 1) is not None


@pytest.mark.parametrize(
    ("payload", "read"),
    [
        ({"a": 12.5, "b": -3}, {"a": 12.5, "b": -3.0}),
        ({"a": 1e12}, {"a": 1e12}),
        ({}, {}),
    ],
)
def test_valid_service_events_read_as_finite_floats(payload: Any, read: dict[str, float]) -> None:
    assert messages.service(payload) == read


@pytest.mark.parametrize("payload", [*BAD_SERVICE, {"a": 1.0000001e12}])
def test_invalid_service_events_are_rejected_whole(payload: Any) -> None:
    with pytest.raises(messages.BadMessage):
        messages.service(payload)
