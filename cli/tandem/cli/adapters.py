"""`tandem adapters`: LoRA adapter files for the engines.

`tandem adapters link --catalog DIR --dest DIR` links every subdirectory of a catalog holding an
`adapter_config.json` to `DEST/<name>`, where vLLM's filesystem resolver looks
(`VLLM_LORA_RESOLVER_CACHE_DIR`). The operator runs it as an init container of engine pods with a
catalog (`tandem.operator.resources.lora`); a name that is already a directory in DEST (an adapter
mounted there) is left alone. Subdirectories whose names cannot name an adapter are skipped with a
line on stderr. Exit 1 when the catalog cannot be listed.

`prepare_local_adapters` is `tandem up`'s part: it checks a service's local adapters and catalog
(`local_adapter_rules`) and links them into the engines' adapter directory under the state dir.

Fetching `hf://` and `s3://` adapters is not done yet (docs/operator.md, "LoRA adapters").
"""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cli.exits import fail
from tandem.core.adapters import AdapterError, HfSource, LocalSource, S3Source, link_adapters, scan_catalog
from tandem.core.spec import InferenceService
from tandem.core.specrules import (
    SpecInvalid,
    adapter_sources,
    local_adapter_rules,
    local_catalog,
    local_path,
)


def prepare_local_adapters(isvc: InferenceService, *, base: Path, dest: Path) -> list[str]:
    """Link the service's local adapters (declared ones, then the catalog's) into `dest` by name, so
    that the engines' resolver finds `dest/<name>/adapter_config.json`; relative sources start from
    `base` (the YAML file's folder). Returns one line per adapter that cannot run here (`pvc://`,
    `hf://`, `s3://`). Raises `SpecInvalid` with the field paths of what the local files refuse."""
    errors = local_adapter_rules(isvc.spec, base=base)
    if errors:
        raise SpecInvalid(errors)
    found: dict[str, Path] = {}
    skipped: list[str] = []
    for at, name, source in adapter_sources(isvc.spec):
        if isinstance(source, LocalSource):
            found[name] = local_path(source, base=base)
        else:
            why = "not fetched yet" if isinstance(source, HfSource | S3Source) else "for a cluster"
            skipped.append(
                f"{at}: adapter {name!r} is skipped here ({why}); only local directories run locally"
            )
    catalog = local_catalog(isvc.spec, base=base)
    if catalog is not None:
        found |= {k: v for k, v in scan_catalog(catalog).adapters.items() if k not in found}
    elif isvc.spec.adapter_catalog is not None:
        skipped.append("spec.adapterCatalog.source: a pvc:// catalog is for a cluster; skipped here")
    link_adapters(dest, found)
    return skipped


@click.group()
def adapters() -> None:
    """LoRA adapter files for the engines."""


@adapters.command()
@click.option(
    "--catalog",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory whose subdirectories holding adapter_config.json are adapters.",
)
@click.option(
    "--dest",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The engines' adapter directory (VLLM_LORA_RESOLVER_CACHE_DIR).",
)
def link(catalog: Path, dest: Path) -> None:
    """Link each adapter of CATALOG into DEST as DEST/<name>."""
    try:
        found = scan_catalog(catalog)
        linked = link_adapters(dest, found.adapters)
    except (AdapterError, OSError) as exc:
        fail(str(exc))
    for name in found.unsafe:
        click.echo(f"skipped {catalog / name}: not an adapter name", err=True)
    kept = sorted(set(found.adapters) - set(linked))
    click.echo(
        f"linked {len(linked)} adapters into {dest}"
        + (f": {', '.join(linked)}" if linked else "")
        + (f"; kept {len(kept)} already there: {', '.join(kept)}" if kept else "")
    )
