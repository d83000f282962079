"""`tandem validate -f FILE`: check InferenceService and InferenceGateway documents without a cluster."""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cli.options import documents_file
from tandem.cli.render import load_documents
from tandem.core.gateway import InferenceGateway, name_conflicts, service_names
from tandem.core.spec import InferenceService
from tandem.core.specrules import adapter_warnings, local_adapter_rules


def summary(isvc: InferenceService) -> str:
    """One line describing a valid InferenceService."""
    spec = isvc.spec
    pool = spec.kv_pool.redis.url or f"managed redis {spec.kv_pool.redis.memory}"
    return (
        f"{isvc.metadata.namespace}/{isvc.metadata.name}: model {spec.model.public_name} "
        f"on {spec.engine.kind}, prefill {spec.prefill.replicas} x decode {spec.decode.replicas}, "
        f"disaggregation {spec.disaggregation.mode}, kv pool {pool} "
        f"(chunk {spec.kv_pool.chunk_size}), router x{spec.router.replicas}"
        + (_lora_summary(isvc) if spec.engine.lora is not None else "")
    )


def _lora_summary(isvc: InferenceService) -> str:
    spec = isvc.spec
    assert spec.engine.lora is not None
    parts = [f"lora max {spec.engine.lora.max_loras} x rank {spec.engine.lora.max_rank}"]
    if spec.adapters:
        parts.append(f"adapters {', '.join(a.name for a in spec.adapters)}")
    if spec.adapter_catalog is not None:
        parts.append(f"catalog {spec.adapter_catalog.source}")
    return ", " + ", ".join(parts)


def gateway_summary(gateway: InferenceGateway, services: list[InferenceService]) -> str:
    """One line describing a valid InferenceGateway and the services of the file it selects."""
    selected = [
        s
        for s in services
        if s.metadata.namespace == gateway.metadata.namespace
        and gateway.spec.selector.matches((s.metadata.model_extra or {}).get("labels") or {})
    ]
    aliases = ", ".join(
        f"{a.name} -> " + "/".join(f"{t.service}:{t.weight}" for t in a.targets) for a in gateway.spec.aliases
    )
    names = (
        ", ".join(f"{s.spec.model.public_name} ({s.metadata.name})" for s in selected) or "none in this file"
    )
    return (
        f"{gateway.metadata.namespace}/{gateway.metadata.name}: gateway x{gateway.spec.replicas} for "
        f"{names}" + (f"; aliases {aliases}" if aliases else "")
    )


def gateway_problems(gateway: InferenceGateway, services: list[InferenceService]) -> list[str]:
    """What the operator would refuse about the gateway given the services of the file: names two
    selected services claim, an alias named as a served model, an alias target not selected."""
    selected = {
        s.metadata.name: service_names(s.spec)
        for s in services
        if s.metadata.namespace == gateway.metadata.namespace
        and gateway.spec.selector.matches((s.metadata.model_extra or {}).get("labels") or {})
    }
    problems = name_conflicts(selected, gateway.spec.aliases)
    if selected:  # a file of gateways only names no services to check targets against
        for i, alias in enumerate(gateway.spec.aliases):
            for j, target in enumerate(alias.targets):
                if target.service not in selected:
                    problems.append(
                        f"spec.aliases[{i}].targets[{j}].service: {target.service} is not a service "
                        "this gateway selects"
                    )
    return [f"InferenceGateway {gateway.metadata.name}: {p}" for p in problems]


@click.command()
@documents_file
def validate(path: Path) -> None:
    """Validate InferenceService and InferenceGateway documents: print each error with its field
    path (exit 1), or a one-line summary per valid document. Local adapter directories and catalogs
    (relative to FILE's folder) are read: their adapter_config.json and ranks are checked."""
    services, gateways, errors = load_documents(path)
    problems = [f"{path}: {error}" for error in errors]
    for isvc in services:  # local adapters and catalogs: relative to the file's folder
        where = f"{path}: InferenceService {isvc.metadata.name}"
        problems += [f"{where}: {e}" for e in local_adapter_rules(isvc.spec, base=path.parent)]
        for warning in adapter_warnings(isvc.spec):
            click.echo(f"warning: {where}: {warning}", err=True)
    for gateway in gateways:
        problems += [f"{path}: {p}" for p in gateway_problems(gateway, services)]
    if problems:
        for problem in problems:
            click.echo(problem, err=True)
        raise SystemExit(1)
    for isvc in services:
        click.echo(f"valid: {summary(isvc)}")
    for gateway in gateways:
        click.echo(f"valid: {gateway_summary(gateway, services)}")
