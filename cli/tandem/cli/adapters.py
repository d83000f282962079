"""`tandem adapters`: LoRA adapter files for the engines.

`tandem adapters link --catalog DIR --dest DIR` links every subdirectory of a catalog holding an
`adapter_config.json` to `DEST/<name>`, where vLLM's filesystem resolver looks
(`VLLM_LORA_RESOLVER_CACHE_DIR`). The operator runs it as an init container of engine pods with a
catalog (`tandem.operator.resources.lora`); a name that is already a directory in DEST (an adapter
mounted there) is left alone. Subdirectories whose names cannot name an adapter are skipped with a
line on stderr. Exit 1 when the catalog cannot be listed.

Fetching `hf://` and `s3://` adapters is not done yet (docs/operator.md, "LoRA adapters").
"""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cli.exits import fail
from tandem.core.adapters import AdapterError, link_adapters, scan_catalog


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
