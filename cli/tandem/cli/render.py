"""`tandem render -f FILE`: every object the operator would create for the InferenceServices and
InferenceGateways in FILE, as YAML, without a cluster (for GitOps review and policy checks).

A gateway serves the services of the same file and namespace that its selector selects: those
render without a gateway of their own and with policies admitting the gateway's pods, and the
gateway renders its Secret, policy, ConfigMap (the `GatewayFile`), identity, Service and Deployment.
What the operator refuses (two services claiming one name, a service two gateways select, an alias
to a service the gateway does not serve, an adapter in a local directory) is an error here.

The objects come from the operator's own pure builders (`tandem.operator.resources.desired_children`),
so they are exactly what a reconcile creates: Secrets (generated ones with a fresh random value, as
the operator draws one when it creates them), NetworkPolicies, ConfigMaps, the router's
ServiceAccount, Role and RoleBinding, Services, a PodDisruptionBudget per engine pool, Deployments,
and LeaderWorkerSets for multi-node pools, in creation order. The owner
references name the InferenceService with a placeholder uid, since the API server assigns the real one.
What the operator checks against the cluster (whether a Secret the spec names carries the label
`tandem.dev/usable: "true"`) is not checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import ValidationError

from tandem.cli.documents import read_documents
from tandem.cli.options import documents_file
from tandem.core.gateway import InferenceGateway, parse_document
from tandem.core.spec import InferenceService
from tandem.core.specrules import SpecError, SpecInvalid, adapter_warnings, cluster_adapter_rules
from tandem.operator.resources import Images, Owner, desired_children
from tandem.operator.resources.gateway import Member, gateway_children, gateway_owner
from tandem.operator.settings import DEFAULT_REDIS_IMAGE

#: The uid owner references carry in rendered output (the API server assigns the real one).
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
DEFAULT_TANDEM_IMAGE = "ghcr.io/tandem-dev/tandem:latest"


def load_documents(path: Path) -> tuple[list[InferenceService], list[InferenceGateway], list[SpecError]]:
    """Every InferenceService and InferenceGateway in `path`, and every error (prefixed by the
    document's index when the file holds several)."""
    docs = read_documents(path)
    services: list[InferenceService] = []
    gateways: list[InferenceGateway] = []
    errors: list[SpecError] = []
    for index, doc in enumerate(docs):
        try:
            parsed = parse_document(doc)
        except SpecInvalid as exc:
            prefix = f"[{index}]." if len(docs) > 1 else ""
            errors.extend(SpecError(prefix + e.path, e.message) for e in exc.errors)
            continue
        if isinstance(parsed, InferenceGateway):
            gateways.append(parsed)
        else:
            services.append(parsed)
    return services, gateways, errors


def serving(
    services: list[InferenceService], gateways: list[InferenceGateway]
) -> dict[tuple[str, str], InferenceGateway]:
    """The gateway of each served service, by (namespace, name); ClickException for a service that
    two gateways select."""
    served: dict[tuple[str, str], InferenceGateway] = {}
    for gateway in gateways:
        for isvc in services:
            labels = (isvc.metadata.model_extra or {}).get("labels") or {}
            if isvc.metadata.namespace != gateway.metadata.namespace or not gateway.spec.selector.matches(
                labels
            ):
                continue
            key = (isvc.metadata.namespace, isvc.metadata.name)
            if key in served:
                raise click.ClickException(
                    f"service {isvc.metadata.name} is selected by InferenceGateways "
                    f"{served[key].metadata.name} and {gateway.metadata.name}"
                )
            served[key] = gateway
    return served


def render_documents(
    path: Path, *, images: Images, metrics_namespaces: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The manifests for every InferenceService and InferenceGateway in `path`; ClickException on a
    bad file or spec, or on what the operator would refuse (module docstring)."""
    services, gateways, errors = load_documents(path)
    for isvc in services:  # what the operator refuses: adapters in local directories
        errors += cluster_adapter_rules(isvc.spec)
    if errors:
        raise click.ClickException(f"{path} is not valid: {errors[0]}")
    for isvc in services:
        for warning in adapter_warnings(isvc.spec):
            click.echo(f"warning: InferenceService {isvc.metadata.name}: {warning}", err=True)
    served = serving(services, gateways)
    owners = {
        id(g): gateway_owner(name=g.metadata.name, namespace=g.metadata.namespace, uid=PLACEHOLDER_UID)
        for g in gateways
    }
    manifests: list[dict[str, Any]] = []
    members: dict[int, list[Member]] = {id(g): [] for g in gateways}
    for isvc in services:
        owner = Owner(name=isvc.metadata.name, namespace=isvc.metadata.namespace, uid=PLACEHOLDER_UID)
        gateway = served.get((owner.namespace, owner.name))
        children = desired_children(
            isvc.spec,
            owner=owner,
            images=images,
            metrics_namespaces=metrics_namespaces,
            gateway=owners[id(gateway)] if gateway is not None else None,
        )
        manifests += [child.manifest for child in children]
        if gateway is not None:
            members[id(gateway)].append(Member(owner=owner, spec=isvc.spec))
    for gateway in gateways:
        if not members[id(gateway)]:
            raise click.ClickException(
                f"InferenceGateway {gateway.metadata.name} selects no service in {path}"
            )
        try:
            children = gateway_children(
                owners[id(gateway)],
                gateway.spec,
                members[id(gateway)],
                images=images,
                metrics_namespaces=metrics_namespaces,
            )
        except ValidationError as exc:  # GatewayFile's checks: a name conflict, an alias target
            message = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise click.ClickException(f"InferenceGateway {gateway.metadata.name}: {message}") from None
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
    """Print, as YAML, every object the operator would create for the InferenceServices and
    InferenceGateways in FILE: Secrets, NetworkPolicies, RBAC, ConfigMaps, Services,
    PodDisruptionBudgets, Deployments and LeaderWorkerSets.
    Generated Secrets get a fresh random value on each run, as the operator gives them when it
    creates them."""
    images = Images(tandem=tandem_image, redis=redis_image)
    manifests = render_documents(path, images=images, metrics_namespaces=metrics_namespaces)
    click.echo(yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False), nl=False)
