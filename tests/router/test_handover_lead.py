"""The handover's lead: a stream gives its slot to the next request earlier by the time that request
takes to reach its decode engine (`tandem.router.pipeline.lead`, `tandem.router.pipeline.meter`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import cast

import pytest

from tandem.router.admission.grant import Grant
from tandem.router.pipeline.lead import MIN_SAMPLES, Handover, HandoverLead
from tandem.router.pipeline.meter import GrantMeter


def learned(samples: Sequence[tuple[float, float | None]], *, window: int = 64) -> HandoverLead:
    lead = HandoverLead(window=window)
    for phase, start in samples:
        lead.record(phase_s=phase, start_s=start)
    return lead


def test_nothing_is_used_before_enough_requests() -> None:
    assert learned([(0.02, 0.05)] * (MIN_SAMPLES - 1)).seconds == 0.0
    assert learned([(0.02, 0.05)] * MIN_SAMPLES).seconds == pytest.approx(0.07)


def test_a_wait_in_the_engine_does_not_lengthen_the_lead() -> None:
    """Requests handed a slot early wait in the engine for the stream before them: their starts are
    long, and counting them would hand over earlier still. The least start is what a request takes
    when its slot is free."""
    lead = learned([(0.02, 0.045)] * MIN_SAMPLES)
    assert lead.seconds == pytest.approx(0.065)
    for _ in range(20):
        lead.record(phase_s=0.02, start_s=0.2)
    assert lead.seconds == pytest.approx(0.065)


def test_the_phase_is_the_median_and_a_request_prefilled_on_its_engine_adds_only_its_phase() -> None:
    decode_only = learned([(0.001, None)] * MIN_SAMPLES)
    assert decode_only.seconds == pytest.approx(0.001)
    # Five disaggregated requests (phase 30 ms, start at least 40 ms) and four decode-only (1 ms):
    # the median of 70, 70, 70, 70, 70, 1, 1, 1, 1 ms.
    mixed = learned([(0.03, 0.04)] * 5 + [(0.001, None)] * 4)
    assert mixed.seconds == pytest.approx(0.07)
    # One slow prefill does not move a median.
    assert learned([(0.03, 0.04)] * 8 + [(2.0, 0.04)]).seconds == pytest.approx(0.07)


def test_the_window_forgets_what_is_older() -> None:
    lead = learned([(0.01, 0.01)] * 8, window=8)
    assert lead.seconds == pytest.approx(0.02)
    for _ in range(8):
        lead.record(phase_s=0.05, start_s=0.05)
    assert lead.seconds == pytest.approx(0.1)


def never() -> float:
    raise AssertionError("the clock is read only while a lead is known")


def test_without_a_lead_a_stream_hands_over_at_its_tokens_and_reads_no_clock() -> None:
    handover = Handover(expected=80, tokens=2)
    assert next(n for n in range(1, 81) if handover.due(n, never)) == 78
    assert not Handover(expected=80, tokens=2, lead=HandoverLead()).due(77, never)


def at(seconds: float) -> Callable[[], float]:
    return lambda: seconds


def first_due(handover: Handover, *, per_token_s: float) -> int:
    """The token at which a stream of `per_token_s` a token hands over."""
    for n in range(1, handover.expected + 1):
        if handover.due(n, at(n * per_token_s)):
            return n
    raise AssertionError("never handed over")


def test_a_lead_hands_over_earlier_by_the_streams_own_time_per_token() -> None:
    """70 ms of lead at 10 ms a token is 7 tokens more: token 71 of 80 instead of 78; at 35 ms a
    token, 2 more."""
    lead = HandoverLead(seconds=0.07)
    assert first_due(Handover(expected=80, tokens=2, lead=lead), per_token_s=0.01) == 71
    assert first_due(Handover(expected=80, tokens=2, lead=lead), per_token_s=0.035) == 76


def test_a_lead_never_frees_more_than_half_a_stream() -> None:
    lead = HandoverLead(seconds=10.0)
    assert first_due(Handover(expected=80, tokens=2, lead=lead), per_token_s=0.01) == 38


class CountingGrant:
    """What the meter needs of a grant: the tokens charged to it."""

    def __init__(self) -> None:
        self.completion_tokens = 0

    def charge_output(self, tokens: int) -> None:
        self.completion_tokens += tokens

    def settle(self, usage: object) -> None:
        pass

    def release(self) -> None:
        pass


def chunk(text: str) -> bytes:
    payload = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@pytest.mark.parametrize(("lead_s", "handed_at"), [(None, 78), (0.0, 78), (0.07, 71)])
def test_the_meter_hands_a_stream_over_by_its_lead(lead_s: float | None, handed_at: int) -> None:
    now = [0.0]
    handed: list[int] = []
    grant = CountingGrant()
    meter = GrantMeter(
        cast(Grant, grant),
        strip_usage=False,
        expected=80,
        handover_tokens=2,
        on_handover=lambda: handed.append(grant.completion_tokens),
        lead=None if lead_s is None else HandoverLead(seconds=lead_s),
        clock=lambda: now[0],
    )
    for n in range(1, 81):
        now[0] = n * 0.01
        meter.stream_chunk(chunk("x"))
    assert handed == [handed_at]
