"""`tandem crd`: print the InferenceService CustomResourceDefinition (YAML), generated from the
spec model; the chart's `crds/` copy is this output, byte for byte. `--reference` prints the
field reference table of docs/operator.md instead."""

from __future__ import annotations

import click

from tandem.operator.crd import crd_yaml
from tandem.operator.reference import reference_markdown


@click.command()
@click.option("--reference", is_flag=True, help="Print the Markdown field reference instead.")
def crd(reference: bool) -> None:
    """Print the CustomResourceDefinition of InferenceService (`tandem crd | kubectl apply -f -`)."""
    click.echo(reference_markdown() if reference else crd_yaml(), nl=False)
