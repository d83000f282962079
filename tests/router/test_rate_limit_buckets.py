"""Per-tenant rate limits as pure logic: token buckets, refusals with Retry-After, output debt, and
bounded memory. Real: `RateLimiter` and `TokenBucket`; faked: the clock (moved by hand)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from tests.router.harness import FakeClock

from tandem.router.admission.ratelimit import Limits, RateLimiter, Refusal, TokenBucket


def limiter(
    clock: FakeClock,
    *,
    rpm: float | None = None,
    tpm: float | None = None,
    per_tenant: Mapping[str, Limits] | None = None,
    max_tenants: int = 10_000,
) -> RateLimiter:
    """Default limits `rpm` requests and `tpm` tokens per minute (None: unlimited)."""
    return RateLimiter(
        default=Limits(rpm, tpm), per_tenant=per_tenant or {}, clock=clock, max_tenants=max_tenants
    )


def test_a_tenant_may_burst_one_minutes_requests_then_is_refused_until_the_bucket_refills() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=60)  # 1 request per second, bucket of 60
    assert all(limits.admit("a", prompt_tokens=tokens(10)) is None for _ in range(60))
    refusal = limits.admit("a", prompt_tokens=tokens(10))
    assert refusal == Refusal(kind="requests", limit_per_minute=60, retry_after_s=1)
    clock.advance(1.0)
    assert limits.admit("a", prompt_tokens=tokens(10)) is None
    assert limits.admit("a", prompt_tokens=tokens(10)) is not None


@pytest.mark.parametrize(
    ("level", "amount", "rate_per_s", "retry_after_s"),
    [
        (0.25, 1, 1.0, 1),  # needs 0.75 more at 1/s → 0.75 s → 1 s
        (-450, 50, 100.0, 5),  # after a long answer: (50 + 450) / 100 = 5 s
        (0, 10, 0.5, 2),  # empty: refused before counting, the wait of a one-token request
        (2.5, 3, 0.5, 1),  # 0.5 more at 0.5/s = 1 s exactly
    ],
)
def test_retry_after_is_the_time_until_the_bucket_holds_what_the_request_needs(
    level: float, amount: float, rate_per_s: float, retry_after_s: int
) -> None:
    clock = FakeClock()
    limits = limiter(clock, tpm=rate_per_s * 60)
    assert limits.admit("a", prompt_tokens=tokens(0)) is None  # creates the bucket
    bucket = limits._tenants["a"].tokens
    assert bucket is not None
    bucket.level = level
    refusal = limits.admit("a", prompt_tokens=tokens(int(amount)))
    assert refusal is not None and refusal.kind == "tokens"
    assert refusal.retry_after_s == retry_after_s


def tokens(n: int) -> Callable[[], int]:
    """The prompt counter the limiter calls when it needs the prompt's length."""
    return lambda: n


def test_a_tenant_out_of_tokens_is_refused_without_counting_its_prompt() -> None:
    clock = FakeClock()
    limits = limiter(clock, tpm=60)
    assert limits.admit("a", prompt_tokens=tokens(60)) is None  # the bucket is empty now

    def must_not_count() -> int:
        raise AssertionError("the prompt was tokenized for a request that was refused anyway")

    refusal = limits.admit("a", prompt_tokens=must_not_count)
    assert refusal is not None and refusal.kind == "tokens"


def test_a_tenant_without_a_token_limit_is_never_counted() -> None:
    limits = limiter(FakeClock(), rpm=10)

    def must_not_count() -> int:
        raise AssertionError("counted without a token limit")

    assert limits.admit("a", prompt_tokens=must_not_count) is None


def test_a_refused_request_takes_nothing_from_either_bucket() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=10, tpm=100)
    assert limits.admit("a", prompt_tokens=tokens(100)) is None  # tokens now 0, requests 9
    assert limits.admit("a", prompt_tokens=tokens(1)) is not None
    buckets = limits._tenants["a"]
    assert buckets.requests is not None and buckets.requests.level == 9
    assert buckets.tokens is not None and buckets.tokens.level == 0


