"""`tandem autoscaler`: keep every autoscaled InferenceService's pools sized, in a cluster.

It watches InferenceServices (in the given namespaces, or in all), scrapes each autoscaled pool's
engines (found through the EndpointSlices of the pool's Service, as the router finds them) and the
gateway's queue, and sets the `scale` subresource of the pool's Deployment, with an Event and
`status.autoscaling` on the InferenceService (tandem.autoscaler.incluster). `/metrics` and `/healthz`
on --metrics-port.

Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot run (the metrics port is taken), 2 for a bad
configuration (no API server: outside a cluster without --kube-api-server).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import click

from tandem.autoscaler.incluster import ClusterSettings, run_in_cluster
from tandem.autoscaler.runner import ROUND_SECONDS
from tandem.cli.exits import fail
from tandem.cli.options import logging_options
from tandem.core.kubeaccess import KubeAccess, KubeAccessError
from tandem.core.logs import configure_logging

log = logging.getLogger("tandem.autoscaler")
EXIT_FAILED, EXIT_BAD_CONFIG = 1, 2


async def _main(settings: ClusterSettings, access: KubeAccess) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def listening(port: int) -> None:
        log.info("serving /metrics and /healthz", extra={"host": settings.metrics_host, "port": port})

    await run_in_cluster(settings, access=access, stop=stop, on_listening=listening)


@click.command()
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace whose InferenceServices are autoscaled (repeatable). Default: every namespace "
    "(cluster-wide).",
)
@click.option(
    "--interval-seconds",
    default=ROUND_SECONDS,
    show_default=True,
    type=click.FloatRange(min=0.1, max=60.0),
    help="Seconds between two rounds (scrape, decide, act); the panic window needs several per window.",
)
@click.option(
    "--metrics-host", default="0.0.0.0", show_default=True, help="Address of /metrics and /healthz."
)
@click.option(
    "--metrics-port", default=9090, show_default=True, type=click.IntRange(0, 65535), help="Their port."
)
@click.option(
    "--status-seconds",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Least seconds between status writes that change only the reason text.",
)
@click.option(
    "--kube-api-server",
    default=None,
    help="Kubernetes API URL to use without credentials (e.g. kubectl proxy); default: in-cluster.",
)
@logging_options
def autoscaler(
    namespaces: tuple[str, ...],
    interval_seconds: float,
    metrics_host: str,
    metrics_port: int,
    status_seconds: float,
    kube_api_server: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the autoscaler: decode pools on KV-cache utilisation, prefill pools on TTFT and backlog
    (docs/autoscaler.md). Credentials: the pod's service account, or --kube-api-server."""
    try:
        access = KubeAccess.plain(kube_api_server) if kube_api_server else KubeAccess.in_cluster(os.environ)
    except KubeAccessError as exc:
        fail(str(exc), code=EXIT_BAD_CONFIG)
        return
    settings = ClusterSettings(
        namespaces=namespaces,
        interval_s=interval_seconds,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        status_every_s=status_seconds,
    )
    configure_logging(log_level, json_lines=log_format == "json")
    if log_level != "debug":  # httpx logs every request at info: several scrapes a second
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        asyncio.run(_main(settings, access))
    except OSError as exc:
        reason = exc.strerror or exc
        fail(f"cannot serve metrics on {metrics_host}:{metrics_port}: {reason}", code=EXIT_FAILED)
