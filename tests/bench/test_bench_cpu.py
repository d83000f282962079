"""A process tree's CPU time: parsing /proc/<pid>/stat, summing a subtree (and several, for gateway
replicas), the per-1,000 figure, and reading the real /proc.

Real: `tandem.bench.cpu`'s pure functions on hand-written stat lines and tables; /proc of this
machine for this test process and for a child Python that starts a busy grandchild (both stopped by
pid at the end). Nothing is faked; the /proc tests assert only that time is non-negative and grows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem.bench.cpu import (
    cpu_per_1000,
    forest_ticks,
    parse_stat,
    read_table,
    subtree_ticks,
    tree_cpu_seconds,
    trees_cpu_seconds,
)

STAT_TAIL = "S 7 42 42 0 -1 4194304 100 0 0 0 5 3 1 1 20 0 1 0 82240 3133440 359"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"42 (python3) {STAT_TAIL}", (42, 7, 10)),
        (f"42 (a b) c) {STAT_TAIL}", (42, 7, 10)),
        (f"42 (granian (w1)) {STAT_TAIL}\n", (42, 7, 10)),
        ("42 (python3) S 7 42", None),
        (f"x (python3) {STAT_TAIL}", None),
        (f"42 python3 {STAT_TAIL}", None),
        ("42 (python3) S 7 42 42 0 -1 0 0 0 0 0 five 3 1 1", None),
    ],
)  # fmt: skip
def test_a_stat_line_gives_pid_parent_and_user_system_ticks_with_waited_children(
    line: str, expected: tuple[int, int, int] | None
) -> None:
    assert parse_stat(line) == expected


TABLE = {1: (0, 5), 10: (1, 7), 11: (10, 2), 12: (11, 4), 13: (1, 100), 14: (13, 50)}


@pytest.mark.parametrize(
    ("table", "root", "expected"),
    [
        (TABLE, 10, 7 + 2 + 4),
        (TABLE, 11, 2 + 4),
        (TABLE, 12, 4),
        (TABLE, 13, 150),
        (TABLE, 1, 168),
        (TABLE, 99, None),
        ({5: (6, 1), 6: (5, 2)}, 5, 3),
        ({}, 1, None),
    ],
)
def test_a_subtree_sums_the_root_and_every_descendant_and_nothing_else(
    table: dict[int, tuple[int, int]], root: int, expected: int | None
) -> None:
    assert subtree_ticks(table, root) == expected


@pytest.mark.parametrize(
    ("roots", "expected"),
    [
        ((10, 13), (7 + 2 + 4) + 150),
        ((10, 11), 7 + 2 + 4),
        ((1, 13), 168),
        ((10, 99), None),
        ((), None),
    ],
)
def test_the_replicas_of_a_gateway_sum_their_trees_counting_each_process_once(
    roots: tuple[int, ...], expected: int | None
) -> None:
    assert forest_ticks(TABLE, roots) == expected


@pytest.mark.parametrize(
    ("before", "after", "requests", "expected"),
    [
        (12.30, 13.05, 500, {"cpu_s": 0.75, "requests_sent": 500, "cpu_s_per_1000": 1.5}),
        (1.0, 1.0, 10, {"cpu_s": 0.0, "requests_sent": 10, "cpu_s_per_1000": 0.0}),
        (1.0, 2.0, 0, {"cpu_s": 1.0, "requests_sent": 0, "cpu_s_per_1000": None}),
        (None, 2.0, 10, {"cpu_s": None, "requests_sent": 10, "cpu_s_per_1000": None}),
        (1.0, None, 10, {"cpu_s": None, "requests_sent": 10, "cpu_s_per_1000": None}),
        (2.0, 1.0, 10, {"cpu_s": None, "requests_sent": 10, "cpu_s_per_1000": None}),
    ],
)
def test_cpu_per_1000_requests_is_the_difference_over_the_requests_sent(
    before: float | None, after: float | None, requests: int, expected: dict[str, Any]
) -> None:
    got = cpu_per_1000(before, after, requests=requests)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == (value if value is None else pytest.approx(value))


def test_this_process_has_used_some_cpu_and_a_missing_one_none(tmp_path: Path) -> None:
    mine = tree_cpu_seconds(os.getpid())
    assert mine is not None and mine > 0, "importing pytest alone takes more than a 10 ms tick"
    assert os.getpid() in read_table()
    assert tree_cpu_seconds(os.getpid(), proc=tmp_path) is None, "no /proc there"
    both = trees_cpu_seconds((os.getpid(), os.getppid()))
    assert both is not None and both >= mine, "this process and its parent's tree, which holds it"


# The child waits on a grandchild that spins until the file named in argv[1] exists.
SPIN = "import os, sys\nwhile not os.path.exists(sys.argv[1]): pass\n"
PARENT = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]])\n"


@pytest.fixture
def busy_tree(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    stop = tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", PARENT, SPIN, str(stop)])
    try:
        yield child.pid, stop
    finally:
        stop.touch()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def test_a_busy_grandchild_counts_in_its_grandparents_tree_and_still_does_once_it_ended(
    busy_tree: tuple[int, Path],
) -> None:
    pid, stop = busy_tree
    first = tree_cpu_seconds(pid)
    assert first is not None and first >= 0
    deadline = time.monotonic() + 60  # a bound against hanging, not a speed check
    while time.monotonic() < deadline:
        table = read_table()
        own, tree = table[pid][1], subtree_ticks(table, pid)
        later = tree_cpu_seconds(pid)
        assert tree is not None and tree >= own and later is not None and later >= first
        if tree > own and later > first:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the spinning grandchild's CPU time never showed in the tree")
    running = tree_cpu_seconds(pid)
    stop.touch()
    while time.monotonic() < deadline:  # until the grandchild is gone (waited for by the child)
        table = read_table()
        if not any(ppid == pid for ppid, _ in table.values()):
            break
        time.sleep(0.05)
    ended = tree_cpu_seconds(pid)  # the child is a zombie until the fixture waits for it
    assert running is not None and ended is not None and ended >= running, (
        "a descendant that ended and was waited for stays counted (cutime + cstime)"
    )