def test_output_tokens_leave_a_debt_that_delays_the_next_request() -> None:
    clock = FakeClock()
    limits = limiter(clock, tpm=600)  # 10 tokens per second, bucket of 600
    assert limits.admit("a", prompt_tokens=tokens(100)) is None
    limits.charge("a", 1000)  # a long answer: 600 - 100 - 1000 = -500
    refusal = limits.admit("a", prompt_tokens=tokens(10))
    assert refusal is not None and refusal.retry_after_s == 51  # (10 + 500) / 10
    clock.advance(51)
    assert limits.admit("a", prompt_tokens=tokens(10)) is None


def test_a_prompt_larger_than_a_minutes_allowance_waits_for_a_full_bucket_not_forever() -> None:
    clock = FakeClock()
    limits = limiter(clock, tpm=60)
    assert limits.admit("a", prompt_tokens=tokens(1000)) is None  # full bucket: admitted, 60 - 1000 = -940
    refusal = limits.admit("a", prompt_tokens=tokens(1000))
    # In debt, it is refused before its prompt is counted: the wait of a one-token request.
    assert refusal is not None and refusal.retry_after_s == 941
    clock.advance(941)
    refusal = limits.admit("a", prompt_tokens=tokens(1000))
    assert refusal is not None and refusal.retry_after_s == 59  # counted now: needs a full bucket, 60
    clock.advance(59)
    assert limits.admit("a", prompt_tokens=tokens(1000)) is None


def test_the_longer_wait_of_two_short_buckets_is_reported() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=1, tpm=60)
    assert limits.admit("a", prompt_tokens=tokens(60)) is None
    refusal = limits.admit("a", prompt_tokens=tokens(60))
    assert refusal == Refusal(kind="requests", limit_per_minute=1, retry_after_s=60)


def test_tenants_have_their_own_buckets_and_their_own_limits() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=1, per_tenant={"gold": Limits(requests_per_minute=3), "free": Limits()})
    assert limits.admit("a", prompt_tokens=tokens(1)) is None
    assert limits.admit("a", prompt_tokens=tokens(1)) is not None
    assert limits.admit("b", prompt_tokens=tokens(1)) is None
    assert [limits.admit("gold", prompt_tokens=tokens(1)) is None for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]
    assert all(limits.admit("free", prompt_tokens=tokens(10**9)) is None for _ in range(100))
    assert "free" not in limits._tenants  # unlimited tenants hold no buckets


def test_without_limits_nothing_is_refused_and_nothing_is_kept() -> None:
    limits = limiter(FakeClock())
    assert all(limits.admit(f"t{i}", prompt_tokens=tokens(10**6)) is None for i in range(1000))
    limits.charge("t1", 10**9)
    assert len(limits) == 0


def test_idle_tenants_are_forgotten_once_their_buckets_are_full_again() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=60)
    for i in range(100):
        limits.admit(f"t{i}", prompt_tokens=tokens(1))
    assert len(limits) == 100
    clock.advance(1.0)  # every bucket is back at 60
    limits.admit("new", prompt_tokens=tokens(1))
    assert len(limits) == 1


def test_memory_stays_bounded_when_many_tenants_are_active_at_once() -> None:
    clock = FakeClock()
    limits = limiter(clock, rpm=60, max_tenants=50)
    for i in range(10_000):
        limits.admit(f"t{i}", prompt_tokens=tokens(1))
        assert len(limits) <= 50
    # The least recently used were dropped: a dropped tenant starts again with a full bucket.
    assert "t0" not in limits._tenants and "t9999" in limits._tenants


def test_a_bucket_refills_continuously_and_never_beyond_its_capacity() -> None:
    bucket = TokenBucket.per_minute(120, now=0.0)
    bucket.take(120)
    bucket.refill(15.0)
    assert bucket.level == pytest.approx(30.0)
    bucket.refill(1000.0)
    assert bucket.level == 120
    assert TokenBucket.per_minute(0.5, now=0).capacity == 1  # a request must fit a bucket
