"""Virtual-token-counter (VTC) fair queuing between tenants (Sheng et al., OSDI 2024, Algorithm 2).

Pure and synchronous: the gateway's async admission layer pushes waiting requests here and pops the
next one to dispatch whenever an engine has room. Each tenant has a counter of the service it received:

    charge at dispatch:    c_t += input_weight  * prompt_tokens    / weight_t
    charge per token out:  c_t += output_weight * generated_tokens / weight_t

`pop` dispatches the oldest request of the backlogged tenant with the smallest counter, within the
highest non-empty priority band (bands are strict: priority 1 is always served before priority 0).
A tenant that becomes backlogged is lifted to the smallest counter among the backlogged tenants, or to
the counter of the last tenant to leave the queue when none is, so idling never banks credit.

Worked example (weights 1 and 2, tenant A backlogged with c_A = 300, B arrives with c_B = 0):
B is lifted to 300, not left at 0, so it cannot monopolise the engines to "catch up". B's 100-token
prompt then costs it 100 and A's next 100-token prompt costs A 100: they alternate.

**What is ahead** of a new request (`ahead`, for honest early rejection and Retry-After): every
request in a higher band, the tenant's own requests already waiting in its band, and from each other
tenant g of that band as many as VTC serves while this tenant gets its k = own + 1: about
k·w_g/w_t of them (equal-sized requests; counters within U of each other), at most all g has waiting.
Example: light (nothing waiting) arrives behind 30 heavy requests → ahead = 0 + min(30, 1) = 1;
heavy's 31st request → ahead = 30 + min(light's waiting, 31).

**A full queue** (longest queue drop, fair buffer sharing): when a request arrives to a full queue,
`displaceable` names the request to push out instead of refusing the newcomer: the newest waiting
request of the lowest band below the newcomer's, else, within its band, the newest of the tenant with
the most requests waiting per unit of weight, if that tenant holds more of the queue than the
newcomer's tenant would (weighted). A tenant under its fair share of the queue is therefore never
refused while another is over it. Example: 100 places, heavy holds 99 and light 1; light's next
request pushes out heavy's newest; heavy's next request is refused.

Bound (paper, Lemma 4.3 and Theorem 4.4): with U = max(input_weight·L_input, output_weight·M), L_input the
longest prompt and M the most tokens a batch holds, counters of backlogged tenants differ by at most U,
and their service over any interval by at most 2U.

**Bounded state** (tenant names may come from a client header, so there may be millions): the queue
keeps a counter only for tenants with requests waiting (at most `max_size`) and for the `max_idle`
most recently seen others (idle: nothing waiting; seen: charged, lifted, or added to by a sibling),
forgetting the least recently seen first. Tracked tenants ≤ `max_size` + `max_idle`, whatever the
number of names: `tracked()`. A running stream's tenant is charged as its tokens arrive, so it stays
among the recently seen; the queue itself does not see streams end. Forgetting keeps the bound: the
lemma is about backlogged tenants only, and a tenant forgotten while idle comes back through the
lift, at `max(its counter, the floor)` with its counter read as 0, i.e. at the floor, the smallest
counter of the backlogged tenants; backlogged counters then still lie within U of each other, so the
2U service bound holds from that moment as it does for a new tenant. What forgetting gives up is the
memory that stops a tenant that was served *above* the floor from pausing to shed its lead: only one
of `max_idle` tenants seen since, and a client that picks its tenant name can take a fresh name
anyway (with API keys on, tenants are the key file's). The last tenant to leave the queue, whose
counter is the floor while nothing waits, is never forgotten. Example: `max_idle` = 2; A, B, C go
idle in that order; C's arrival among the idle forgets A; A returns at the floor, as a new tenant would.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

#: Idle tenants whose counters are remembered (so a heavy tenant cannot reset itself by pausing).
IDLE_TENANTS_REMEMBERED = 10_000


class QueueFull(Exception):
    """The queue holds `max_size` requests; the caller answers 429."""


@dataclass(eq=False)  # identity equality: a ticket is one waiting request
class Ticket(Generic[T]):
    """A queued request: the caller's payload plus what the queue needs to order and charge it."""

    item: T
    tenant: str
    prompt_tokens: int
    priority: int
    seq: int
    done: bool = field(default=False)


