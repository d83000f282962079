"""`tandem router --workers N`: the metrics pages merged, the bus between workers, and two real worker
processes behind one port that route as one gateway and stop together.

Real: the exposition merge (pure), two `WorkerBus`es on Unix sockets in this process, and (last tests)
`python -m tandem.cli router --workers 2` and simulated engines as child processes on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from functools import partial
from pathlib import Path

import httpx
import yaml
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.harness import FakeClock
from tests.router.processes import MODEL, router_process, sim_processes

from tandem.router.admission.ratelimit import Limits, RateLimiter
from tandem.router.workers.bus import WorkerBus
from tandem.router.workers.exposition import label_worker, merge
from tandem.router.workers.share import (
    LIMITS,
    SERVICE,
    SharedLimits,
    SharedService,
    apply_limits,
    apply_service,
)

TOKEN = "0123456789abcdef" * 4


def test_labelling_adds_the_worker_to_every_sample_with_or_without_labels() -> None:
    text = b'# HELP a_total a\n# TYPE a_total counter\na_total{route="x y"} 1.0\nup 1.0\n'
    assert label_worker(text, worker=3) == (
        b'# HELP a_total a\n# TYPE a_total counter\na_total{worker="3",route="x y"} 1.0\nup{worker="3"} 1.0\n'
    )


def test_merged_pages_keep_each_family_together_and_parse() -> None:
    pages = []
    for worker in (0, 1):
        registry = CollectorRegistry()
        Counter("served", "tokens", ["tenant"], registry=registry).labels(tenant="t").inc(worker + 1)
        Counter("other", "more", registry=registry).inc()
        pages.append(label_worker(generate_latest(registry), worker=worker))
    families = {f.name: f for f in text_string_to_metric_families(merge(pages).decode())}
    served = sorted(
        (s.labels["worker"], s.value) for s in families["served"].samples if s.name == "served_total"
    )
    assert served == [("0", 1.0), ("1", 2.0)]
    assert len([s for s in families["other"].samples if s.name == "other_total"]) == 2


def _hear(heard: list[tuple[int, object]], worker: int, payload: object) -> None:
    heard.append((worker, payload))


def _page(worker: int) -> bytes:
    return f"# HELP up up\n# TYPE up gauge\nup {worker}\n".encode()


async def test_siblings_hear_each_others_events_and_answer_for_metrics() -> None:
    key = f"test-{os.getpid()}"
    buses = [WorkerBus(key=key, index=i, count=2, token=TOKEN, timeout_s=2.0) for i in (0, 1)]
    heard: list[tuple[int, object]] = []
    for i, bus in enumerate(buses):
        bus.on("route", partial(_hear, heard, i))
        bus.answer_metrics(partial(_page, i))
    await asyncio.gather(*(bus.start() for bus in buses))
    try:
        buses[0].publish("route", ["http://127.0.0.1:1", [1, 2, 3]])
        buses[1].publish("route", ["http://127.0.0.1:2", [4]])
        for _ in range(200):
            if len(heard) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(heard) == [(0, ["http://127.0.0.1:2", [4]]), (1, ["http://127.0.0.1:1", [1, 2, 3]])]
        page = await buses[0].gather(lambda: b"# HELP up up\n# TYPE up gauge\nup 0\n")
        lines = [line for line in page.decode().split("\n") if line and not line.startswith("#")]
        assert lines == ['up{worker="0"} 0', 'up{worker="1"} 1']
    finally:
        for bus in buses:
            await bus.stop()


async def test_service_charged_on_one_worker_reaches_the_others_counters() -> None:
    key = f"test-svc-{os.getpid()}"
    buses = [WorkerBus(key=key, index=i, count=2, token=TOKEN) for i in (0, 1)]
    counters: dict[str, float] = {}
    buses[1].on(SERVICE, apply_service(lambda t, s: counters.__setitem__(t, counters.get(t, 0.0) + s)))
    await asyncio.gather(*(bus.start() for bus in buses))
    try:
        shared = SharedService(buses[0], interval_s=0.001)
        for _ in range(10):
            shared.charged("heavy", 100.0)  # summed, then sent once
        shared.charged("light", 5.0)
        for _ in range(200):
            if counters:
                break
            await asyncio.sleep(0.01)
        assert counters == {"heavy": 1000.0, "light": 5.0}
    finally:
        for bus in buses:
            await bus.stop()


async def test_a_tenants_rate_limit_holds_once_across_workers() -> None:
    """Two workers, 3 requests a minute: what one takes, the other's buckets lose too, so the
    tenant gets 3 requests from the pair, not 3 from each."""
    key = f"test-lim-{os.getpid()}"
    buses = [WorkerBus(key=key, index=i, count=2, token=TOKEN) for i in (0, 1)]
    clock = FakeClock()
    limiters = [RateLimiter(default=Limits(requests_per_minute=3), per_tenant={}, clock=clock) for _ in buses]
    for bus, limiter in zip(buses, limiters, strict=True):
        limiter.on_take = SharedLimits(bus, interval_s=0.001).took
        bus.on(LIMITS, apply_limits(limiter.absorb))
    await asyncio.gather(*(bus.start() for bus in buses))
    try:
        assert limiters[0].admit("t", prompt_tokens=lambda: 1) is None
        assert limiters[0].admit("t", prompt_tokens=lambda: 1) is None
        await asyncio.sleep(0.05)  # the bus delivers within milliseconds
        assert limiters[1].admit("t", prompt_tokens=lambda: 1) is None
        await asyncio.sleep(0.05)
        refusals = [limiter.admit("t", prompt_tokens=lambda: 1) for limiter in limiters]
        assert all(r is not None and r.kind == "requests" for r in refusals)
    finally:
        for bus in buses:
            await bus.stop()


def _config(tmp_path: Path, engines: list[str]) -> Path:
    path = tmp_path / "router.yaml"
    document = {
        "service": "workers",
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-7B-Instruct", "servedName": MODEL},
            "engine": {"kind": "sim"},
            "decode": {"replicas": len(engines)},
            "router": {"policy": "tandem", "workers": 2},
        },
        "discovery": {"kind": "static", "decode": engines},
    }
    path.write_text(yaml.safe_dump(document))
    return path


def _worker_pids(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry))
    return pids


def test_two_workers_share_one_port_and_route_each_prefix_to_one_engine(tmp_path: Path) -> None:
    with sim_processes(tmp_path, ["a", "b"], time_scale=100.0) as engines:
        config = _config(tmp_path, [e.url for e in engines])
        with router_process(tmp_path, config, "--topology-headers") as router:
            served: dict[int, set[str]] = {}
            for request in range(48):  # a new connection each time: the kernel spreads them
                group = request % 8
                system = f"You answer questions about topic number {group}. " * 40
                with httpx.Client(base_url=router.url, trust_env=False, timeout=30) as client:
                    response = client.post(
                        "/v1/chat/completions",
                        json={
                            "model": MODEL,
                            "messages": [
                                {"role": "system", "content": system},
                                {"role": "user", "content": f"question {request}"},
                            ],
                            "max_tokens": 2,
                        },
                    )
                assert response.status_code == 200
                served.setdefault(group, set()).add(response.headers["x-tandem-decode-endpoint"])
            metrics = httpx.get(f"{router.url}/metrics", timeout=10).text
    samples = [
        s
        for f in text_string_to_metric_families(metrics)
        for s in f.samples
        if s.name == "tandem_router_requests_total" and s.labels["route"] == "/v1/chat/completions"
    ]
    assert {s.labels["worker"] for s in samples} == {"0", "1"}  # both workers served
    assert sum(s.value for s in samples) == 48
    assert all(len(endpoints) == 1 for endpoints in served.values()), served  # one engine per prefix
    assert len({e for endpoints in served.values() for e in endpoints}) == 2  # and both engines used


def test_sigterm_stops_every_worker(tmp_path: Path) -> None:
    with sim_processes(tmp_path, ["a"], time_scale=100.0) as engines:
        config = _config(tmp_path, [engines[0].url])
        with router_process(tmp_path, config) as router:
            workers = _worker_pids(router.process.pid)
            assert len(workers) >= 2
            router.process.send_signal(signal.SIGTERM)
            assert router.process.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def _started_workers(log: Path) -> list[int]:
    """The pids of the `worker started` lines of a router's log, in order."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if '"worker started"' in line]
    return [int(line["pid"]) for line in lines]


def test_a_killed_worker_is_started_again_and_the_port_keeps_serving(tmp_path: Path) -> None:
    with sim_processes(tmp_path, ["a"], time_scale=100.0) as engines:
        config = _config(tmp_path, [engines[0].url])
        with router_process(tmp_path, config) as router:
            first = _started_workers(router.log)
            assert len(first) == 2 and set(first) <= set(_worker_pids(router.process.pid))
            victim = first[-1]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while len(started := _started_workers(router.log)) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(started) == 3, "no worker was started in the killed one's place"
            assert started[2] not in first and started[2] in _worker_pids(router.process.pid)
            statuses = []
            for request in range(12):  # a new connection each time, while the new worker starts
                with httpx.Client(base_url=router.url, trust_env=False, timeout=30) as client:
                    response = client.post(
                        "/v1/completions",
                        json={"model": MODEL, "prompt": f"question {request}", "max_tokens": 2},
                    )
                statuses.append(response.status_code)
            assert statuses == [200] * 12
            assert router.process.poll() is None
    log = router.log.read_text()
    assert log.count("worker died; starting it again") == 1, log[-2000:]
