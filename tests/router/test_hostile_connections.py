"""Clients that hold connections instead of sending requests: each attack as a raw socket sends it,
and the gateway's answer (`tandem.cli.connections`: a deadline on each request's head, a cap on the
connections one process serves).

Real: `tandem router` as a child process (one process, then two workers) in front of one simulated
engine process (`tests.router.processes`), raw TCP sockets on 127.0.0.1 as the hostile clients and
httpx as the ordinary one. Nothing is faked; the header deadline is shortened to 1 s and every wait
for the gateway has a generous deadline (its deadline plus 5 s).
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.processes import Child, router_process, sim_processes, static_router_config

HEADER_S = 1.0
CAP = 4
#: uvicorn's `timeout_keep_alive` (the gateway keeps its default).
KEEP_ALIVE_S = 5.0
#: Beyond a deadline, how long the gateway may take to act on it.
SLACK_S = 5.0
HEALTH = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
#: A generation request whose body never comes: the body has its own, longer deadline (60 s).
HELD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n{"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    with sim_processes(tmp_path_factory.mktemp("engine"), ["d0"], time_scale=100.0) as [child]:
        yield child


def _config(tmp_path: Path, engine: Child) -> Path:
    return static_router_config(tmp_path, engine, service="connections")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: Child) -> Iterator[Child]:
    """One gateway process: a 1 s header deadline, at most `CAP` connections."""
    tmp_path = tmp_path_factory.mktemp("gateway")
    flags = ["--header-seconds", str(HEADER_S), "--max-connections", str(CAP)]
    with router_process(tmp_path, _config(tmp_path, engine), *flags) as child:
        yield child


def _connect(child: Child) -> socket.socket:
    host, port = child.name.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_end(sock: socket.socket, *, timeout_s: float) -> bytes:
    """What the gateway sends until it closes the connection (or `timeout_s` passes)."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _read_response(sock: socket.socket) -> bytes:
    """One whole response on a kept-alive connection: its head and `content-length` bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n") if b"content-length:" in line.lower()]
    length = int(lengths[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head


def _metric(child: Child, name: str, **labels: str) -> float:
    """The sum of the gateway's samples called `name` whose labels include `labels`."""
    text = httpx.get(f"{child.url}/metrics", timeout=10, trust_env=False).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def _served(child: Child, *, timeout_s: float) -> bool:
    """Whether a new connection's GET /health is answered 200 within `timeout_s` (retrying a 503)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{child.url}/health", timeout=5, trust_env=False).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    ("opening", "trickle"),
    [(b"GET /health HTTP/1.1\r\nHost: gateway\r\n", b"x"), (b"", b"")],
    ids=["a header byte every 0.3 s", "nothing at all"],
)
def test_a_connection_that_never_finishes_its_head_is_answered_408_and_closed_while_others_are_served(
    gateway: Child, opening: bytes, trickle: bytes
) -> None:
    before = _metric(gateway, "tandem_router_connections_refused_total", reason="header_deadline")
    answer = b""
    with _connect(gateway) as slow, httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as client:
        slow.sendall(opening)
        started = time.monotonic()
        while time.monotonic() - started < HEADER_S + SLACK_S:
            assert client.get("/health").status_code == 200  # an ordinary client is served throughout
            if select.select([slow], [], [], 0.3)[0]:
                answer = _read_to_end(slow, timeout_s=SLACK_S)  # the 408, then the end
                break
            slow.sendall(trickle)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"\r\nconnection: close\r\n" in answer.lower()
    after = _metric(gateway, "tandem_router_connections_refused_total", reason="header_deadline")
    assert after == before + 1


def test_connections_over_the_cap_are_answered_503_and_new_ones_are_served_once_some_close(
    gateway: Child,
) -> None:
    before = _metric(gateway, "tandem_router_connections_refused_total", reason="cap")
    assert _metric(gateway, "tandem_router_connections_max") == CAP
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=10) as client:
        assert client.get("/health").status_code == 200  # one kept-alive connection
        held = [_connect(gateway) for _ in range(CAP - 1)]  # and these: CAP served
        try:
            for sock in held:
                sock.sendall(HELD)
            with _connect(gateway) as extra:
                extra.sendall(HEALTH)
                answer = _read_to_end(extra, timeout_s=SLACK_S)
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
            assert b"\r\nretry-after: 1\r\n" in answer.lower()
            assert b"\r\nconnection: close\r\n" in answer.lower()
            # A connection already served is served on (uvicorn's limit_concurrency would refuse it).
            assert client.get("/health").status_code == 200
        finally:
            for sock in held[:2]:
                sock.close()
        try:
            assert _served(gateway, timeout_s=SLACK_S)  # two have closed: room again
        finally:
            for sock in held[2:]:
                sock.close()
    assert _metric(gateway, "tandem_router_connections_refused_total", reason="cap") >= before + 1


def test_a_kept_alive_connection_idles_until_the_keep_alive_timeout_but_a_next_head_has_the_deadline(
    gateway: Child,
) -> None:
    with _connect(gateway) as idle:
        idle.sendall(HEALTH)
        assert _read_response(idle).startswith(b"HTTP/1.1 200 ")
        time.sleep(HEADER_S + 1)  # idle between requests: no head has started
        idle.sendall(HEALTH)
        assert _read_response(idle).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        assert _read_to_end(idle, timeout_s=KEEP_ALIVE_S + SLACK_S) == b""  # closed quietly by uvicorn
        assert time.monotonic() - started < KEEP_ALIVE_S + SLACK_S
    for stall in (b"GET /health HTTP/1.1\r\nHost: gateway\r\n", b"\r\n"):  # a head begun; a blank line
        with _connect(gateway) as sock:
            sock.sendall(HEALTH)
            assert _read_response(sock).startswith(b"HTTP/1.1 200 ")
            sock.sendall(stall)
            answer = _read_to_end(sock, timeout_s=HEADER_S + SLACK_S)
        assert answer.startswith(b"HTTP/1.1 408 "), (stall, answer[:200])


def test_each_worker_serves_up_to_the_cap_itself(tmp_path: Path, engine: Child) -> None:
    """With two workers and a cap of 1, the kernel spreads 16 held connections over both: exactly
    two are served (one per worker; all 16 on one worker has odds of 2 in 65,536), the rest are
    refused, and each worker shows its own cap."""
    flags = ["--workers", "2", "--max-connections", "1"]
    with router_process(tmp_path, _config(tmp_path, engine), *flags) as gateway:
        held = [_connect(gateway) for _ in range(16)]
        try:
            for sock in held:
                sock.sendall(HELD)
            time.sleep(2.0)
            # A refused connection has its 503 (or, past the lingering ones, its end) to read.
            refused = select.select(held, [], [], 0)[0]
        finally:
            for sock in held:
                sock.close()
        assert len(held) - len(refused) == 2, len(refused)
        assert _served(gateway, timeout_s=SLACK_S)
        assert _metric(gateway, "tandem_router_connections_max", worker="0") == 1
        assert _metric(gateway, "tandem_router_connections_max", worker="1") == 1
        assert _metric(gateway, "tandem_router_connections_refused_total", reason="cap") >= 14
