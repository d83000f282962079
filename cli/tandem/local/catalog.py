"""The names of a service's local adapter catalog, for the gateway's router config (`tandem up`).

The gateway accepts an adapter's name only when its router config lists it (`adapterNames`,
docs/router.md "LoRA adapters"); the engines find a catalog's adapters by name through vLLM's
filesystem resolver once `tandem up` has linked them (`tandem.cli.adapters.prepare_local_adapters`).
This reads the catalog's directory; `tandem.local.plan.build_plan` stays pure and takes the names
(`catalog_adapters`).
"""

from __future__ import annotations

from pathlib import Path

from tandem.core.adapters import AdapterError, scan_catalog
from tandem.core.spec import InferenceService
from tandem.core.specrules import local_catalog


def catalog_adapter_names(isvc: InferenceService, *, base: Path) -> list[str]:
    """The adapters of `isvc`'s local catalog by name, sorted: its subdirectories holding an
    `adapter_config.json` whose names can name an adapter. [] without `engine.lora`, without a local
    catalog (none, or `pvc://`), and when the catalog cannot be listed (linking it reports why).
    `base`: the folder its relative source starts from (the YAML file's)."""
    if isvc.spec.engine.lora is None:
        return []
    directory = local_catalog(isvc.spec, base=base)
    if directory is None:
        return []
    try:
        return sorted(scan_catalog(directory).adapters)
    except (AdapterError, OSError):
        return []
