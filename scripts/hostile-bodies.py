#!/usr/bin/env python
"""Hostile request bodies against a local `tandem up`: the router's RSS growth and event-loop stall.

    .venv/bin/python scripts/hostile-bodies.py [--port 18480] [--copies 4]

Starts `tandem up -f deploy/examples/local-sim.yaml`, then, per body shape, sends `--copies` copies
of a body at the size limit (4 MiB by default) at once, with no API key, while a probe asks
`/health` every 10 ms. For each shape it prints the statuses, the router process's peak RSS above
its level before the shape (read from /proc every 10 ms), the probe's worst round trip (what every
other client waited at worst), and the gateway's own `tandem_router_event_loop_lag_seconds`
observations above 0.1 s. Nothing here asserts: it measures (docs/security.md, "Hostile bodies").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 4 * 1024 * 1024


def shapes(model: str) -> dict[str, bytes]:
    """Bodies just under the size limit, of the shapes the security review names."""

    def fill(unit: int) -> int:
        return (LIMIT - 200) // unit

    tiny = [{"role": "user", "content": "a"}] * fill(31)
    parts = [{"type": "text", "text": "a"}] * fill(29)
    out = {
        "135k-tiny-messages": {"model": model, "messages": tiny},
        "145k-content-parts": {"model": model, "messages": [{"role": "user", "content": parts}]},
        "prompt-list-16x256k": {"model": model, "prompt": ["word " * 52_000] * 16, "max_tokens": 1},
        "1M-token-ids": {"model": model, "prompt": [17] * fill(4), "max_tokens": 1},
        "one-4MiB-string": {"model": model, "prompt": "word " * fill(5), "max_tokens": 1},
        "chat-4MiB-one-message": {
            "model": model,
            "messages": [{"role": "user", "content": "word " * fill(5)}],
            "max_tokens": 1,
        },
    }
    bodies = {name: json.dumps(body, separators=(",", ":")).encode() for name, body in out.items()}
    depth = (LIMIT - 200) // 2
    bodies["2M-deep-nesting"] = (
        f'{{"model":"{model}","prompt":"x","vendor":'.encode() + b"[" * depth + b"]" * depth + b"}"
    )
    return bodies


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def router_pid(parent: int) -> int:
    """The `tandem router` process among `parent`'s descendants."""
    for _ in range(600):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"router" in cmd and any(b"tandem" in c for c in cmd) and _descends(int(entry.name), parent):
                return int(entry.name)
        time.sleep(0.1)
    raise SystemExit("no router process found")


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


async def lag_over(client: httpx.AsyncClient, url: str) -> float:
    text = (await client.get(f"{url}/metrics")).text
    total = over = 0.0
    for line in text.splitlines():
        if line.startswith("tandem_router_event_loop_lag_seconds_count"):
            total = float(line.split()[-1])
        if line.startswith('tandem_router_event_loop_lag_seconds_bucket{le="0.1"}'):
            over = float(line.split()[-1])
    return total - over


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def one_shape(client: httpx.AsyncClient, url: str, pid: int, body: bytes, copies: int) -> str:
    """`copies` of `body` at once, with the probe; the table's row after the shape's name."""
    base = rss_mib(pid)
    seen = {"peak": base, "worst": 0.0}
    done = asyncio.Event()
    lag_before = await lag_over(client, url)
    path = "/v1/chat/completions" if b'"messages"' in body[:200] else "/v1/completions"

    async def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            await client.get(f"{url}/health")
            seen["worst"] = max(seen["worst"], time.perf_counter() - started)
            seen["peak"] = max(seen["peak"], rss_mib(pid))
            await asyncio.sleep(0.01)

    async def send() -> int:
        headers = {"content-type": "application/json"}
        return (await client.post(f"{url}{path}", content=body, headers=headers)).status_code

    prober = asyncio.create_task(probe())
    statuses = await asyncio.gather(*(send() for _ in range(copies)))
    await asyncio.sleep(0.2)
    done.set()
    await prober
    lag = await lag_over(client, url) - lag_before
    counts = ",".join(f"{s}x{statuses.count(s)}" for s in sorted(set(statuses)))
    return f"{counts:22} {seen['peak'] - base:9.1f} {seen['worst'] * 1000:13.1f} {lag:9.0f}"


async def measure(url: str, pid: int, copies: int) -> None:
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        say(f"{'shape':24} {'statuses':22} {'RSS +MiB':>9} {'probe max ms':>13} {'lag>0.1s':>9}")
        for name, body in shapes(model).items():
            say(f"{name:24} {await one_shape(client, url, pid, body, copies)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=18480)
    parser.add_argument("--copies", type=int, default=4)
    args = parser.parse_args()
    example = ROOT / "deploy" / "examples" / "local-sim.yaml"
    tandem = Path(sys.executable).parent / "tandem"
    up = subprocess.Popen(
        [str(tandem), "up", "-f", str(example), "--port", str(args.port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v1/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            sys.stderr.write("tandem up did not become ready\n")
            return 1
        pid = router_pid(up.pid)
        say(f"router pid {pid}, RSS {rss_mib(pid):.0f} MiB before")
        asyncio.run(measure(url, pid, args.copies))
        say(f"router RSS {rss_mib(pid):.0f} MiB after")
        return 0
    finally:
        up.terminate()
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    raise SystemExit(main())
