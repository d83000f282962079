"""`tandem crd`: print the InferenceService CustomResourceDefinition (YAML), generated from the
spec model. The chart's `crds/` copy is this output, byte for byte."""

from __future__ import annotations

import click

from tandem.operator.crd import crd_yaml


@click.command()
def crd() -> None:
    """Print the CustomResourceDefinition of InferenceService (apply it with `kubectl apply -f -`)."""
    click.echo(crd_yaml(), nl=False)
