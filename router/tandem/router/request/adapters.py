"""A service's LoRA adapter names, which can change while the gateway runs (pure).

A service's adapters are the names its configuration fixes (`spec.adapters`, the router config's
`adapterNames`: `EffectiveConfig.adapters`) and, with `adapterNamesFile`, the names that file lists
now (`tandem.core.adapternames`; the watcher is `tandem.router.upstream.adapters.AdapterNamesFile`).
The readers on the request path hold `names` and `accepted`, sets changed in place: a name the file
adds is accepted by the next request, and a name it drops is refused (404) by the next one, with
nothing rebuilt. `ordered` is the list in order (`/v1/models`), and `listeners` hear each change
(the janitor unloads what was dropped; a gateway of many services maps the names to the service).

A listed name is not taken when it is one of the model's own names, or when `refuse` says why not (a
gateway of many services: another service's model, adapter or an alias); each refusal is kept in
`refused` (name → why) until the name is taken or leaves the list. `retry` tries the refused names
again (another service has dropped names, which may free them).

Example: fixed `("sql",)`, the file lists `["chat", "sql"]` → `ordered` is `("sql", "chat")`; the
file then lists `["sql"]` → `chat` is dropped (`Change(added=(), removed=("chat",))`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Change:
    """What one `replace` changed: names added and removed, in order."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


class ServiceAdapters:
    """One service's adapter names (module docstring). `model`: the model's own names (never
    adapters); `fixed`: the names the configuration fixes, always served."""

    __slots__ = ("accepted", "fixed", "listed", "listeners", "model", "names", "ordered", "refuse", "refused")

    def __init__(
        self,
        model: Collection[str],
        fixed: Sequence[str] = (),
        *,
        refuse: Callable[[str], str | None] | None = None,
    ) -> None:
        self.model = frozenset(model)
        self.fixed = tuple(n for n in dict.fromkeys(fixed) if n not in self.model)
        self.refuse = refuse
        self.ordered: tuple[str, ...] = self.fixed
        #: The adapters now served; changed in place.
        self.names: set[str] = set(self.fixed)
        #: Every `model` a request may name: the model's names and the adapters; changed in place.
        self.accepted: set[str] = set(self.model) | self.names
        self.refused: dict[str, str] = {}
        #: The names last given to `replace`.
        self.listed: tuple[str, ...] = ()
        self.listeners: list[Callable[[Change], None]] = []

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __len__(self) -> int:
        return len(self.names)

    def replace(self, listed: Sequence[str]) -> Change:
        """Serve the fixed names and `listed` (module docstring); returns what changed, after the
        listeners have heard it."""
        self.listed = tuple(listed)
        refused: dict[str, str] = {}
        wanted: list[str] = []
        for name in dict.fromkeys((*self.fixed, *listed)):
            if name in self.model:
                continue
            why = None if name in self.names or self.refuse is None else self.refuse(name)
            if why is None:
                wanted.append(name)
            else:
                refused[name] = why
        keep = set(wanted)
        change = Change(
            added=tuple(n for n in wanted if n not in self.names),
            removed=tuple(n for n in self.ordered if n not in keep),
        )
        self.refused = refused
        if not change:
            self.ordered = tuple(wanted)
            return change
        self.names.difference_update(change.removed)
        self.names.update(change.added)
        self.accepted.difference_update(change.removed)
        self.accepted.update(change.added)
        self.ordered = tuple(wanted)
        for listener in self.listeners:
            listener(change)
        return change

    def retry(self) -> Change:
        """Try the refused names again (module docstring); no change when none was refused."""
        return self.replace(self.listed) if self.refused else Change()
