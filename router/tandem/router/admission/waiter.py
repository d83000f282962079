"""What the admission gate queues: a request as admission reads it (`Admittable`), the queue's item
(`Waiter`), and a continuation's stand-in (`Resumed`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tandem.router.admission.fairness.vtc import Ticket
from tandem.router.scheduling.base import Routable
from tandem.router.types import SLO

if TYPE_CHECKING:
    from tandem.router.admission.grant import Grant


class Admittable(Routable, Protocol):
    """A request as admission reads it: a `Routable` with its tenant, priority band and its own
    deadline (seconds to first token the client asked for, None when it asked for none)."""

    @property
    def tenant(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def deadline_s(self) -> float | None: ...


@dataclass(eq=False)
class Waiter:
    """A request waiting in the queue (the fair queue's item)."""

    request: Admittable
    arrived: float
    deadline: float
    future: asyncio.Future[Grant]
    ticket: Ticket[Waiter] | None = field(default=None)
    #: Called when the gate takes it out of the queue ahead of capacity (`AdmissionGate`, "Prefill
    #: ahead"); None: the request has nothing to do before its grant.
    on_ahead: Callable[[], None] | None = None


_NO_SLO = SLO(ttft_s=0.0, tpot_s=0.0)


@dataclass(frozen=True, slots=True)
class Resumed:
    """A pre-empted stream's continuation as the queue sees it (`AdmissionGate.resume`): its
    tenant's, no prompt to charge, no deadline of its own."""

    tenant: str
    priority: int
    request_id: str = ""
    slo: SLO = _NO_SLO
    kv_loaded: bool = False
    deadline_s: float | None = None
    lora_name: str | None = None

    def prompt_length(self) -> int:
        return 0

    def prompt_size(self) -> int:
        return 0

    def block_keys(self, block_size: int, /) -> Sequence[int]:
        return ()
