#!/usr/bin/env python3
"""Soak test of the gateway: many concurrent streams for a long time, watching for leaks.

It starts a stack on 127.0.0.1 (decode-only simulated engines and `tandem router` in front of them,
each a child process) or targets a running gateway (`--url`), then keeps `--streams` streaming chat
completions open for `--duration` seconds: each stream, when its answer ends, sends the next one.
Prompts vary (many system-prompt prefixes, fresh user text, many tenants), so the router's prefix
index, fair-queue counters and metric labels keep meeting new keys. Every few seconds it samples the
router process's resident memory (/proc/PID/status VmRSS), open descriptors (/proc/PID/fd) and CPU
time. At the end it writes samples.csv, summary.json and summary.md (requests, errors by kind, RSS
start/peak/end and its slope after warm-up, descriptors) with a verdict, and exits 0 on pass, 1 on fail.

    .venv/bin/python scripts/soak.py --streams 1000 --duration 600 --out soak-results/full
    .venv/bin/python scripts/soak.py --url http://127.0.0.1:8080 --router-pid 1234 --duration 120

Only public Tandem APIs are used: `tandem.core.routerconfig` to write the router's config and the
`tandem` CLI (`python -m tandem.cli sim|router`) to run the processes. docs/soak.md has the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from soak_report import (
    Options,
    Sample,
    Tally,
    markdown,
    summarize,
)

from tandem.core.routerconfig import RouterConfig, StaticDiscovery
from tandem.core.spec import InferenceServiceSpec
from tandem.local.ports import free_ports

LOOPBACK = "127.0.0.1"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
SERVED = "soak"
WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kernel",
    "cache",
    "block",
    "prefix",
    "decode",
    "prefill",
    "token",
    "stream",
    "batch",
    "queue",
    "tenant",
    "router",
    "engine",
    "pool",
    "shard",
    "replica",
    "latency",
    "budget",
    "window",
    "ledger",
    "vector",
    "matrix",
    "tensor",
    "layer",
    "head",
    "river",
    "mountain",
    "harbour",
    "lantern",
    "copper",
    "violet",
    "orchard",
    "meadow",
    "signal",
)


def read_process(pid: int) -> tuple[float, int, float]:
    """(RSS MiB, open descriptors, user + system CPU seconds) of process `pid`, from /proc."""
    rss_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return (rss_kib / 1024, fds, ticks / os.sysconf("SC_CLK_TCK"))


def sample(pid: int | None, t: float, tally: Tally, engines: list[int] | None = None) -> Sample:
    rss, fds, cpu = read_process(pid) if pid else (0.0, 0, 0.0)
    engines_cpu = 0.0
    for engine in engines or []:
        with contextlib.suppress(OSError):
            engines_cpu += read_process(engine)[2]
    return Sample(
        t=round(t, 1),
        rss_mib=round(rss, 1),
        fds=fds,
        cpu_s=round(cpu, 2),
        open_streams=tally.open_streams,
        requests=tally.requests,
        errors=sum(tally.errors.values()),
        engines_cpu_s=round(engines_cpu, 2),
    )


def raise_fd_limit() -> int:
    """Raise this process's descriptor limit to the hard limit (each stream holds a socket)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ------------------------------------------------------------------------------------------ the stack


