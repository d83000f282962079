"""Which service a request's `model` names, in a gateway in front of many services (pure).

A name is a service's served name (`spec.model.servedName`, else `spec.model.name`), one of its LoRA
adapters (`spec.adapters[].name` and its router config's `adapterNames`: the request goes to that
service with its `model` unchanged, and the engine runs it under the adapter) or an alias
(`tandem.core.gateway.AliasSpec`): a client-facing name mapped to one service, or to several with
weights. Anything else is a 404 in vLLM's words (`ModelNotFound`), and is never kept: nothing here is
keyed by a name a client chose until it has matched a configured one.

**The split** is nginx's smooth weighted round robin (`SmoothWeighted`), one per alias: every pick
adds each target's weight to its current value, picks the largest current value (the first listed on
a tie) and subtracts the total weight from it. Over any `total` consecutive picks each target is
picked exactly `weight` times, and the picks of a heavy target are spread out, not bunched. Worked
example, weights a=5, b=1, c=1 (total 7):

| pick | current before (+weights) | picked | current after (-7 from the picked) |
|---:|---|---|---|
| 1 | 5, 1, 1 | a | -2, 1, 1 |
| 2 | 3, 2, 2 | a | -4, 2, 2 |
| 3 | 1, 3, 3 | b | 1, -4, 3 |
| 4 | 6, -3, 4 | a | -1, -3, 4 |
| 5 | 4, -2, 5 | c | 4, -2, -2 |
| 6 | 9, -1, -1 | a | 2, -1, -1 |
| 7 | 7, 0, 0 | a | 0, 0, 0 |

a a b a c a a, and the values are back to 0: the sequence repeats. A 90/10 alias therefore sends
exactly 90 of every 100 consecutive requests to its first target. The state is per alias in one
process: with several workers or gateway replicas each runs its own, exact over every full round of
its own requests, so the shares are off by at most one unfinished round per process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tandem.router.errors import ModelNotFound

T = TypeVar("T")


class SmoothWeighted(Generic[T]):
    """nginx's smooth weighted round robin over `targets` (module docstring). Weights are
    non-negative integers whose sum is positive; a target of weight 0 is never picked."""

    __slots__ = ("_current", "_targets", "_total", "_weights")

    def __init__(self, targets: Sequence[tuple[T, int]]) -> None:
        if any(w < 0 for _, w in targets) or sum(w for _, w in targets) <= 0:
            raise ValueError("weights must be non-negative with a positive sum")
        self._targets = [t for t, _ in targets]
        self._weights = [w for _, w in targets]
        self._total = sum(self._weights)
        self._current = [0] * len(self._weights)

    def pick(self) -> T:
        current, weights = self._current, self._weights
        best = 0
        for i, weight in enumerate(weights):
            current[i] += weight
            if current[i] > current[best]:
                best = i
        current[best] -= self._total
        return self._targets[best]


@dataclass(frozen=True, slots=True)
class Resolved(Generic[T]):
    """The service a request goes to; `alias`: the alias the client sent (None: the served name or
    an adapter); `adapter`: the LoRA adapter the client named (None: the model or an alias)."""

    service: T
    alias: str | None
    adapter: str | None = None


class ModelNames(Generic[T]):
    """Served names, adapters and aliases → services. `services`: served name → service; `aliases`:
    alias → (service's served name, weight) in order; `adapters`: adapter → its service's served
    name. Raises `ValueError` for an alias or adapter naming a served name, an adapter named like an
    alias, an unknown service or weights summing to 0 (`tandem.core.gateway` validates the same
    first)."""

    def __init__(
        self,
        services: Mapping[str, T],
        aliases: Mapping[str, Sequence[tuple[str, int]]],
        adapters: Mapping[str, str] | None = None,
    ) -> None:
        self._direct: dict[str, Resolved[T]] = {name: Resolved(s, None) for name, s in services.items()}
        for adapter, served in (adapters or {}).items():
            if adapter in services or adapter in aliases:
                raise ValueError(f"adapter {adapter!r} is a served name or an alias")
            if served not in services:
                raise ValueError(f"adapter {adapter!r} belongs to a name not served: {served}")
            self._direct[adapter] = Resolved(services[served], None, adapter)
        self._aliases: dict[str, SmoothWeighted[T]] = {}
        for alias, targets in aliases.items():
            if alias in services:
                raise ValueError(f"alias {alias!r} is a served name")
            unknown = [name for name, _ in targets if name not in services]
            if unknown:
                raise ValueError(f"alias {alias!r} targets names not served: {', '.join(unknown)}")
            self._aliases[alias] = SmoothWeighted([(services[n], w) for n, w in targets])
        self.names: frozenset[str] = frozenset(self._direct) | frozenset(aliases)

    def taken(self, name: str) -> str | None:
        """What `name` already names (a served name, an alias or an adapter), None when it is free."""
        direct = self._direct.get(name)
        if direct is not None:
            return "an adapter" if direct.adapter is not None else "a served model name"
        return "an alias" if name in self._aliases else None

    def add_adapter(self, adapter: str, service: T) -> None:
        """Serve `adapter` by `service` from now on (its names file listed it); raises `ValueError`
        for a name that is taken (`taken`)."""
        why = self.taken(adapter)
        if why is not None:
            raise ValueError(f"adapter {adapter!r} is {why}")
        self._direct[adapter] = Resolved(service, None, adapter)
        self.names = self.names | {adapter}

    def drop_adapter(self, adapter: str) -> None:
        """Stop serving `adapter` (its names file dropped it); a name that is not an adapter stays."""
        direct = self._direct.get(adapter)
        if direct is not None and direct.adapter is not None:
            del self._direct[adapter]
            self.names = self.names - {adapter}

    def resolve(self, model: str) -> Resolved[T]:
        """The service for `model`; raises `ModelNotFound` (404, vLLM's words) for any other name."""
        direct = self._direct.get(model)
        if direct is not None:
            return direct
        split = self._aliases.get(model)
        if split is None:
            raise ModelNotFound(model)
        return Resolved(split.pick(), model)
