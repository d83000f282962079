"""`tandem crd`: print the InferenceService CustomResourceDefinition (YAML), generated from the
spec model; the chart's `crds/` copy is this output, byte for byte. `--gateway` prints the
InferenceGateway's instead; `--reference` prints the field reference table of docs/operator.md."""

from __future__ import annotations

import click

from tandem.operator.crd import CrdKind, crd_yaml
from tandem.operator.reference import reference_markdown


@click.command()
@click.option("--reference", is_flag=True, help="Print the Markdown field reference instead.")
@click.option("--gateway", is_flag=True, help="The InferenceGateway CRD instead of the InferenceService's.")
def crd(reference: bool, gateway: bool) -> None:
    """Print the CustomResourceDefinition of InferenceService (`tandem crd | kubectl apply -f -`), or
    of InferenceGateway with `--gateway`."""
    kind: CrdKind = "InferenceGateway" if gateway else "InferenceService"
    click.echo(reference_markdown(kind) if reference else crd_yaml(kind), nl=False)