class VTCQueue(Generic[T]):
    """Bounded multi-tenant queue ordered by virtual token counters; see the module docstring."""

    def __init__(
        self,
        *,
        input_weight: float = 1.0,
        output_weight: float = 2.0,
        tenant_weights: Mapping[str, float] | None = None,
        max_size: int = 1000,
        on_charge: Callable[[str, float], None] | None = None,
        max_idle: int = IDLE_TENANTS_REMEMBERED,
    ) -> None:
        if input_weight <= 0 or output_weight <= 0:
            raise ValueError("input_weight and output_weight must be positive")
        if max_idle < 1:
            raise ValueError("max_idle must be at least 1")
        self.max_idle = max_idle
        self.input_weight = input_weight
        self.output_weight = output_weight
        self._tenant_weights = dict(tenant_weights or {})
        self.max_size = max_size
        self.on_charge = on_charge  # told every charge (tenant, weighted service): shared counters
        self._counters: dict[str, float] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # tenants with a counter but no queue
        self._bands: dict[int, dict[str, deque[Ticket[T]]]] = {}
        self._queued: dict[str, int] = {}  # live (not cancelled) tickets per tenant
        self._size = 0
        self._seq = 0
        self._last_departed: str | None = None

    def __len__(self) -> int:
        return self._size

    def weight(self, tenant: str) -> float:
        return self._tenant_weights.get(tenant, 1.0)

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def counters(self) -> dict[str, float]:
        """Counters of every tenant remembered (backlogged or recently idle)."""
        return dict(self._counters)

    def tracked(self) -> int:
        """Tenants the queue holds any state for: at most `max_size` + `max_idle` (module docstring)."""
        return len(self._counters.keys() | self._queued.keys())

    def waiting(self, tenant: str) -> int:
        """Requests of `tenant` waiting."""
        return self._queued.get(tenant, 0)

    def backlogged(self) -> set[str]:
        """Tenants with at least one request waiting."""
        return {t for t, n in self._queued.items() if n > 0}

    def push(
        self, item: T, *, tenant: str, prompt_tokens: int, priority: int = 0, front: bool = False
    ) -> Ticket[T]:
        """Queue a request; lifts the tenant's counter if it just became backlogged. `front`: ahead
        of the tenant's other waiting requests, and of other tenants' at an equal counter (a
        pre-empted stream's continuation, which was there first).

        Raises QueueFull when `max_size` requests are waiting (never for `front`: an answer that has
        started is not refused).
        """
        if self._size >= self.max_size and not front:
            raise QueueFull(f"the queue holds {self.max_size} requests")
        if not self._queued.get(tenant):
            self._lift(tenant)
        self._seq += 1
        seq = -self._seq if front else self._seq
        ticket = Ticket(item=item, tenant=tenant, prompt_tokens=prompt_tokens, priority=priority, seq=seq)
        waiting = self._bands.setdefault(priority, {}).setdefault(tenant, deque())
        if front:
            waiting.appendleft(ticket)
        else:
            waiting.append(ticket)
        self._queued[tenant] = self._queued.get(tenant, 0) + 1
        self._size += 1
        return ticket

    def peek(self) -> Ticket[T] | None:
        """The request `pop` would dispatch now, without dispatching it; None when nothing waits."""
        for priority in sorted(self._bands, reverse=True):
            band = self._bands[priority]
            if band:
                return band[self._next_tenant(band)][0]
        return None

    def _next_tenant(self, band: Mapping[str, deque[Ticket[T]]]) -> str:
        """The fairness choice within a non-empty band: the least counter, ties to the oldest head."""
        return min(band, key=lambda t: (self.counter(t), band[t][0].seq))

    def pop(self) -> Ticket[T] | None:
        """Dispatch the next request and charge its prompt; None when nothing waits."""
        ticket = self.peek()
        if ticket is not None:
            self._leave(ticket)
            self._charge(ticket.tenant, self.input_weight * ticket.prompt_tokens)
        return ticket

    def take(self, ticket: Ticket[T]) -> None:
        """Dispatch this waiting request out of turn and charge its prompt, as `pop` would (the
        gate's pre-emption serves a tenant with nothing running at once)."""
        if not ticket.done:
            self._leave(ticket)
            self._charge(ticket.tenant, self.input_weight * ticket.prompt_tokens)

    def pass_through(self, *, tenant: str, prompt_tokens: int) -> None:
        """A request dispatched without ever waiting (nothing queued, room free): exactly what
        `push` then `pop` would do to the counters, without a ticket. Raises ValueError while
        requests wait (they go first)."""
        if self._size:
            raise ValueError("requests are waiting: queue this one")
        self._lift(tenant)
        self._last_departed = tenant
        self._charge(tenant, self.input_weight * prompt_tokens)

    def ahead(self, *, tenant: str, priority: int = 0) -> int:
        """Requests dispatched before a new request of `tenant` in band `priority` (estimate;
        module docstring)."""
        count = sum(
            len(q)
            for band_priority, band in self._bands.items()
            if band_priority > priority
            for q in band.values()
        )
        band = self._bands.get(priority)
        if not band:
            return count
        own = len(band.get(tenant, ()))
        count += own
        turns, weight = own + 1, self.weight(tenant)
        for other, queue in band.items():
            if other != tenant:
                count += min(len(queue), math.ceil(turns * self.weight(other) / weight))
        return count

    def displaceable(self, *, tenant: str, priority: int = 0) -> Ticket[T] | None:
        """The waiting request to push out so that a new request of `tenant` in band `priority`
        fits a full queue; None when the newcomer itself should be refused (module docstring)."""
        lower = [p for p in self._bands if p < priority]
        if lower:
            lowest = self._bands[min(lower)]
            return max((q[-1] for q in lowest.values()), key=lambda t: t.seq)
        band = self._bands.get(priority)
        if not band:
            return None

        def held(t: str) -> float:
            return len(band.get(t, ())) / self.weight(t)

        victim = max(band, key=lambda t: (held(t), self.counter(t)))
        if victim == tenant or held(victim) <= (len(band.get(tenant, ())) + 1) / self.weight(tenant):
            return None
        return band[victim][-1]

    def cancel(self, ticket: Ticket[T]) -> None:
        """Withdraw a waiting request (deadline passed, client gone); no charge. Idempotent."""
        if not ticket.done:
            self._leave(ticket)

    def charge_output(self, tenant: str, tokens: int) -> None:
        """Charge generated tokens as they stream back (or at completion for non-streaming).
        A negative count corrects an earlier overcount."""
        self._charge(tenant, self.output_weight * tokens)

    def charge_input(self, tenant: str, tokens: int) -> None:
        """Correct the prompt charge made at dispatch (`pop` charges its estimate) once the engine
        reports the true prompt length; `tokens` is the difference and may be negative."""
        self._charge(tenant, self.input_weight * tokens)

    def depths(self) -> dict[int, int]:
        """Requests waiting per priority band."""
        return {p: sum(len(q) for q in band.values()) for p, band in self._bands.items()}

    def gap(self) -> float:
        """max − min counter over backlogged tenants (0 with fewer than two); bounded by U."""
        values = [self.counter(t) for t in self.backlogged()]
        return max(values) - min(values) if len(values) > 1 else 0.0

    def add_service(self, tenant: str, service: float) -> None:
        """Service a sibling worker charged `tenant` (already weighted): counters are shared."""
        self._counters[tenant] = self.counter(tenant) + service
        self._seen(tenant)

    def _charge(self, tenant: str, cost: float) -> None:
        service = cost / self.weight(tenant)
        self._counters[tenant] = self.counter(tenant) + service
        self._seen(tenant)
        if self.on_charge is not None:
            self.on_charge(tenant, service)

    def _lift(self, tenant: str) -> None:
        others = [self.counter(t) for t in self.backlogged() if t != tenant]
        if others:
            floor = min(others)
        elif self._last_departed is not None:
            floor = self.counter(self._last_departed)
        else:
            floor = 0.0
        self._counters[tenant] = max(self.counter(tenant), floor)
        self._idle.pop(tenant, None)

    def _leave(self, ticket: Ticket[T]) -> None:
        """Take a ticket out of its band (dispatched or cancelled) and update the backlog."""
        tenant = ticket.tenant
        band = self._bands[ticket.priority]
        band[tenant].remove(ticket)  # O(queue length of one tenant); the head when dispatching
        if not band[tenant]:
            del band[tenant]
            if not band:
                del self._bands[ticket.priority]
        ticket.done = True
        self._size -= 1
        self._queued[tenant] -= 1
        if self._queued[tenant] == 0:
            del self._queued[tenant]
            self._last_departed = tenant
            self._seen(tenant)

    def _seen(self, tenant: str) -> None:
        """`tenant`'s counter moved: if it waits for nothing, it is now the most recently seen idle
        tenant, and the least recently seen beyond `max_idle` are forgotten (module docstring)."""
        if tenant in self._queued:
            return
        self._idle[tenant] = None
        self._idle.move_to_end(tenant)
        while len(self._idle) > self.max_idle:
            oldest = next(iter(self._idle))
            if oldest == self._last_departed:  # the floor while nothing waits: kept, seen anew
                self._idle.move_to_end(oldest)
                oldest = next(iter(self._idle))
            del self._idle[oldest]
            self._counters.pop(oldest, None)
