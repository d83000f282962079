"""Loading InferenceService documents from YAML files, with errors fit for a terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from tandem.core.spec import InferenceService
from tandem.core.specrules import SpecError, SpecInvalid, parse_inference_service


def read_documents(path: Path) -> list[dict[str, Any]]:
    """Every YAML document in `path`; raises click.ClickException naming the file on a parse error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise click.ClickException(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    bad = [i for i, d in enumerate(docs) if not isinstance(d, dict)]
    if bad:
        raise click.ClickException(f"{path}: document {bad[0] + 1} is not a mapping")
    if not docs:
        raise click.ClickException(f"{path}: no YAML document found")
    return docs


def load_inference_services(path: Path) -> tuple[list[InferenceService], list[SpecError]]:
    """Parse every InferenceService in the file; returns the valid ones and all errors (prefixed by
    the document index when the file holds several)."""
    docs = read_documents(path)
    services: list[InferenceService] = []
    errors: list[SpecError] = []
    for index, doc in enumerate(docs):
        try:
            services.append(parse_inference_service(doc))
        except SpecInvalid as exc:
            prefix = f"[{index}]." if len(docs) > 1 else ""
            errors.extend(SpecError(prefix + e.path, e.message) for e in exc.errors)
    return services, errors


def load_one(path: Path) -> InferenceService:
    """The single InferenceService in `path`, or a ClickException listing what is wrong."""
    services, errors = load_inference_services(path)
    if errors:
        raise click.ClickException(f"{path} is not a valid InferenceService: {errors[0]}")
    if len(services) != 1:
        raise click.ClickException(f"{path}: expected one InferenceService, found {len(services)}")
    return services[0]
