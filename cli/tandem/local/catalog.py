"""A service's local adapter catalog while `tandem up` runs.

The gateway accepts an adapter's name only when it knows it (docs/router.md "LoRA adapters"); the
engines find a catalog's adapters by name through vLLM's filesystem resolver once `tandem up` has
linked them (`tandem.cli.adapters.prepare_local_adapters`).

`CatalogFollower` keeps both current while the stack runs, as the adapters-sync sidecar and the
operator do in a cluster: every pass it links the catalog's new adapters into the engines' adapter
folder and unlinks those that left the catalog (`tandem.core.adapters.link_catalog`, as the sidecar
does), and rewrites the gateway's names file (`tandem.core.adapternames`, the router config's
`adapterNamesFile`), which the gateway re-reads. So an adapter directory copied into the catalog is
served within seconds, and one removed is refused (and unloaded from the engines by the gateway),
with no process restarted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from tandem.core.adapternames import names_document
from tandem.core.adapters import AdapterError, link_catalog
from tandem.core.files import replace_text
from tandem.core.spec import InferenceService
from tandem.core.specrules import local_catalog


@dataclass
class CatalogFollower:
    """Follows `catalog` into the engines' adapter folder `dest` and the gateway's `names_file`
    (module docstring). `keep`: names that are not the catalog's to link or list (the declared
    adapters, which the gateway serves anyway, and the model's own names). `names`: what the file
    lists now."""

    catalog: Path
    dest: Path
    names_file: Path
    keep: frozenset[str] = frozenset()
    names: tuple[str, ...] | None = None
    error: str = ""

    def step(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """One pass; the names (added, removed) when the list changed, else None. A catalog that
        cannot be listed changes nothing (`error` says why until it can)."""
        try:
            found, _ = link_catalog(self.dest, self.catalog, skip=self.keep)
        except AdapterError as exc:
            self.error = str(exc)
            return None
        self.error = ""
        names = tuple(sorted(name for name in found if name not in self.keep))
        if names == self.names:
            return None
        before = set(self.names or ())
        replace_text(self.names_file, names_document(names))
        self.names = names
        return tuple(n for n in names if n not in before), tuple(sorted(before - set(names)))


def catalog_follower(
    isvc: InferenceService, *, base: Path, dest: Path, names_file: Path, model_names: Collection[str] = ()
) -> CatalogFollower | None:
    """The follower of `isvc`'s local catalog (None without `engine.lora` or a local catalog), its
    first pass done: the adapter folder linked and the names file written."""
    if isvc.spec.engine.lora is None:
        return None
    directory = local_catalog(isvc.spec, base=base)
    if directory is None:
        return None
    model = isvc.spec.model
    keep = frozenset({*(a.name for a in isvc.spec.adapters), model.name, model.public_name, *model_names})
    follower = CatalogFollower(catalog=directory, dest=dest, names_file=names_file, keep=keep)
    if follower.step() is None and follower.names is None:
        replace_text(names_file, names_document(()))  # a catalog not listable yet: no names until it is
        follower.names = ()
    return follower
