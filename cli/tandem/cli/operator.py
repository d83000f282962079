"""`tandem operator`: run the Kubernetes operator for InferenceService resources (kopf)."""

from __future__ import annotations

import asyncio
import os

import click
from pydantic import ValidationError

from tandem.cli.options import logging_options
from tandem.core.logs import configure_logging
from tandem.operator.cluster import ClusterError
from tandem.operator.handlers import run_operator
from tandem.operator.kube import KubeCluster, connect
from tandem.operator.settings import DEFAULT_REDIS_IMAGE, OperatorSettings


@click.command()
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeatable). None: every namespace (cluster-wide).",
)
@click.option(
    "--metrics-namespace",
    "metrics_namespaces",
    multiple=True,
    help="Namespace whose pods may scrape engines and gateways through the NetworkPolicies the "
    "operator renders (repeatable): the autoscaler's, Prometheus'.",
)
@click.option(
    "--tandem-image",
    envvar="TANDEM_IMAGE",
    required=True,
    help="Image of the router and of simulated engines; the chart passes its own image.",
)
@click.option(
    "--redis-image",
    envvar="TANDEM_REDIS_IMAGE",
    default=DEFAULT_REDIS_IMAGE,
    show_default=True,
    help="Image of the managed KV pool (Redis).",
)
@click.option(
    "--resync-seconds",
    default=30.0,
    show_default=True,
    type=float,
    help="Period of the reconcile that repairs drift and refreshes status.",
)
@click.option(
    "--liveness",
    "liveness_endpoint",
    default="http://0.0.0.0:8081/healthz",
    show_default=True,
    help="Liveness probe URL served by the operator; empty to disable.",
)
@logging_options
def operator(
    namespaces: tuple[str, ...],
    metrics_namespaces: tuple[str, ...],
    tandem_image: str,
    redis_image: str,
    resync_seconds: float,
    liveness_endpoint: str,
    log_level: str,
    log_format: str,
) -> None:
    """Run the operator: it turns each InferenceService into prefill and decode pools, a KV pool
    and a router, and keeps them so. Credentials: $KUBECONFIG when set, else the pod's service
    account, else ~/.kube/config."""
    try:
        settings = OperatorSettings(
            namespaces=namespaces,
            metrics_namespaces=metrics_namespaces,
            tandem_image=tandem_image,
            redis_image=redis_image,
            resync_seconds=resync_seconds,
            liveness_endpoint=liveness_endpoint or None,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise click.ClickException(f"{path}: {first['msg']}") from None
    # The one environment read: the kubeconfig path, at start-up (the client libraries would
    # otherwise read it at import time).
    try:
        cluster = KubeCluster(connect(os.environ.get("KUBECONFIG")))
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(log_level, json_lines=log_format == "json")
    asyncio.run(run_operator(settings, cluster=cluster))
