"""CPU time of a process tree (the gateway and its workers), read from Linux's /proc.

A gateway may run several processes (a supervisor and its workers), so its cost is the CPU time of
its whole tree: the root pid and every descendant, found through the parent pids in `/proc/*/stat`.
A process's time is user + system (`utime` + `stime`, fields 14 and 15 of `/proc/<pid>/stat`) plus
the user + system time of its children that have exited and been waited for (`cutime` + `cstime`,
fields 16 and 17), so a worker that ends between two readings still counts and the difference of
two readings never shrinks because of it. Ticks become seconds ÷ `os.sysconf("SC_CLK_TCK")` (100
on Linux: a tick is 10 ms, the resolution of every figure here).

Several trees (the replicas of one gateway, `--gateway-replicas`) are summed, each process once
(`forest_ticks`).

`subtree_ticks`, `forest_ticks`, `parse_stat` and `cpu_per_1000` are pure; `tree_cpu_seconds` and
`trees_cpu_seconds` read /proc.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PROC = Path("/proc")

#: pid → (parent pid, CPU ticks of that process: utime + stime + cutime + cstime).
ProcTable = Mapping[int, tuple[int, int]]


def parse_stat(text: str) -> tuple[int, int, int] | None:
    """`(pid, ppid, ticks)` from one `/proc/<pid>/stat` line, ticks = utime + stime + cutime + cstime;
    None when the line is not in that format.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so the
    fields after it are those after the **last** `)`. Example: `"42 (a) b) S 7 42 42 0 -1 0 0 0 0 0
    5 3 1 1 ..."` → (42, 7, 10).
    """
    head, sep, tail = text.rpartition(")")
    pid_text = head.split(" (", 1)[0].strip()
    fields = tail.split()
    if not sep or len(fields) < 15 or not pid_text.isdigit():
        return None
    try:
        ppid = int(fields[1])
        ticks = sum(int(f) for f in fields[11:15])
    except ValueError:
        return None
    return int(pid_text), ppid, ticks


def subtree_ticks(table: ProcTable, root: int) -> int | None:
    """Ticks of `root` and of every process below it in `table` (pure); None when root is absent.

    Example: {1: (0, 5), 10: (1, 7), 11: (10, 2), 12: (1, 100)} with root 10 → 7 + 2 = 9.
    A cycle in the parent links (impossible in /proc, possible in a bad table) is visited once.
    """
    return forest_ticks(table, (root,))


def forest_ticks(table: ProcTable, roots: Sequence[int]) -> int | None:
    """Ticks of every root and every process below any of them, each process counted once (pure);
    None when a root is absent (a gateway replica that is gone: its time can no longer be read).

    Example: the table above with roots 10 and 12 → 7 + 2 + 100 = 109; roots 1 and 10 → 114, the
    processes under 10 being under 1 as well.
    """
    if not roots or any(root not in table for root in roots):
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    stack = list(roots)
    total = 0
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def read_table(proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """Every process in `proc` as pid → (ppid, ticks). Processes that end while it reads are skipped."""
    table: dict[int, tuple[int, int]] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return table
    for entry in entries:
        try:
            text = (proc / entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:  # the process ended (or is not ours to read): it is not in the tree
            continue
        parsed = parse_stat(text)
        if parsed is not None:
            table[parsed[0]] = (parsed[1], parsed[2])
    return table


def tree_cpu_seconds(pid: int, *, proc: Path = PROC) -> float | None:
    """CPU seconds (user + system) used so far by `pid` and all its descendants; None when `pid` is
    not running or there is no /proc (not Linux)."""
    return trees_cpu_seconds((pid,), proc=proc)


def trees_cpu_seconds(pids: Sequence[int], *, proc: Path = PROC) -> float | None:
    """CPU seconds used so far by the process trees of `pids` together (the replicas of one gateway),
    from one reading of /proc; None when one of them is not running, or there is no /proc."""
    ticks = forest_ticks(read_table(proc), pids)
    if ticks is None:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_per_1000(before_s: float | None, after_s: float | None, *, requests: int) -> dict[str, Any]:
    """What a phase cost a gateway (pure): `cpu_s` = after − before, `requests_sent`, and
    `cpu_s_per_1000` = cpu_s ÷ requests × 1000; None figures when a reading is missing, nothing was
    sent, or the tree lost time (a descendant ended without being waited for).

    Example: 12.30 s before, 13.05 s after, 500 requests → 0.75 s, 1.5 s per 1,000 requests.
    """
    spent = None if before_s is None or after_s is None else after_s - before_s
    if spent is not None and spent < 0:
        spent = None
    per = None if spent is None or requests <= 0 else spent / requests * 1000
    return {"cpu_s": spent, "requests_sent": requests, "cpu_s_per_1000": per}
