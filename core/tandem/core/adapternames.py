"""The names a service's gateway accepts as its LoRA adapters, as a document the gateway re-reads.

In a cluster the operator writes ConfigMap `<service>-adapter-names`, key `names.json`, and the gateway
pods mount it whole (not `subPath`, so the kubelet's updates reach the running pods):

    {"adapters": ["sql", "chat", "support-v2"]}

The list holds `spec.adapters`' names in spec order, then the catalog's names that the engine pods'
`adapters-sync` sidecars report (`tandem.core.adaptersync`, sorted), without repeats. The gateway reads
it at start-up and again every few seconds (`tandem.router.adapternames`), so adding or removing an
adapter, or an adapter appearing in a `pvc://` catalog, changes what the gateway serves without rolling
its pods. The router config then names the file (`RouterConfig.adapterNamesFile`) and carries no
adapters of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tandem.core.adapters import MAX_CATALOG_ENTRIES, AdapterError, name_problem

#: The ConfigMap key, and the file's name where the gateway pods mount it.
NAMES_KEY = "names.json"
#: At most this many names: the declared ones (`spec.adapters`, at most 1,000) and a full catalog.
MAX_NAMES = MAX_CATALOG_ENTRIES + 1000
#: A names file larger than this is refused unread (10,000 names of 128 characters are ~1.3 MiB).
MAX_NAMES_BYTES = 4 * 1024 * 1024


def names_document(names: Iterable[str]) -> str:
    """The `names.json` for `names`, in order, without repeats (stable text: the same names are the
    same bytes, so an unchanged list never patches the ConfigMap).

    >>> names_document(["sql", "chat", "sql"])
    '{"adapters": ["sql", "chat"]}'
    """
    return json.dumps({"adapters": list(dict.fromkeys(names))})


def parse_names(text: str) -> tuple[str, ...]:
    """The names of a `names.json`, in order; raises `AdapterError` for a document that is not one:
    not JSON, no `adapters` list, an entry that is not a string naming an adapter (`name_problem`), a
    name twice, or more than `MAX_NAMES` names.

    >>> parse_names('{"adapters": ["sql", "chat"]}')
    ('sql', 'chat')
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AdapterError(f"{NAMES_KEY} is not JSON: {exc}") from None
    names = data.get("adapters") if isinstance(data, dict) else None
    if not isinstance(names, list):
        raise AdapterError(f'{NAMES_KEY} has no "adapters" list')
    if len(names) > MAX_NAMES:
        raise AdapterError(f"{NAMES_KEY} lists {len(names)} adapters; at most {MAX_NAMES}")
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str):
            raise AdapterError(f"{NAMES_KEY}: every entry must be a string: {name!r}")
        problem = name_problem(name)
        if problem is not None:
            raise AdapterError(f"{NAMES_KEY}: {problem}")
        if name in seen:
            raise AdapterError(f"{NAMES_KEY}: {name!r} is listed twice")
        seen.add(name)
    return tuple(names)
