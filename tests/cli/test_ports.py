"""Loopback ports for processes that bind later: drawn below the kernel's ephemeral range.

Real: sockets on 127.0.0.1 and the generator. The ephemeral range is a file the test writes, so the
checks do not depend on this host's setting.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from tandem.local.ports import DEFAULT_EPHEMERAL, SEARCH_LOW, bindable, ephemeral_range, free_ports


def range_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [("32768\t60999\n", (32768, 60999)), ("40000 50000", (40000, 50000)), ("", DEFAULT_EPHEMERAL),
     ("many", DEFAULT_EPHEMERAL), ("60999 32768", DEFAULT_EPHEMERAL)],
)  # fmt: skip
def test_the_ephemeral_range_is_read_from_the_kernel_file(
    tmp_path: Path, text: str, expected: tuple[int, int]
) -> None:
    assert ephemeral_range(range_file(tmp_path, text)) == expected


def test_a_missing_file_means_linuxs_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "absent") == DEFAULT_EPHEMERAL


def test_ports_are_drawn_below_the_ephemeral_range_free_and_never_twice(tmp_path: Path) -> None:
    path = range_file(tmp_path, "32768 60999")
    ports = free_ports(path=path, rng=random.Random(1))
    drawn = [next(ports) for _ in range(200)]
    assert len(set(drawn)) == len(drawn)
    assert all(SEARCH_LOW <= port < 32768 for port in drawn)
    assert all(bindable("127.0.0.1", port) for port in drawn)


def test_a_port_something_listens_on_is_skipped(tmp_path: Path) -> None:
    path = range_file(tmp_path, "32768 60999")
    first = random.Random(7).randrange(SEARCH_LOW, 32768)  # what an unobstructed draw gives first
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", first))
        except OSError:
            pytest.skip(f"port {first} is taken on this host already")
        held.listen()
        assert not bindable("127.0.0.1", first)
        port = next(free_ports(path=path, rng=random.Random(7)))
    assert port != first
    assert SEARCH_LOW <= port < 32768


def test_with_no_room_below_the_range_ports_come_from_port_0(tmp_path: Path) -> None:
    path = range_file(tmp_path, f"{SEARCH_LOW + 10} 65535")
    ports = free_ports(path=path)
    drawn = [next(ports) for _ in range(20)]
    assert len(set(drawn)) == 20
    low, high = ephemeral_range()  # this host's real range: the kernel chose them
    assert all(low <= port <= high for port in drawn)
