"""`tandem adapters sync`: the engine pods' adapter sidecar (`tandem.core.adaptersync`).

    tandem adapters sync --list /etc/tandem/adapters/adapters.json --dest /adapters --max-rank 16 \
        [--catalog /adapter-catalog] [--interval 10] [--retry 300] [--port 8095]

Every `--interval` seconds it reads the list file (the mounted ConfigMap, which the kubelet updates in
place), installs what is new, removes what is no longer listed and links the catalog. It serves, on
`--port` (all interfaces):

- `GET /ready`: 200 once the first pass is done, 503 before (the pod's startupProbe: the engine
  container starts only after it, so a new pod's engine finds every adapter that could be installed);
- `GET /adapters`: the report (`AdapterSync.report`), which the operator reads into `status.adapters`;
- `GET /metrics`: `tandem_adapter_sync_adapters{state}`, `tandem_adapter_sync_passes_total`,
  `tandem_adapter_sync_installs_total`, `tandem_adapter_sync_removals_total`,
  `tandem_adapter_sync_failures_total` and `tandem_adapter_sync_list_error` (1 while the list
  cannot be read).

It logs one JSON line per change (installed, removed, failed, a list it cannot read). SIGTERM ends it
with exit 0. A list file that is missing counts as an unreadable list (reported, nothing removed).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

import click
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from tandem.cli.adapterremote import Remotes
from tandem.core.adaptersync import DEFAULT_RETRY_S, SYNC_PORT, AdapterSync
from tandem.core.logs import configure_logging

log = logging.getLogger("tandem.adapters.sync")


class SyncMetrics:
    """The sidecar's Prometheus metrics (module docstring), on their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.adapters = Gauge(
            "tandem_adapter_sync_adapters", "Listed adapters by state.", ["state"], registry=self.registry
        )
        self.passes = Counter("tandem_adapter_sync_passes", "Passes over the list.", registry=self.registry)
        self.installs = Counter(
            "tandem_adapter_sync_installs", "Adapters downloaded and installed.", registry=self.registry
        )
        self.removals = Counter(
            "tandem_adapter_sync_removals", "Adapters removed as no longer listed.", registry=self.registry
        )
        self.failures = Counter(
            "tandem_adapter_sync_failures", "Failed installs (each try).", registry=self.registry
        )
        self.list_error = Gauge(
            "tandem_adapter_sync_list_error", "1 while the list cannot be read.", registry=self.registry
        )


def run_pass(sync: AdapterSync, list_file: Path, metrics: SyncMetrics) -> None:
    """Read the list and step once; log and count what changed."""
    listed_at: float | None = None
    try:
        listed_at = list_file.stat().st_mtime  # the kubelet writes a new file for each update
        text = list_file.read_text()
    except OSError as exc:
        text = f"<{list_file}: {exc.strerror or exc}>"  # not JSON: reported as an unreadable list
    before = sync.list_error
    result = sync.step(text, listed_at=listed_at)
    for name in result.installed:
        log.info("adapter installed", extra={"adapter": name, "revision": sync.entries[name].revision})
    for name in result.removed:
        log.info("adapter removed", extra={"adapter": name})
    for name in result.failed:
        log.warning("adapter failed", extra={"adapter": name, "reason": sync.entries[name].reason})
    if sync.list_error and sync.list_error != before:
        log.warning("adapter list unreadable", extra={"reason": sync.list_error})
    metrics.passes.inc()
    metrics.installs.inc(len(result.installed))
    metrics.removals.inc(len(result.removed))
    metrics.failures.inc(len(result.failed))
    metrics.list_error.set(1 if sync.list_error else 0)
    for state, count in sync.counts().items():
        metrics.adapters.labels(state).set(count)


class Published:
    """The report as of the last finished pass (None before the first), swapped whole: a download can
    take minutes, and the probes and the operator read the last report meanwhile, never a pass's
    half-way state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._body: bytes | None = None

    def publish(self, report: dict[str, Any]) -> None:
        body = json.dumps(report).encode()
        with self._lock:
            self._body = body

    def body(self) -> bytes | None:
        with self._lock:
            return self._body


def _handler(published: Published, metrics: SyncMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = published.body()
            if self.path == "/ready":
                ready = body is not None
                self._send(200 if ready else 503, b"ready\n" if ready else b"first pass running\n")
            elif self.path == "/adapters" and body is not None:
                self._send(200, body, "application/json")
            elif self.path == "/adapters":
                self._send(503, b"first pass running\n")
            elif self.path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found\n")

        def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Probes every few seconds are not worth a line each."""

    return Handler


@click.command()
@click.option(
    "--list", "list_file", required=True, type=click.Path(path_type=Path, dir_okay=False),
    help="The adapter list (the mounted ConfigMap's adapters.json).",
)  # fmt: skip
@click.option(
    "--dest", required=True, type=click.Path(path_type=Path, file_okay=False),
    help="The adapter cache: the engines' adapter directory (VLLM_LORA_RESOLVER_CACHE_DIR).",
)  # fmt: skip
@click.option("--max-rank", type=click.IntRange(1), required=True, help="spec.engine.lora.maxRank.")
@click.option(
    "--catalog", type=click.Path(path_type=Path, file_okay=False), default=None,
    help="Also link this catalog's adapters into DEST on every pass.",
)  # fmt: skip
@click.option("--interval", type=click.FloatRange(min=0.05), default=10.0, show_default=True,
              help="Seconds between passes.")  # fmt: skip
@click.option("--retry", "retry_s", type=click.FloatRange(min=0), default=DEFAULT_RETRY_S, show_default=True,
              help="Seconds before a failed adapter is tried again.")  # fmt: skip
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to serve the report on.")
@click.option("--port", type=click.IntRange(0, 65535), default=SYNC_PORT, show_default=True)
def sync(
    list_file: Path,
    dest: Path,
    max_rank: int,
    catalog: Path | None,
    interval: float,
    retry_s: float,
    host: str,
    port: int,
) -> None:
    """Keep DEST equal to the adapter list while the engines run; serve the report."""
    configure_logging()
    remotes = Remotes.from_environ(os.environ)
    dest.mkdir(parents=True, exist_ok=True)
    state = AdapterSync(
        cache=dest, download=remotes.download, max_rank=max_rank, clock=time.monotonic,
        catalog=catalog, retry_s=retry_s,
    )  # fmt: skip
    metrics, published, stop = SyncMetrics(), Published(), threading.Event()
    server = ThreadingHTTPServer((host, port), _handler(published, metrics))
    threading.Thread(target=server.serve_forever, name="adapter-sync-http", daemon=True).start()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("adapter sync started", extra={"list": str(list_file), "dest": str(dest), "port": port})
    try:
        while not stop.is_set():
            run_pass(state, list_file, metrics)
            published.publish(state.report())
            stop.wait(interval)
    finally:
        server.shutdown()
        server.server_close()
        log.info("adapter sync stopped", extra={"passes": state.passes})
