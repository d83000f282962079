"""`tandem kvpool stats|flush|exporter`: look into the KV pool, empty one model's part, export metrics.

Every subcommand takes `--url redis://host:port[/db]` and a password from the URL's userinfo or from
the environment variable named by `--password-env` (default `TANDEM_KVPOOL_PASSWORD`), never from a
flag of its own (command lines are visible to every user of the machine). An unreachable or refusing
pool ends the command with exit 1 and `tandem: error: cannot reach the KV pool at <url>: <why>`.
"""

from __future__ import annotations

import json
import os
import threading
from typing import NoReturn

import click
import redis
from prometheus_client import CollectorRegistry, start_http_server

from tandem.cli.exits import fail
from tandem.kvpool.client import PASSWORD_ENV, POOL_ERRORS, connect_sync, password_from_env, redact_url
from tandem.kvpool.flush import flush_model
from tandem.kvpool.metrics import PoolCollector
from tandem.kvpool.stats import DEFAULT_MAX_KEYS, DEFAULT_SCAN_COUNT, PoolStats, collect_stats

EXIT_FAILED = 1
DEFAULT_URL = "redis://127.0.0.1:6379"


def _fail(message: str) -> NoReturn:
    fail(message, code=EXIT_FAILED)


def _unreachable(url: str, exc: BaseException) -> NoReturn:
    _fail(f"cannot reach the KV pool at {redact_url(url)}: {exc}")


def _client(url: str, password_env: str, timeout_s: float) -> redis.Redis:
    try:
        return connect_sync(url, timeout_s=timeout_s, password=password_from_env(os.environ, password_env))
    except ValueError as exc:  # redis-py's answer to a malformed URL
        _fail(f"invalid KV pool URL {redact_url(url)}: {exc}")


_url = click.option("--url", default=DEFAULT_URL, show_default=True, help="The pool's Redis URL.")
_password_env = click.option(
    "--password-env",
    default=PASSWORD_ENV,
    show_default=True,
    help="Environment variable holding the pool's password (unless the URL has one).",
)
_timeout = click.option(
    "--timeout", "timeout_s", default=5.0, show_default=True, type=click.FloatRange(min=0.1),
    help="Seconds to connect and per Redis command.",
)  # fmt: skip
_scan_count = click.option(
    "--scan-count", default=DEFAULT_SCAN_COUNT, show_default=True, type=click.IntRange(min=1),
    help="Keys asked for per SCAN round trip.",
)  # fmt: skip
_max_keys = click.option(
    "--max-keys", default=DEFAULT_MAX_KEYS, show_default=True, type=click.IntRange(min=1),
    help="Stop counting chunks after this many keys (the output says when it did).",
)  # fmt: skip


@click.group()
def kvpool() -> None:
    """Inspect and manage the KV pool (Redis in LMCache's layout)."""


@kvpool.command()
@_url
@_password_env
@_timeout
@_scan_count
@_max_keys
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def stats(
    url: str, password_env: str, timeout_s: float, scan_count: int, max_keys: int, as_json: bool
) -> None:
    """Memory, chunks per model, and key hits and misses of the pool."""
    client = _client(url, password_env, timeout_s)
    try:
        snapshot = collect_stats(client, scan_count=scan_count, max_keys=max_keys)
    except POOL_ERRORS as exc:
        _unreachable(url, exc)
    finally:
        client.close()
    if as_json:
        click.echo(json.dumps(snapshot.to_dict(), indent=2))
    else:
        click.echo(render_table(snapshot, url=redact_url(url)))


@kvpool.command()
@_url
@_password_env
@_timeout
@click.option("--model", required=True, help="Model name as it appears in the keys (spec.model.name).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def flush(url: str, password_env: str, timeout_s: float, model: str, yes: bool) -> None:
    """Delete one model's chunk pairs from the pool; other models' chunks stay."""
    if not yes:
        click.confirm(f"Delete every chunk of model {model!r} from {redact_url(url)}?", abort=True)
    client = _client(url, password_env, timeout_s)
    try:
        result = flush_model(client, model)
    except POOL_ERRORS as exc:
        _unreachable(url, exc)
    finally:
        client.close()
    click.echo(f"flushed {result.chunks} chunks ({result.keys} keys) of model {model!r}")


@kvpool.command()
@_url
@_password_env
@_timeout
@_scan_count
@_max_keys
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve /metrics on.")
@click.option("--port", default=9400, show_default=True, type=click.IntRange(0, 65535))
def exporter(
    url: str, password_env: str, timeout_s: float, scan_count: int, max_keys: int, host: str, port: int
) -> None:
    """Serve the pool's stats as Prometheus metrics on http://HOST:PORT/metrics (one snapshot per scrape)."""
    client = _client(url, password_env, timeout_s)
    registry = CollectorRegistry()
    registry.register(PoolCollector(lambda: collect_stats(client, scan_count=scan_count, max_keys=max_keys)))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        _fail(f"cannot serve metrics on {host}:{port}: {exc}")
    click.echo(f"serving KV pool metrics of {redact_url(url)} at http://{host}:{server.server_port}/metrics")
    try:
        threading.Event().wait()  # until Ctrl-C / SIGINT
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join()
        client.close()


def render_table(snapshot: PoolStats, *, url: str) -> str:
    """The human view of `tandem kvpool stats`."""
    ratio = snapshot.hit_ratio
    limit = f"{_mib(snapshot.maxmemory_bytes)}" if snapshot.maxmemory_bytes else "unbounded"
    lines = [
        f"KV pool {url}",
        f"memory    {_mib(snapshot.used_memory_bytes)} used of {limit} "
        f"({snapshot.maxmemory_policy}), {snapshot.evicted_keys} keys evicted",
        f"lookups   {snapshot.keyspace_hits} hits, {snapshot.keyspace_misses} misses"
        + (f" (hit ratio {ratio:.2f})" if ratio is not None else ""),
        f"keys      {snapshot.total_keys}",
        "",
        f"{'MODEL':<32} {'CHUNKS':>8} {'INCOMPLETE':>10} {'ORPHANED':>8} {'MEMORY':>12}",
    ]
    for model, chunks in sorted(snapshot.models.items()):
        lines.append(
            f"{model:<32} {chunks.chunks:>8} {chunks.incomplete:>10} {chunks.orphaned:>8} "
            f"{_mib(chunks.memory_bytes):>12}"
        )
    if not snapshot.models:
        lines.append("(no chunks)")
    if snapshot.truncated:
        lines.append(f"(counted the first {snapshot.keys_scanned} keys only; raise --max-keys to see all)")
    return "\n".join(lines)


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 2**20:.1f} MiB"
