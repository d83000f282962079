"""`tandem render -f FILE`: every object the operator would create for the InferenceServices in FILE,
as YAML, without a cluster (for GitOps review and policy checks).

The objects come from the operator's own pure builders (`tandem.operator.resources.desired_children`),
so they are exactly what a reconcile creates: Secrets (generated ones with a fresh random value, as
the operator draws one when it creates them), NetworkPolicies, ConfigMaps, the router's
ServiceAccount, Role and RoleBinding, Services and Deployments, in creation order. The owner
references name the InferenceService with a placeholder uid, since the API server assigns the real one.
What the operator checks against the cluster (whether a Secret the spec names carries the label
`tandem.dev/usable: "true"`) is not checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from tandem.cli.documents import load_inference_services
from tandem.cli.options import documents_file
from tandem.operator.resources import Images, Owner, desired_children
from tandem.operator.settings import DEFAULT_REDIS_IMAGE

#: The uid owner references carry in rendered output (the API server assigns the real one).
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
DEFAULT_TANDEM_IMAGE = "ghcr.io/tandem-dev/tandem:latest"


def render_documents(
    path: Path, *, images: Images, metrics_namespaces: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The manifests for every InferenceService in `path`; ClickException on a bad file or spec."""
    services, errors = load_inference_services(path)
    if errors:
        raise click.ClickException(f"{path} is not a valid InferenceService: {errors[0]}")
    manifests: list[dict[str, Any]] = []
    for isvc in services:
        owner = Owner(name=isvc.metadata.name, namespace=isvc.metadata.namespace, uid=PLACEHOLDER_UID)
        children = desired_children(
            isvc.spec, owner=owner, images=images, metrics_namespaces=metrics_namespaces
        )
        manifests += [child.manifest for child in children]
    return manifests


@click.command()
@documents_file
@click.option(
    "--tandem-image",
    envvar="TANDEM_IMAGE",
    default=DEFAULT_TANDEM_IMAGE,
    show_default=True,
    help="Image of the router and of simulated engines (the operator's --tandem-image).",
)
@click.option(
    "--redis-image",
    default=DEFAULT_REDIS_IMAGE,
    show_default=True,
    help="Image of the managed KV pool (the operator's --redis-image).",
)
@click.option(
    "--metrics-namespace",
    "metrics_namespaces",
    multiple=True,
    help="Namespace whose pods may scrape engines and gateways (the operator's --metrics-namespace).",
)
def render(path: Path, tandem_image: str, redis_image: str, metrics_namespaces: tuple[str, ...]) -> None:
    """Print, as YAML, every object the operator would create for the InferenceServices in FILE:
    Secrets, NetworkPolicies, RBAC, ConfigMaps, Services and Deployments. Generated Secrets get a
    fresh random value on each run, as the operator gives them when it creates them."""
    images = Images(tandem=tandem_image, redis=redis_image)
    manifests = render_documents(path, images=images, metrics_namespaces=metrics_namespaces)
    click.echo(yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False), nl=False)
