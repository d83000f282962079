"""Loopback ports for processes that bind them later, chosen below the kernel's ephemeral range.

A port found free by binding port 0 comes from the ephemeral range (`net.ipv4.ip_local_port_range`,
32768-60999 by default): the range the kernel also draws from for every outgoing connection and every
other port-0 bind on the host. Between choosing such a port and a child process binding it, another
process can be handed the same number. The window is long here: a vLLM engine takes tens of seconds
to start, and `tandem up` starts the router only once its engines answer. The slow tier saw it as the
router's `address already in use` after the engines had opened their own connections.

A port below the ephemeral range is only ever taken by a process that asks for that number, so one
found free there stays free until its child binds it, unless another server picks the same number.
`free_ports()` draws such ports at random (`SEARCH_LOW` up to the range's start), checks each by
binding it, and never hands out one twice. When the range leaves no room below it (a host configured
with it starting under `SEARCH_LOW + MIN_ROOM`), it falls back to port 0, as before.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

from tandem.local.plan import LOOPBACK

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default, when the file cannot be read.
DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port drawn: clear of the well-known and the usual registered service ports below it.
SEARCH_LOW = 20000
#: Fewer candidate ports than this below the range: use port 0 instead.
MIN_ROOM = 1000
#: Draws before giving up (each is a bind; a busy host has few of these ports bound).
MAX_TRIES = 2000


class NoFreePort(RuntimeError):
    """No free port was found in `MAX_TRIES` draws."""


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's ephemeral port range, `(low, high)`; Linux's default when it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL


def free_ports(
    host: str = LOOPBACK, *, rng: random.Random | None = None, path: Path = EPHEMERAL_RANGE
) -> Iterator[int]:
    """Ports on `host` that nothing holds now, below the ephemeral range, never the same one twice."""
    draw = rng or random.Random()
    low, _ = ephemeral_range(path)
    given: set[int] = set()
    if low - SEARCH_LOW < MIN_ROOM:
        while True:
            port = _any_port(host)
            if port not in given:
                given.add(port)
                yield port
    while True:
        for _ in range(MAX_TRIES):
            port = draw.randrange(SEARCH_LOW, low)
            if port not in given and bindable(host, port):
                given.add(port)
                yield port
                break
        else:
            raise NoFreePort(f"no free port on {host} in {SEARCH_LOW}-{low - 1} after {MAX_TRIES} tries")


def bindable(host: str, port: int) -> bool:
    """Whether a TCP socket can bind (`host`, `port`) now (without `SO_REUSEADDR`: a port with a
    connection still in TIME_WAIT counts as taken)."""
    with _socket(host) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _any_port(host: str) -> int:
    with _socket(host) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