@dataclass
class Stack:
    """The child processes this script started (empty with --url) and the gateway's URL."""

    url: str
    router_pid: int | None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def engine_pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid != self.router_pid]

    def stop(self) -> None:
        """Terminate every child, the router first, and wait for each (kill after 10 s)."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.processes):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def per_engine(options: Options) -> int:
    """Streams one engine holds, with 25% headroom for uneven placement."""
    return math.ceil(options.streams * 1.25 / options.engines)


def sim_argv(options: Options, port: int) -> list[str]:
    return [
        sys.executable, "-m", "tandem.cli", "sim",
        "--model", MODEL, "--served-model-name", SERVED,
        "--time-scale", str(options.time_scale),
        "--max-num-seqs", str(per_engine(options)),
        "--host", LOOPBACK, "--port", str(port),
        "--log-level", "warning", "--seed", str(port),
        *(["--num-gpu-blocks", str(options.engine_blocks)] if options.engine_blocks else []),
    ]  # fmt: skip


def router_config(options: Options, engines: list[str]) -> dict[str, Any]:
    """The router's config: decode-only (no P/D, no KV pool), objectives scaled to the slowed sims
    (at --time-scale 0.01 one simulated 10 ms step takes 1 s), a queue as large as the load."""
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"name": MODEL, "servedName": SERVED},
            "engine": {"kind": "sim", "sim": {"timeScale": options.time_scale}},
            "prefill": {"replicas": 0},
            "decode": {"replicas": options.engines},
            "disaggregation": {"mode": "off"},
            "router": {
                "replicas": 1, "maxQueue": options.streams, "slo": {"ttftSeconds": 600, "tpotSeconds": 60},
            },
        }
    )  # fmt: skip
    config = RouterConfig(service="soak", spec=spec, discovery=StaticDiscovery(decode=engines))
    dumped: dict[str, Any] = config.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def start_stack(options: Options) -> Stack:
    """Start the simulated engines and the router as child processes; logs go to --out."""
    stack = Stack(url="", router_pid=None)
    engines = []
    ports = free_ports(LOOPBACK)  # below the ephemeral range: still free when each process binds it
    for i in range(options.engines):
        port = next(ports)
        log = (options.out / f"sim-{i}.log").open("wb")
        stack.processes.append(subprocess.Popen(sim_argv(options, port), stdout=log, stderr=log))
        engines.append(f"http://{LOOPBACK}:{port}")
    config_path = options.out / "router.yaml"
    config_path.write_text(yaml.safe_dump(router_config(options, engines), sort_keys=False))
    port = next(ports)
    argv = [
        sys.executable, "-m", "tandem.cli", "router", "--config", str(config_path),
        "--host", LOOPBACK, "--port", str(port), "--log-level", "warning",
        "--max-in-flight-per-endpoint", str(per_engine(options)), *options.router_args,
    ]  # fmt: skip
    log = (options.out / "router.log").open("wb")
    router = subprocess.Popen(argv, stdout=log, stderr=log)
    stack.processes.append(router)
    stack.url, stack.router_pid = f"http://{LOOPBACK}:{port}", router.pid
    try:
        wait_healthy([*engines, stack.url], stack)
    except BaseException:
        stack.stop()
        raise
    return stack


def wait_healthy(urls: list[str], stack: Stack, timeout: float = 120.0) -> None:
    """Poll each /health until 200; fail if a child exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        for url in urls:
            while True:
                dead = [" ".join(map(str, p.args)) for p in stack.processes if p.poll() is not None]  # type: ignore[arg-type]
                if dead:
                    raise SystemExit(f"soak: error: a child exited during start-up: {dead[0]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"soak: error: {url} not healthy after {timeout:.0f} s")
                time.sleep(0.2)


# --------------------------------------------------------------------------------------------- load


def request_body(rng: random.Random, options: Options) -> tuple[dict[str, Any], dict[str, str]]:
    """One chat completion: one of `--prefixes` long system prompts (shared prefixes), fresh user
    text (a new prefix-index key every time), one of `--tenants` tenants, a random output length."""
    app = rng.randrange(options.prefixes)
    system = f"You are assistant {app}. " + " ".join(WORDS[(app * 7 + i) % len(WORDS)] for i in range(48))
    user = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
    body = {
        "model": SERVED,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": rng.randint(options.min_tokens, options.max_tokens),
        "ignore_eos": True,
        "stream": True,
    }
    return body, {"x-tenant-id": f"tenant-{rng.randrange(options.tenants)}"}


async def one_stream(
    client: httpx.AsyncClient, url: str, rng: random.Random, options: Options, tally: Tally
) -> None:
    """Send one streaming request and read it to the end; count it and any error by kind."""
    body, headers = request_body(rng, options)
    start, tokens, error = time.monotonic(), 0, None
    tally.open_streams += 1
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                error = f"http_{response.status_code}"
            else:
                tokens, error = await read_events(response, start, tally)
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    finally:
        tally.open_streams -= 1
    tally.requests += 1
    tally.tokens += tokens
    if error is None:
        tally.ok += 1
        tally.durations.append(time.monotonic() - start)
    else:
        tally.errors[error] += 1


async def read_events(response: httpx.Response, start: float, tally: Tally) -> tuple[int, str | None]:
    """Tokens in an SSE stream and the error it ended with (None: ended with [DONE]); the time from
    `start` to the first token goes into `tally.ttfts`.

    The load generator shares the host's cores with the router, so it reads events cheaply: only an
    event that may be an error is decoded; a token is an event with non-empty `"content":"` (the
    simulator's events: one choice each, compact JSON, where that text can only be the key)."""
    tokens = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            return tokens, None
        if '"error"' in payload:
            event = json.loads(payload)
            if isinstance(event, dict) and "error" in event:
                return tokens, f"sse_error_{event['error'].get('type', 'unknown')}"
        counted = 1 if '"content":"' in payload and '"content":""' not in payload else 0
        if counted and not tokens:
            tally.ttfts.append(time.monotonic() - start)
        tokens += counted
    return tokens, "stream_ended_without_done"


async def worker(
    index: int, client: httpx.AsyncClient, url: str, options: Options, tally: Tally, stop_at: float
) -> None:
    """One of `--streams` clients: ramp in, then stream back to back until `stop_at`."""
    rng = random.Random(options.seed * 1_000_003 + index)
    loop = asyncio.get_running_loop()
    await asyncio.sleep(options.ramp * index / options.streams)
    while loop.time() < stop_at:
        await one_stream(client, url, rng, options, tally)


async def sampler(stack: Stack, options: Options, tally: Tally, samples: list[Sample], t0: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        samples.append(sample(stack.router_pid, loop.time() - t0, tally, stack.engine_pids))
        await asyncio.sleep(options.interval)


async def drive(
    stack: Stack, options: Options
) -> tuple[list[Sample], tuple[Sample | None, Sample | None], Tally]:
    """Run the load; samples taken idle before it, during it, and idle after the drain."""
    tally, samples = Tally(), list[Sample]()
    before = sample(stack.router_pid, 0.0, tally) if stack.router_pid else None
    limits = httpx.Limits(max_connections=options.streams + 16, max_keepalive_connections=options.streams)
    timeout = httpx.Timeout(connect=30.0, read=120.0, write=30.0, pool=30.0)
    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = loop.time()
        stop_at = t0 + options.duration
        probe = asyncio.create_task(sampler(stack, options, tally, samples, t0))
        progress = asyncio.create_task(report_progress(options, tally, samples))
        workers = [
            asyncio.create_task(worker(i, client, stack.url, options, tally, stop_at))
            for i in range(options.streams)
        ]
        for signum in (signal.SIGINT, signal.SIGTERM):  # stop early: cut the streams, still report
            loop.add_signal_handler(signum, lambda: [task.cancel() for task in workers])
        _, pending = await asyncio.wait(workers, timeout=options.duration + options.drain)
        for task in pending:  # streams still open after the drain window: counted, then cut
            task.cancel()
        tally.errors.update({"unfinished_after_drain": len(pending)} if pending else {})
        cancelled = sum(1 for task in workers if task.cancelled())
        tally.errors.update({"cut_by_signal": cancelled - len(pending)} if cancelled > len(pending) else {})
        await asyncio.gather(*pending, return_exceptions=True)
        probe.cancel()
        progress.cancel()
    tally.client_cpu_s = time.process_time() - cpu0
    await asyncio.sleep(options.interval)  # let the router notice the closed connections
    after = sample(stack.router_pid, loop.time() - t0, tally) if stack.router_pid else None
    return samples, (before, after), tally


async def report_progress(options: Options, tally: Tally, samples: list[Sample]) -> None:
    while True:
        await asyncio.sleep(30)
        if not samples:
            continue
        last = samples[-1]
        sys.stderr.write(
            f"soak: t={last.t:.0f}s open={tally.open_streams} requests={tally.requests} "
            f"errors={sum(tally.errors.values())} rss={last.rss_mib}MiB fds={last.fds}\n"
        )


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--streams", type=int, default=1000, help="concurrent streams (default 1000)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument(
        "--warmup", type=float, default=120.0, help="seconds excluded from the slope (default 120)"
    )
    p.add_argument("--ramp", type=float, default=60.0, help="seconds over which streams open (default 60)")
    p.add_argument("--engines", type=int, default=4, help="simulated decode engines (default 4)")
    p.add_argument("--time-scale", type=float, default=0.01, help="sims' --time-scale (default 0.01)")
    p.add_argument("--min-tokens", type=int, default=32, help="shortest answer, tokens (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="longest answer, tokens (default 128)")
    p.add_argument("--tenants", type=int, default=200, help="distinct x-tenant-id values (default 200)")
    p.add_argument("--prefixes", type=int, default=64, help="distinct system prompts (default 64)")
    p.add_argument("--engine-blocks", type=int, help="sims' --num-gpu-blocks (default: the profile's)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--drain", type=float, default=240.0, help="seconds streams may run past --duration")
    p.add_argument("--url", help="target this running gateway instead of starting a stack")
    p.add_argument("--router-pid", type=int, help="with --url: the gateway's pid, to sample it")
    p.add_argument("--router-arg", action="append", default=[], help="extra `tandem router` argument")
    p.add_argument("--out", type=Path, default=Path(".tandem") / "soak" / time.strftime("%Y%m%d-%H%M%S"))
    p.add_argument(
        "--max-rss-slope", type=float, default=1.0, help="MiB/min allowed after warm-up (default 1)"
    )
    p.add_argument(
        "--max-fd-growth", type=int, default=50, help="fd drift allowed after warm-up (default 50)"
    )
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.streams < 1 or a.engines < 1 or a.duration <= a.warmup or a.min_tokens > a.max_tokens:
        p.error("need --streams ≥ 1, --engines ≥ 1, --duration > --warmup, --min-tokens ≤ --max-tokens")
    return Options(
        streams=a.streams, duration=a.duration, warmup=a.warmup, ramp=a.ramp, engines=a.engines,
        time_scale=a.time_scale, engine_blocks=a.engine_blocks, min_tokens=a.min_tokens,
        max_tokens=a.max_tokens, tenants=a.tenants,
        prefixes=a.prefixes, interval=a.interval, drain=a.drain, url=a.url, router_pid=a.router_pid,
        router_args=a.router_arg, out=a.out, max_rss_slope=a.max_rss_slope,
        max_fd_growth=a.max_fd_growth, seed=a.seed,
    )  # fmt: skip


def write_results(options: Options, samples: list[Sample], summary: dict[str, Any]) -> None:
    lines = [",".join(Sample.__dataclass_fields__)]
    lines += [",".join(str(v) for v in asdict(s).values()) for s in samples]
    (options.out / "samples.csv").write_text("\n".join(lines) + "\n")
    (options.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (options.out / "summary.md").write_text(markdown(summary))


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    limit = raise_fd_limit()
    if limit < options.streams + 64:
        raise SystemExit(f"soak: error: descriptor limit {limit} is too low for {options.streams} streams")
    if options.url:
        stack = Stack(url=options.url.rstrip("/"), router_pid=options.router_pid)
    else:
        stack = start_stack(options)
    try:
        samples, idle, tally = asyncio.run(drive(stack, options))
    finally:
        stack.stop()
    summary = summarize(samples, idle, tally, options)
    write_results(options, samples, summary)
    sys.stdout.write(markdown(summary))
    return 0 if summary["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
