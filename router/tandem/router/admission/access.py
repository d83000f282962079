"""Access control at the gateway: who is calling (API keys → tenants) and how much they may send
(per-tenant rate limits), with their metrics.

The composition root reads the key file (a bad one stops start-up with one line) and calls
`build_access` for the rest.

Metrics (docs/router.md):
- `tandem_router_auth_failures_total{reason}`: 401s; `reason` is `missing` or `invalid`.
- `tandem_router_api_keys`: entries in the key table now (absent while auth is off).
- `tandem_router_api_key_reloads_total{outcome}`: reloads of the key file, `ok` or `error`.
- `tandem_router_rate_limited_total{tenant,kind}`: 429s from rate limits; `kind` is `requests` or
  `tokens`; tenant labels are bounded like the admission metrics' (`--max-tenant-labels`, then `other`).
- `tandem_router_rate_limited_tenants`: tenants whose rate-limit buckets are held now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.core.spec import RateLimitSpec, RouterSpec
from tandem.router.admission.metrics import TenantLabels
from tandem.router.admission.ratelimit import Limits, RateLimiter
from tandem.router.errors import RateLimited
from tandem.router.identity.auth.gate import AuthFailure, KeyAuth
from tandem.router.identity.auth.keyfile import KeyFile
from tandem.router.identity.headers import HeaderTenant, PriorityPolicy, TenantPriority, TenantResolver
from tandem.router.settings import RouterSettings

PREFIX = "tandem_router"


def _limits(spec: RateLimitSpec) -> Limits:
    return Limits(requests_per_minute=spec.requests_per_minute, tokens_per_minute=spec.tokens_per_minute)


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """`tenants` resolves (with auth on: authenticates) the caller; `priorities` gives its band;
    `limiter` holds the buckets; `key_file` is the watched key file (None: auth off)."""

    tenants: TenantResolver
    priorities: PriorityPolicy
    limiter: RateLimiter
    key_file: KeyFile | None
    rate_limited: Counter
    labels: TenantLabels

    def admit(self, tenant: str, *, prompt_tokens: Callable[[], int]) -> None:
        """Take the request from the tenant's rate limits; raises `RateLimited` (429).
        `prompt_tokens()` is called only when a token limit needs the count."""
        refusal = self.limiter.admit(tenant, prompt_tokens=prompt_tokens)
        if refusal is None:
            return
        self.rate_limited.labels(tenant=self.labels.label(tenant), kind=refusal.kind).inc()
        raise RateLimited(
            f"Rate limit reached for tenant {tenant!r} on {refusal.kind} per minute: limit "
            f"{refusal.limit_per_minute:g}. Please retry after {refusal.retry_after_s} s.",
            kind=refusal.kind,
            retry_after_s=refusal.retry_after_s,
        )

    def output_charge(self, tenant: str) -> Callable[[int], None] | None:
        """What to call with each output token counted for `tenant` (its token bucket), or None
        when the tenant has no token limit."""
        limiter = self.limiter
        if limiter.limits(tenant).tokens_per_minute is None:
            return None
        return lambda tokens: limiter.charge(tenant, tokens)


def build_access(
    *,
    router: RouterSpec,
    settings: RouterSettings,
    key_file: KeyFile | None,
    prometheus: CollectorRegistry,
    clock: Callable[[], float],
) -> Access:
    """The access layer: key authentication when `key_file` is given (else the tenant header),
    and the rate limiter of `spec.router.rateLimits` / `spec.router.tenants[].rateLimits`."""
    limiter = RateLimiter(
        default=_limits(router.rate_limits),
        per_tenant={t.name: _limits(t.rate_limits) for t in router.tenants if t.rate_limits is not None},
        clock=clock,
        max_tenants=settings.access.max_rate_limited_tenants,
    )
    rate_limited = Counter(
        f"{PREFIX}_rate_limited",
        "Requests refused with 429 by a tenant rate limit, by tenant and kind (requests, tokens).",
        ["tenant", "kind"],
        registry=prometheus,
    )
    held = Gauge(
        f"{PREFIX}_rate_limited_tenants",
        "Tenants whose rate-limit buckets are held now.",
        registry=prometheus,
    )
    held.set_function(lambda: len(limiter))
    tenants: TenantResolver = HeaderTenant(router.fairness.tenant_header)
    if key_file is not None:
        failures = Counter(
            f"{PREFIX}_auth_failures",
            "Requests refused with 401, by reason (missing, invalid).",
            ["reason"],
            registry=prometheus,
        )

        def on_failure(reason: AuthFailure) -> None:
            failures.labels(reason=reason).inc()

        tenants = KeyAuth(lambda: key_file.table, on_failure=on_failure)
        prometheus.register(KeyFileCollector(key_file))
    priorities = PriorityPolicy(
        {t.name: TenantPriority(t.priority, t.allow_lower_priority) for t in router.tenants}
    )
    return Access(
        tenants=tenants,
        priorities=priorities,
        limiter=limiter,
        key_file=key_file,
        rate_limited=rate_limited,
        labels=TenantLabels(settings.admission.max_tenant_labels),
    )


class KeyFileCollector(Collector):
    """Scrape-time metrics of the key file: entries now, reloads by outcome."""

    def __init__(self, key_file: KeyFile) -> None:
        self._key_file = key_file

    def collect(self) -> Iterator[Metric]:
        keys = GaugeMetricFamily(f"{PREFIX}_api_keys", "Entries in the API key table now.")
        keys.add_metric([], len(self._key_file.table))
        reloads = CounterMetricFamily(
            f"{PREFIX}_api_key_reloads",
            "Reloads of the API key file after it changed, by outcome (ok; error: the old keys stay).",
            labels=["outcome"],
        )
        for outcome, count in self._key_file.reloads.items():
            reloads.add_metric([outcome], count)
        yield from (keys, reloads)

    def describe(self) -> Iterator[Metric]:
        return iter(())
