"""`tandem validate -f FILE`: check InferenceService documents without a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cli.documents import load_inference_services
from tandem.cli.options import documents_file
from tandem.core.spec import InferenceService


def summary(isvc: InferenceService) -> str:
    """One line describing a valid InferenceService."""
    spec = isvc.spec
    pool = spec.kv_pool.redis.url or f"managed redis {spec.kv_pool.redis.memory}"
    return (
        f"{isvc.metadata.namespace}/{isvc.metadata.name}: model {spec.model.public_name} "
        f"on {spec.engine.kind}, prefill {spec.prefill.replicas} x decode {spec.decode.replicas}, "
        f"disaggregation {spec.disaggregation.mode}, kv pool {pool} "
        f"(chunk {spec.kv_pool.chunk_size}), router x{spec.router.replicas}"
    )


@click.command()
@documents_file
def validate(path: Path) -> None:
    """Validate InferenceService documents: print each error with its field path (exit 1), or a
    one-line summary per valid document."""
    services, errors = load_inference_services(path)
    if errors:
        for error in errors:
            click.echo(f"{path}: {error}", err=True)
        raise SystemExit(1)
    for isvc in services:
        click.echo(f"valid: {summary(isvc)}")
