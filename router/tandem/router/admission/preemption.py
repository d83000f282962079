"""Pre-emption: a tenant with nothing running takes a decode slot from a tenant over its share (pure).

The fair queue orders the requests that *wait*; a gateway that only dispatches into free slots
cannot do better for a newcomer than the next slot to free. Under a flood every slot is held by the
flooding tenant's answers, so a light tenant's request waits for one of them to end: up to a whole
answer (64 tokens at 6.7 ms a step is 0.43 s in the flood benchmark), twenty times its time to
first token alone. Pre-emption closes that gap: when a request must wait, the gate may stop one
running stream of another tenant, give its slot to the newcomer at once, and continue the stopped
answer when its tenant's turn comes again (`tandem.router.upstream.continuation`; the client's
stream stays open and loses nothing).

The rule (`victim`), deliberately narrow so that pre-emption stays rare:

1. The waiting request is the **only one of its tenant waiting**, and its tenant would still be
   **within its weighted share** of the running slots once it runs (held + 1 ≤ share). A tenant
   with a backlog waits for its turn in the fair queue as before: when tenants are all backlogged,
   VTC's order keeps their shares and nobody is stopped; pre-emption is for the tenant that asks
   now and then, whose requests would otherwise each wait for a slot to free.
2. Among the running streams, only those that can be continued (`preemptible`), of a priority band
   no higher than the newcomer's, of tenants holding **a whole slot more than their share** (they
   still hold their share after giving one up). Shares are split among the tenants running or
   waiting: share_t = capacity × w_t / Σ w over those tenants. With more tenants than slots nobody
   holds a slot more than its share, so tenants never take slots from each other by turns.
3. From the tenant furthest over its share (slots ÷ weight), the stream that has generated the
   fewest tokens (the least work to recompute, a prefix-cache hit for its prompt).

Example: 16 slots, the heavy tenant holds 15 and a light tenant 1; a second light request arrives
with no other light request waiting: shares 8 and 8, light would hold 2 ≤ 8, heavy is 7 over, so
heavy's youngest stream yields its slot. If light had other requests waiting, this one would wait
its turn.

A continued stream is not pre-empted again (its `preemptible` is false), so every answer makes
progress; each pre-emption costs the engine one recomputation of the stopped answer's prompt and
text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar


class RunningGrant(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def preemptible(self) -> bool: ...


G = TypeVar("G", bound=RunningGrant)


def victim(
    running: Iterable[G],
    *,
    tenant: str,
    priority: int,
    capacity: int,
    weight: Callable[[str], float],
    waiting: Callable[[str], int],
) -> G | None:
    """The running grant to pre-empt for a waiting request of `tenant` in band `priority`, or None
    (module docstring). `waiting(t)`: requests of tenant t waiting, this one included.

    >>> from types import SimpleNamespace as R
    >>> heavy = [R(tenant="heavy", priority=0, completion_tokens=n, preemptible=True) for n in (9, 3)]
    >>> def one(t): return 1 if t == "light" else 0
    >>> victim(heavy, tenant="light", priority=0, capacity=2, weight=lambda t: 1.0, waiting=one)
    namespace(tenant='heavy', priority=0, completion_tokens=3, preemptible=True)
    """
    if waiting(tenant) > 1:
        return None
    grants = list(running)
    held = Counter(g.tenant for g in grants)
    tenants = {*held, tenant}
    total = sum(weight(t) for t in tenants)
    slots = max(capacity, len(grants))

    def share(t: str) -> float:
        return slots * weight(t) / total

    if held[tenant] + 1 > share(tenant):
        return None

    def over(g: G) -> bool:
        return held[g.tenant] - 1 >= share(g.tenant)

    candidates = [g for g in grants if g.preemptible and g.priority <= priority and over(g)]
    if not candidates:
        return None
    return min(candidates, key=lambda g: (-held[g.tenant] / weight(g.tenant), g.completion_tokens))
