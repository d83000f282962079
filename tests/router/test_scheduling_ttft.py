"""The TTFT predictor, the learned prefill rates, and the scheduling state's accounting of the router's
own traffic, as tables and fake-clock stories.

Pure: no servers; time is a `FakeClock` moved by hand. The dispatcher's calls (`started`,
`answered`, `finished`) are made by the test in the order the dispatcher makes them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from tests.router.harness import FakeClock
from tests.router.scheduling_builders import A, B, request, snapshot, stats

from tandem.router.discovery.kvevents.ports import KeyedPrompt
from tandem.router.scheduling import SchedulingState
from tandem.router.scheduling.state import Ticket
from tandem.router.scheduling.ttft import PrefillRates, predict_ttft
from tandem.router.types import Endpoint

PROMPT = tuple(range(1, 1031))  # 1,030 tokens: 64 full blocks of 16 (1,024 tokens) and 6 more


@pytest.mark.parametrize(
    ("queued", "uncached", "rate", "expected"),
    [
        pytest.param(3000, 6, 10_000, 0.3006, id="queued-work-first"),
        pytest.param(0, 1030, 10_000, 0.103, id="idle-and-uncached"),
        pytest.param(0, 1, 1000, 0.001, id="fully-cached-one-token"),
        pytest.param(-5, 100, 1000, 0.1, id="negative-counts-as-zero"),
    ],
)
def test_predicted_ttft_is_queued_plus_uncached_work_over_the_rate(
    queued: float, uncached: float, rate: float, expected: float
) -> None:
    assert predict_ttft(
        queued_tokens=queued, uncached_tokens=uncached, tokens_per_second=rate
    ) == pytest.approx(expected)


def test_predict_ttft_refuses_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        predict_ttft(queued_tokens=0, uncached_tokens=1, tokens_per_second=0)


def test_rates_start_from_the_prior_then_learn_a_token_weighted_average() -> None:
    rates = PrefillRates(prior_tokens_per_second=8192, smoothing=0.2)
    assert rates.rate(A.url) == 8192
    assert rates.observe(A.url, tokens=1000, seconds=0.1)
    assert rates.rate(A.url) == pytest.approx(10_000)
    assert rates.observe(A.url, tokens=3000, seconds=0.2)
    assert rates.rate(A.url) == pytest.approx(1400 / 0.12)  # 11,667 tokens/s
    assert rates.observations(A.url) == 2


def test_with_enough_varied_samples_the_fixed_overhead_is_fitted() -> None:
    rates = PrefillRates(smoothing=0.2)
    rates.observe(A.url, tokens=1000, seconds=0.12)
    rates.observe(A.url, tokens=3000, seconds=0.32)
    assert rates.rate(A.url) == pytest.approx(8750)  # two samples: the line through 0
    assert rates.overhead(A.url) == 0.0
    rates.observe(A.url, tokens=2000, seconds=0.22)  # on t = 0.02 + W / 10,000
    assert rates.rate(A.url) == pytest.approx(10_000)
    assert rates.overhead(A.url) == pytest.approx(0.02)
    # Within the work seen (the weighted mean W̄ = 1,520) the line as it is; past it the overhead
    # grows with the work: 0.02 × 3,006 / 1,520 + 3,006 / 10,000.
    assert rates.predict(A.url, queued_tokens=1000, uncached_tokens=500) == pytest.approx(0.17)
    assert rates.predict(A.url, queued_tokens=3000, uncached_tokens=6) == pytest.approx(
        0.02 * 3006 / 1520 + 0.3006
    )


def test_a_fit_from_one_prompt_size_does_not_predict_a_long_queue_at_its_flat_slope() -> None:
    # At idle every sample is about one 3,030-token prompt and a batching engine's times scatter:
    # the line comes out flat with a large overhead (the measured case of the module docstring).
    rates = PrefillRates(smoothing=0.2)
    for work, seconds in [(3030, 0.20), (6060, 0.27), (3030, 0.21), (3030, 0.19), (6060, 0.26)]:
        rates.observe(A.url, tokens=work, seconds=seconds)
    model = rates.model(A.url)
    assert model.overhead > 0.1 and model.rate > 40_000
    assert model.seen == pytest.approx(3_946.272)
    # One prompt on an idle engine: the line itself.
    assert rates.predict(A.url, queued_tokens=0, uncached_tokens=3030) == pytest.approx(
        model.overhead + 3030 / model.rate
    )
    # Six prompts queued: the average rate, overhead included, not the line's slope alone.
    queued = 6 * 3030
    line = model.overhead + queued / model.rate
    origin = queued * (model.overhead + model.seen / model.rate) / model.seen
    assert rates.predict(A.url, queued_tokens=queued, uncached_tokens=0) == pytest.approx(origin)
    assert origin > 1.9 * line


@pytest.mark.parametrize(
    "samples",
    [
        pytest.param([(1000, 0.1), (1000, 0.3), (1010, 0.2)], id="work-nearly-constant"),
        pytest.param([(1000, 0.3), (2000, 0.2), (3000, 0.1)], id="slope-not-positive"),
        pytest.param([(1000, 0.05), (2000, 0.3), (3000, 0.55)], id="negative-overhead"),
    ],
)
def test_an_unusable_fit_falls_back_to_the_average_rate_without_overhead(
    samples: list[tuple[int, float]],
) -> None:
    rates = PrefillRates(smoothing=0.5)
    for tokens, seconds in samples:
        rates.observe(A.url, tokens=tokens, seconds=seconds)
    assert rates.overhead(A.url) == 0.0
    assert rates.rate(A.url) > 0


def test_predicted_ttft_adds_the_overhead() -> None:
    assert predict_ttft(queued_tokens=0, uncached_tokens=1000, tokens_per_second=10_000, overhead_s=0.02) == (
        pytest.approx(0.12)
    )


def test_an_unobserved_endpoint_gets_the_mean_of_the_observed_ones() -> None:
    rates = PrefillRates()
    rates.observe(A.url, tokens=1000, seconds=0.1)
    rates.observe(B.url, tokens=1000, seconds=0.05)
    assert rates.rate("http://new:8000") == pytest.approx(15_000)
    assert not rates.known([A.url, "http://new:8000"])
    rates.forget([B.url])
    assert rates.rate(A.url) == pytest.approx(20_000)


@pytest.mark.parametrize(("tokens", "seconds"), [(0, 1.0), (100, 0.0), (100, -1.0)])
def test_observations_without_work_or_time_are_ignored(tokens: float, seconds: float) -> None:
    rates = PrefillRates(prior_tokens_per_second=5000)
    assert not rates.observe(A.url, tokens=tokens, seconds=seconds)
    assert rates.rate(A.url) == 5000


def test_rates_refuse_bad_settings() -> None:
    with pytest.raises(ValueError, match="prior"):
        PrefillRates(prior_tokens_per_second=0)
    with pytest.raises(ValueError, match="smoothing"):
        PrefillRates(smoothing=1.5)


def ticket(value: object) -> Ticket:
    assert isinstance(value, Ticket)
    return value


def test_the_state_queues_uncached_work_until_the_first_token_and_learns_from_it() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock, rates=PrefillRates(prior_tokens_per_second=10_000))
    first = ticket(state.started(A, request(PROMPT, request_id="r1")))
    assert (first.matched_tokens, first.uncached_tokens, first.queued_before) == (0, 1030, 0)
    assert first.predicted_ttft_s == pytest.approx(0.103)
    assert state.queued_tokens(A.url) == 1030
    second = ticket(state.started(A, request(PROMPT, request_id="r2")))  # same prompt: its blocks are routed
    assert (second.matched_tokens, second.uncached_tokens, second.queued_before) == (1024, 6, 1030)
    assert second.predicted_ttft_s == pytest.approx(0.1036)
    clock.advance(0.2)
    state.answered(first, status=200, streamed=True)
    assert state.queued_tokens(A.url) == 6
    assert state.rates.rate(A.url) == pytest.approx(1030 / 0.2)
    state.answered(first, status=200, streamed=True)  # a second answer changes nothing
    state.finished(first)
    state.finished(second)  # failed before its first token: its work leaves the queue too
    assert state.queued_tokens(A.url) == 0
    assert state.rates.observations(A.url) == 1


def test_only_first_tokens_teach_the_rate() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock)
    buffered = state.started(A, request(PROMPT, request_id="whole-answer"))
    rejected = state.started(B, request(PROMPT, request_id="rejected"))
    clock.advance(1.0)
    state.answered(buffered, status=200, streamed=False)  # a whole non-streamed answer is not a TTFT
    state.answered(rejected, status=400, streamed=False)
    assert state.rates.observations(A.url) == state.rates.observations(B.url) == 0


def test_a_prefill_answer_is_a_first_token_and_a_prefilled_request_decodes_by_load() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock)
    prefill = Endpoint("prefill", "http://10.0.1.1:8000")
    view = request(PROMPT, request_id="pd")
    assert state.profile_for("decode", view) == "prompt"
    attempt = state.started(prefill, view)
    clock.advance(0.05)
    state.answered(attempt, status=200, streamed=False)
    assert state.rates.rate(prefill.url) == pytest.approx(1030 / 0.05)
    view.kv_loaded = True  # what the P/D stage records on the request after a good prefill
    assert state.profile_for("decode", view) == "kv-loaded"
    decode = ticket(state.started(A, view))
    assert (decode.kv_loaded, decode.uncached_tokens) == (True, 0)


def test_the_gateways_own_loop_lag_is_not_learned_as_engine_time() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock)
    attempt = state.started(A, request(PROMPT, request_id="busy"))
    clock.advance(0.2)  # 0.15 s of it the gateway's event loop was running late
    state.answered(attempt, status=200, streamed=True, lag_s=0.15)
    assert state.rates.rate(A.url) == pytest.approx(1030 / 0.05)


def test_admission_gets_a_prediction_only_once_every_candidate_was_observed() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock)
    snaps = [snapshot(A, engine=stats()), snapshot(B, engine=stats())]
    view = request(PROMPT, request_id="new")
    assert state.predicted_ttft(view, snaps) is None
    assert state.predicted_ttft(view, []) is None
    for endpoint, seconds in ((A, 0.1), (B, 0.2)):
        attempt = state.started(endpoint, request(PROMPT, request_id=f"warm-{endpoint.url}"))
        clock.advance(seconds)
        state.answered(attempt, status=200, streamed=True)
    # A learned 10,300 tokens/s and caches the prompt (6 uncached tokens); B learned 5,150/s.
    assert state.predicted_ttft(view, snaps) == pytest.approx(6 / 10_300)


def test_the_requests_slo_reaches_the_cycle() -> None:
    state = SchedulingState(clock=FakeClock())
    cycle, _ = state.candidates("decode", request(PROMPT, slo_ttft_s=0.3), [snapshot(A)], profile="prompt")
    assert cycle.slo_ttft_s == 0.3


class EventsIndex:
    """A precise source stand-in: the blocks the engines reported (none until the test says so)."""

    def __init__(self) -> None:
        self.cached: dict[str, int] = {}

    def match(self, endpoints: Iterable[str], prompt: KeyedPrompt) -> dict[str, int]:
        return {url: self.cached.get(url, 0) for url in endpoints}


def matched(state: SchedulingState) -> list[int]:
    """What the scheduler would see cached on A and B for PROMPT."""
    _, candidates = state.candidates("decode", request(PROMPT), [snapshot(A), snapshot(B)], profile="prompt")
    return [c.matched_tokens for c in candidates]


def test_with_the_precise_source_in_flight_prompts_count_until_their_first_token() -> None:
    events = EventsIndex()
    state = SchedulingState(clock=FakeClock(), prefix=events, pending_ttl_s=0)
    first = state.started(A, request(PROMPT, request_id="first"))
    assert matched(state) == [1024, 0]  # the engine has not reported the blocks yet
    state.answered(first, status=200, streamed=True)
    assert matched(state) == [0, 0]
    events.cached[A.url] = 512  # now the events say what the engine holds
    assert matched(state) == [512, 0]


def test_with_the_precise_source_answered_prompts_count_for_the_ttl_while_events_lag() -> None:
    clock, events = FakeClock(), EventsIndex()
    state = SchedulingState(clock=clock, prefix=events, pending_ttl_s=2.0)
    first = state.started(A, request(PROMPT, request_id="first"))
    state.answered(first, status=200, streamed=True)
    state.finished(first)
    clock.advance(1.9)
    assert matched(state) == [1024, 0]  # answered 1.9 s ago: its events may still be on their way
    again = state.started(A, request(PROMPT, request_id="again"))  # a repeat refreshes the TTL
    state.answered(again, status=200, streamed=True)
    clock.advance(1.9)
    assert matched(state) == [1024, 0]
    clock.advance(0.2)
    assert matched(state) == [0, 0]  # past the TTL only the engine's own events count
    events.cached[A.url] = 256
    assert matched(state) == [256, 0]


def test_a_failed_attempt_leaves_nothing_behind_and_a_departed_endpoint_is_forgotten() -> None:
    clock, events = FakeClock(), EventsIndex()
    state = SchedulingState(clock=clock, prefix=events, pending_ttl_s=2.0)
    failed = state.started(A, request(PROMPT, request_id="failed"))
    state.finished(failed)  # no answer: the engine computed nothing
    assert matched(state) == [0, 0]
    kept = state.started(B, request(PROMPT, request_id="kept"))
    state.answered(kept, status=200, streamed=True)
    assert matched(state) == [0, 1024]
    state.forget([A.url])
    assert matched(state) == [0, 0]


def test_nothing_is_kept_per_request_id_so_a_reused_id_is_a_new_request() -> None:
    clock = FakeClock()
    state = SchedulingState(clock=clock)
    prefill = Endpoint("prefill", "http://10.0.1.1:8000")
    first = request(PROMPT, request_id="same")
    attempt = state.started(prefill, first)
    state.answered(attempt, status=200, streamed=False)
    first.kv_loaded = True
    second = request(PROMPT[:100], request_id="same")  # a client reusing the id for another prompt
    assert state.profile_for("decode", second) == "prompt"
    decode = ticket(state.started(A, second))
    assert (decode.kv_loaded, decode.prompt_tokens, decode.uncached_tokens) == (False, 100, 100)


def test_an_error_answer_does_not_count_as_cached() -> None:
    state = SchedulingState(clock=FakeClock(), prefix=EventsIndex(), pending_ttl_s=2.0)
    refused = state.started(A, request(PROMPT, request_id="refused"))
    state.answered(refused, status=400, streamed=False)
    assert matched(state) == [0, 0]


def test_throughput_is_mean_work_over_mean_time_overhead_included() -> None:
    rates = PrefillRates(smoothing=0.5)
    assert rates.throughput("http://e") is None
    rates.observe("http://e", tokens=1000, seconds=0.12)
    rates.observe("http://e", tokens=3000, seconds=0.32)
    assert rates.throughput("http://e") == pytest.approx(2000 / 0.22)
