"""The small interfaces around the KV-event machinery. Typing only: no I/O, no state.

- `PrefixSource`: what the scheduler asks ("how many leading tokens of this prompt does each endpoint
  hold?"). Two implementations share it: the precise index fed by engine KV events
  (`tandem.router.discovery.kvevents.index.PrecisePrefixIndex`) and the approximate index fed by the router's
  own routing decisions. Both key blocks with `tandem.core.blockhash.block_keys`.
- `EventSink`: where a subscriber puts decoded events (the precise index).
- `KVEventMetrics`: counters a subscriber reports; the router wires them to Prometheus. `NoMetrics`
  ignores them.

Endpoints are identified everywhere by the engine's base URL string, as discovery names it
(`"http://127.0.0.1:8101"`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from tandem.router.discovery.kvevents.decode import KVEvent

ReplayOutcome = Literal["ok", "timeout", "error", "unavailable"]
ConnectionState = Literal["connected", "disconnected"]


class KeyedPrompt(Protocol):
    """A prompt as prefix indexes read it: its `tandem.core.blockhash` keys per block size, computed
    (and kept) by the prompt's owner, so a request is hashed once per block size whatever asks."""

    def block_keys(self, block_size: int, /) -> Sequence[int]: ...


class PrefixSource(Protocol):
    """Prefix-cache state per endpoint, for prefix-aware scoring."""

    def match(self, endpoints: Iterable[str], prompt: KeyedPrompt) -> dict[str, int]:
        """For every endpoint in `endpoints`, how many leading tokens of `prompt` its KV cache holds
        (0 when unknown): always a multiple of that endpoint's block size. Synchronous, no I/O, cheap
        (dictionary look-ups over the prompt's leading blocks): it runs on the event loop per request."""
        ...


class EventSink(Protocol):
    """Receives one endpoint's decoded events, batch by batch, in sequence order."""

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None: ...

    def clear(self, endpoint: str) -> None:
        """The endpoint's engine restarted: forget what it cached."""
        ...

    def forget(self, endpoint: str) -> None:
        """The endpoint left discovery: drop everything kept for it."""
        ...


class KVEventMetrics(Protocol):
    """What a subscriber counts. `kind` is the event tag (`BlockStored`, `BlockRemoved`,
    `AllBlocksCleared`); every method is called on the event loop and must not block."""

    def events_applied(self, endpoint: str, kind: str, count: int) -> None: ...

    def unknown_events(self, endpoint: str, count: int) -> None: ...

    def decode_error(self, endpoint: str) -> None: ...

    def gap(self, endpoint: str, missed: int) -> None:
        """A live seq skipped `missed` batches (a replay is attempted next)."""
        ...

    def lost(self, endpoint: str, batches: int) -> None:
        """Batches that neither the live stream nor a replay delivered (gone for good)."""
        ...

    def replay(self, endpoint: str, outcome: ReplayOutcome, batches: int) -> None: ...

    def restart(self, endpoint: str) -> None:
        """The engine's seq went backwards: it restarted, and its index entries were cleared."""
        ...

    def connection(self, endpoint: str, state: ConnectionState) -> None: ...

    def forget(self, endpoint: str) -> None:
        """The endpoint left discovery: drop its per-connection state (counters stay)."""
        ...


class NoMetrics:
    """A `KVEventMetrics` that records nothing."""

    def events_applied(self, endpoint: str, kind: str, count: int) -> None:
        pass

    def unknown_events(self, endpoint: str, count: int) -> None:
        pass

    def decode_error(self, endpoint: str) -> None:
        pass

    def gap(self, endpoint: str, missed: int) -> None:
        pass

    def lost(self, endpoint: str, batches: int) -> None:
        pass

    def replay(self, endpoint: str, outcome: ReplayOutcome, batches: int) -> None:
        pass

    def restart(self, endpoint: str) -> None:
        pass

    def connection(self, endpoint: str, state: ConnectionState) -> None:
        pass

    def forget(self, endpoint: str) -> None:
        pass
