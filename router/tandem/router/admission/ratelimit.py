"""Per-tenant rate limits: a request bucket and a token bucket per tenant (pure; injected clock).

Each limit is a token bucket that holds one minute's worth (`requestsPerMinute` requests,
`tokensPerMinute` tokens; at least 1) and refills continuously at limit / 60 per second. A tenant
starts with full buckets, so it may burst one minute's allowance and is then held to the rate.

- **Requests**: a request needs 1 in the request bucket and takes it when admitted.
- **Tokens**: a request needs its prompt's tokens (capped at the bucket's size, so a prompt larger
  than a minute's allowance waits for a full bucket rather than forever) and takes them when admitted;
  its output tokens are taken as they stream back (`charge`), which may drive the bucket below zero.
  That debt is repaid by refill before the tenant's next request passes. Nothing is reserved for
  `max_tokens` and nothing is refunded.
- A request is admitted only when *both* buckets have enough; then both are debited. Otherwise nothing
  is taken and the refusal says which bucket is short and when it will have enough. The prompt is
  counted (tokenized) only when it must be: not for a tenant without a token limit, and not when the
  buckets already refuse a one-token request (an exhausted tenant's flood costs no tokenizing; such
  a refusal's wait is that of a one-token request, a lower bound):
  `retry_after_s = ceil((needed - level) / rate)`, at least 1. Worked example: 60 requests per minute
  (1 per second), bucket at 0.25 → a request needs 0.75 more → Retry-After 1 s; 6000 tokens per minute
  (100/s), bucket at -450 after a long answer, prompt 50 tokens → (50 + 450) / 100 = 5 s.

Sibling workers (`tandem router --workers N`) share what they take: `on_take(tenant, requests,
tokens)` is told every debit, and `absorb` debits what a sibling took, so the N processes hold a
tenant to one limit between them (within the bus's few milliseconds), not N.

Memory is bounded: tenants are kept in least-recently-used order; a tenant whose buckets are full
again (idle for a minute or so) is indistinguishable from a new one and is dropped, and beyond
`max_tenants` the least recently used are dropped even if not full (they restart with full buckets).
Tenants without any limit get no buckets at all.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

LimitKind = Literal["requests", "tokens"]
DEFAULT_MAX_TENANTS = 10_000


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's limits per minute; None: unlimited."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.requests_per_minute is None and self.tokens_per_minute is None


@dataclass(slots=True)
class TokenBucket:
    """`capacity` units, refilled at `rate_per_s`; `level` may go negative (debt) through `take`."""

    capacity: float
    rate_per_s: float
    level: float
    updated: float  # clock seconds of the last refill

    @classmethod
    def per_minute(cls, limit: float, *, now: float) -> TokenBucket:
        capacity = max(limit, 1.0)
        return cls(capacity=capacity, rate_per_s=limit / 60.0, level=capacity, updated=now)

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.level = min(self.capacity, self.level + elapsed * self.rate_per_s)
        self.updated = max(self.updated, now)

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` (capped at the capacity) is available; 0 when it is now."""
        needed = min(amount, self.capacity)
        return 0.0 if self.level >= needed else (needed - self.level) / self.rate_per_s

    def take(self, amount: float) -> None:
        self.level -= amount

    def full(self) -> bool:
        return self.level >= self.capacity


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the bucket short of it, that limit, and whole seconds to wait."""

    kind: LimitKind
    limit_per_minute: float
    retry_after_s: int


@dataclass(slots=True)
class _Buckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None

    def refill(self, now: float) -> None:
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.refill(now)

    def full(self) -> bool:
        return all(b is None or b.full() for b in (self.requests, self.tokens))


@dataclass(slots=True, kw_only=True)
class RateLimiter:
    """The buckets of every limited tenant (module docstring). `default`: limits of tenants not in
    `per_tenant`. Single-threaded (the router's event loop)."""

    default: Limits
    per_tenant: Mapping[str, Limits]
    clock: Callable[[], float]
    max_tenants: int = DEFAULT_MAX_TENANTS
    on_take: Callable[[str, int, int], None] | None = None
    _tenants: OrderedDict[str, _Buckets] = field(default_factory=OrderedDict)

    def limits(self, tenant: str) -> Limits:
        return self.per_tenant.get(tenant, self.default)

    def __len__(self) -> int:
        """Tenants with buckets held now."""
        return len(self._tenants)

    def admit(self, tenant: str, *, prompt_tokens: Callable[[], int]) -> Refusal | None:
        """Take one request and the prompt's tokens from `tenant`'s buckets, or take nothing and
        say why not. `prompt_tokens()` counts the prompt; it is called only when a token bucket
        has at least one token for it (module docstring)."""
        buckets = self._buckets(tenant)
        if buckets is None:
            return None
        refusal = _refusal(buckets, 1)
        if refusal is not None:
            return refusal
        tokens = prompt_tokens() if buckets.tokens is not None else 0
        if tokens > 1:
            refusal = _refusal(buckets, tokens)
            if refusal is not None:
                return refusal
        if buckets.requests is not None:
            buckets.requests.take(1)
        if buckets.tokens is not None:
            buckets.tokens.take(tokens)
        if self.on_take is not None:
            self.on_take(tenant, 1, tokens)
        return None

    def charge(self, tenant: str, tokens: int) -> None:
        """Output tokens of an admitted request, as they stream (may leave the bucket in debt)."""
        if tokens <= 0:
            return
        buckets = self._buckets(tenant)
        if buckets is not None and buckets.tokens is not None:
            buckets.tokens.take(tokens)
            if self.on_take is not None:
                self.on_take(tenant, 0, tokens)

    def absorb(self, tenant: str, requests: int, tokens: int) -> None:
        """Debit what a sibling worker took for `tenant` (never refused; may leave debt)."""
        buckets = self._buckets(tenant)
        if buckets is None:
            return
        if buckets.requests is not None and requests > 0:
            buckets.requests.take(requests)
        if buckets.tokens is not None and tokens > 0:
            buckets.tokens.take(tokens)

    def _buckets(self, tenant: str) -> _Buckets | None:
        limits = self.limits(tenant)
        if limits.unlimited:
            return None
        now = self.clock()
        buckets = self._tenants.get(tenant)
        if buckets is None:
            buckets = _Buckets(
                requests=_bucket(limits.requests_per_minute, now),
                tokens=_bucket(limits.tokens_per_minute, now),
            )
            self._tenants[tenant] = buckets
        else:
            self._tenants.move_to_end(tenant)
            buckets.refill(now)
        self._evict(now, keep=tenant)
        return buckets

    def _evict(self, now: float, *, keep: str) -> None:
        while self._tenants:
            oldest, buckets = next(iter(self._tenants.items()))
            if oldest == keep:
                return
            if len(self._tenants) <= self.max_tenants:
                buckets.refill(now)
                if not buckets.full():
                    return
            del self._tenants[oldest]


def _bucket(limit: float | None, now: float) -> TokenBucket | None:
    return None if limit is None else TokenBucket.per_minute(limit, now=now)


def _refusal(buckets: _Buckets, prompt_tokens: int) -> Refusal | None:
    worst: Refusal | None = None
    checks: tuple[tuple[LimitKind, TokenBucket | None, float], ...] = (
        ("requests", buckets.requests, 1.0),
        ("tokens", buckets.tokens, float(prompt_tokens)),
    )
    for kind, bucket, amount in checks:
        if bucket is None:
            continue
        wait = bucket.wait_s(amount)
        if wait > 0 and (worst is None or wait > worst.retry_after_s):
            worst = Refusal(kind, bucket.rate_per_s * 60.0, max(1, math.ceil(wait - 1e-9)))
    return worst
