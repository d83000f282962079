"""`tandem up`'s LoRA adapters: linked into the engines' adapter folder at start, and a local catalog
followed while the stack runs (`tandem.local.catalog.CatalogFollower`), each change said in one line.

A service with `engine.lora` and a local `adapterCatalog` gets a follower; its gateway reads the
catalog's names from the file the follower keeps (`tandem.local.plan.build_plan`, `follow_catalog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from tandem.cli.adapters import prepare_local_adapters
from tandem.cli.exits import fail
from tandem.core.adapters import AdapterError
from tandem.core.spec import InferenceService
from tandem.core.specrules import SpecInvalid, local_catalog
from tandem.local.catalog import CatalogFollower, catalog_follower
from tandem.local.plan import adapter_folder, adapter_names_path

#: Seconds between two passes over the followed local catalogs.
CATALOG_EVERY_S = 2.0

#: A followed catalog, by the name of its InferenceService.
Followed = tuple[str, CatalogFollower]


def _say(message: str) -> None:
    click.echo(message, err=True)


def follows(isvc: InferenceService, base: Path) -> bool:
    """Whether `tandem up` follows the service's catalog (`engine.lora` and a local catalog); `base`:
    the folder its relative sources start from."""
    return isvc.spec.engine.lora is not None and local_catalog(isvc.spec, base=base) is not None


def link_adapters(isvc: InferenceService, *, base: Path, state_dir: Path) -> None:
    """With `engine.lora`: the local adapters linked into the engines' adapter directory (exit 2 for
    what the files refuse, with its field path); a warning per adapter that cannot run here."""
    folder = adapter_folder(isvc, state_dir.resolve())
    if folder is None:
        return
    try:
        skipped = prepare_local_adapters(isvc, base=base, dest=folder)
    except SpecInvalid as exc:
        fail(f"InferenceService {isvc.metadata.name}: {exc.errors[0]}", code=2)
    except (AdapterError, OSError) as exc:
        fail(f"InferenceService {isvc.metadata.name}: adapters: {exc}", code=1)
    for line in skipped:
        _say(f"warning: InferenceService {isvc.metadata.name}: {line}")


def followers(
    services: Sequence[tuple[InferenceService, Path]], *, state_dir: Path, fleet: bool
) -> list[Followed]:
    """A follower per service that `follows`, its first pass done (exit 1 when its folder or names
    file cannot be written); `services`: each with the folder its relative sources start from;
    `fleet`: each service has its own state folder under `state_dir`."""
    out = []
    for isvc, base in services:
        folder = (state_dir / isvc.metadata.name if fleet else state_dir).resolve()
        dest = adapter_folder(isvc, folder)
        if dest is None:
            continue
        try:
            follower = catalog_follower(isvc, base=base, dest=dest, names_file=adapter_names_path(folder))
        except (AdapterError, OSError) as exc:
            fail(f"InferenceService {isvc.metadata.name}: adapter catalog: {exc}", code=1)
        if follower is not None:
            out.append((isvc.metadata.name, follower))
    return out


def follow(service: str, follower: CatalogFollower) -> None:
    """One pass over a local catalog, saying what it changed (or, once, why it cannot be read)."""
    error = follower.error
    try:
        change = follower.step()
    except (AdapterError, OSError) as exc:  # the adapter folder or the names file could not be written
        _say(f"warning: InferenceService {service}: adapter catalog: {exc}")
        return
    if follower.error and follower.error != error:
        _say(f"warning: InferenceService {service}: adapter catalog: {follower.error}")
    if change is not None:
        added, removed = change
        words = [
            f"added {', '.join(added)}" if added else "",
            f"removed {', '.join(removed)}" if removed else "",
        ]
        _say(f"InferenceService {service}: adapter catalog: {'; '.join(w for w in words if w)}")
