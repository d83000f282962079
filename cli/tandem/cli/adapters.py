"""`tandem adapters`: LoRA adapter files for the engines.

`tandem adapters link --catalog DIR --dest DIR` links every subdirectory of a catalog holding an
`adapter_config.json` to `DEST/<name>`, where vLLM's filesystem resolver looks
(`VLLM_LORA_RESOLVER_CACHE_DIR`); a name that is already a directory in DEST (an adapter mounted
there) is left alone. Subdirectories whose names cannot name an adapter are skipped with a
line on stderr. Exit 1 when the catalog cannot be listed.

`prepare_local_adapters` is `tandem up`'s part: it checks a service's local adapters and catalog
(`local_adapter_rules`) and links them into the engines' adapter directory under the state dir.

`tandem adapters fetch --dest DIR --max-rank R NAME=SOURCE...` installs each `hf://` or `s3://`
adapter as `DEST/<name>`, downloading it only when that source is not there yet
(`tandem.core.adapterfetch`: atomic, safe with several pods on one shared cache). It prints
`fetched <name> <revision>` or `cached <name> <revision>` per adapter and `failed <name>: <reason>`
for each it could not install; exit 1 when any failed, 2 for arguments it cannot read. With
`--catalog`, the catalog is linked afterwards (as `link` does); with `--prune`, adapters it installed
earlier that are no longer named are removed; `--report FILE` also writes the result lines there,
failures first; `--keep-going` exits 0 despite failures (so that the engines start with the
others). `tandem adapters sync` (`tandem.cli.adaptersync`) does the same on every pass over a list
file while the engines run: the operator runs it as the engine pods' sidecar
(`tandem.operator.resources.lora`), so adding or removing an adapter restarts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from tandem.cli.adapterremote import Remotes
from tandem.cli.adaptersync import sync
from tandem.cli.exits import fail
from tandem.core.adapterfetch import failure_line, failure_reason, install, parse_wanted
from tandem.core.adapterfetch import prune as prune_fetched
from tandem.core.adapters import AdapterError, HfSource, LocalSource, S3Source, link_adapters, scan_catalog
from tandem.core.spec import InferenceService
from tandem.core.specrules import (
    SpecInvalid,
    adapter_sources,
    local_adapter_rules,
    local_catalog,
    local_path,
)

#: Kubernetes keeps at most 4096 bytes of a container's termination message.
REPORT_BYTES = 4096


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
            why = (
                "the engine pods fetch it in a cluster"
                if isinstance(source, HfSource | S3Source)
                else "for a cluster"
            )
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


adapters.add_command(sync)


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


@adapters.command()
@click.option(
    "--dest",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The adapter cache: the engines' adapter directory (VLLM_LORA_RESOLVER_CACHE_DIR).",
)
@click.option(
    "--max-rank", type=click.IntRange(1), required=True, help="spec.engine.lora.maxRank: larger is refused."
)
@click.option(
    "--catalog",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Also link this catalog's adapters into DEST afterwards (as `link`).",
)
@click.option("--prune", is_flag=True, help="Remove adapters fetched earlier that are not named now.")
@click.option(
    "--report",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write the result lines here, failures first (a container's /dev/termination-log).",
)
@click.option("--keep-going", is_flag=True, help="Exit 0 even when some adapters could not be installed.")
@click.argument("wanted", nargs=-1, metavar="NAME=SOURCE...")
def fetch(
    dest: Path,
    max_rank: int,
    catalog: Path | None,
    prune: bool,
    report: Path | None,
    keep_going: bool,
    wanted: tuple[str, ...],
) -> None:
    """Download each hf:// or s3:// adapter into DEST/<name>, once."""
    try:
        items = parse_wanted(wanted)
    except AdapterError as exc:
        fail(str(exc), code=2)
    remotes = Remotes.from_environ(os.environ)
    failures: list[str] = []
    done_lines: list[str] = []
    for item in items:
        try:
            done = install(dest, item, download=remotes.download, max_rank=max_rank)
        except (AdapterError, OSError) as exc:
            failures.append(failure_line(item.name, failure_reason(item, exc)))
            click.echo(failures[-1], err=True)
            continue
        done_lines.append(f"{done.outcome} {done.name} {done.revision}")
        click.echo(done_lines[-1])
    if report is not None:
        _write_report(report, failures + done_lines)
    if prune:
        removed = prune_fetched(dest, [w.name for w in items])
        if removed:
            click.echo(f"removed {len(removed)} adapters no longer declared: {', '.join(removed)}")
    if catalog is not None:
        try:
            found = scan_catalog(catalog)
            declared = {w.name for w in items}  # a declared adapter wins over the catalog's
            linked = link_adapters(dest, {k: v for k, v in found.adapters.items() if k not in declared})
        except (AdapterError, OSError) as exc:
            fail(str(exc))
        click.echo(f"linked {len(linked)} catalog adapters into {dest}")
    if failures and not keep_going:
        raise SystemExit(1)


def _write_report(path: Path, lines: list[str]) -> None:
    """The result lines, cut to Kubernetes' 4096-byte termination message (failures come first)."""
    text = "\n".join(lines)[:REPORT_BYTES]
    try:
        path.write_text(text)
    except OSError as exc:
        click.echo(f"cannot write {path}: {exc.strerror or exc}", err=True)
