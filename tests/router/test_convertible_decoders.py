"""Convertible decoders: while the prefill pool is short of capacity a request that would be
disaggregated goes decode-only, and back to P/D once the prefill pool catches up.

The decision is a pure rule (`prefill_busy`) over the router's own TTFT predictions; the story test runs
it in the real router against fake engines on 127.0.0.1 whose speed the router learns: a prefill engine
that answers after 1 s and a decode engine that answers at once.
"""

from __future__ import annotations

import pytest
from tests.router.harness import MODEL, Launcher, metric

from tandem.router.pd.decision import DisaggregationMode, PDDecision, decide, prefill_busy


@pytest.mark.parametrize(
    ("prefill", "decode", "busy"),
    [
        ([0.8, 3.1], 0.35, True),  # the module docstring's example: a burst queued on the prefill pool
        ([0.4], 0.35, False),  # the prefill pool within half the 1 s objective: stay disaggregated
        ([0.6], 0.35, True),  # within the objective but past its prefill share: the decode engine is faster
        ([2.4], 2.6, False),  # the decode engine would be slower still
        ([], 0.35, False),  # no prefill endpoint in rotation: the fallbacks decide
        ([2.4], None, False),  # no decode endpoint chosen
    ],
    ids=["busy", "caught-up", "past-share", "decode-slower", "no-prefill", "no-decode"],
)
def test_the_prefill_pool_is_busy_when_it_misses_the_objective_and_decode_is_faster(
    prefill: list[float], decode: float | None, busy: bool
) -> None:
    assert prefill_busy(slo_ttft_s=1.0, prefill_ttft_s=prefill, decode_ttft_s=lambda: decode) is busy


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_a_busy_prefill_pool_turns_a_disaggregation_into_decode_only(mode: DisaggregationMode) -> None:
    def decided(mode: DisaggregationMode, *, busy: bool) -> PDDecision:
        return decide(
            mode, prefill_members=2, prompt_tokens=4000, available_tokens=0, min_uncached_tokens=64, busy=busy
        )

    assert decided(mode, busy=True).reason == "prefill_busy"
    assert decided(mode, busy=False).disaggregate
    assert decided("off", busy=True).reason == "off"


WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
]


def prompt(seed: int, words: int = 60) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] + str(seed) for i in range(words))


@pytest.mark.parametrize("convertible", [True, False], ids=["convertible", "off"])
async def test_requests_go_decode_only_while_the_prefill_pool_misses_their_objective(
    launcher: Launcher, convertible: bool
) -> None:
    prefill = await launcher.engine("p0", answer_delay=1.0)
    decode = await launcher.engine("d0")
    router = await launcher.router(
        decode=[decode],
        prefill=[prefill],
        mode="auto",
        spec={"disaggregation": {"minUncachedTokens": 64, "convertibleDecoders": convertible}},
    )
    slo = {"x-slo-ttft-ms": "500"}

    async def complete(text: str, objective: dict[str, str] = slo) -> str:
        raw = await router.openai.completions.with_raw_response.create(
            model=MODEL, prompt=text, max_tokens=1, extra_headers=objective
        )
        return raw.headers.get("x-tandem-prefill-endpoint", "")

    # Short and streamed: decode-only, and its first token teaches the router the decode engine's speed.
    stream = await router.openai.completions.create(
        model=MODEL, prompt=prompt(1, words=20), max_tokens=2, stream=True, extra_headers=slo
    )
    _ = [chunk async for chunk in stream]
    assert await complete(prompt(2)) != ""  # long: disaggregated; it learns the prefill engine's 1 s
    third = await complete(prompt(3))  # the prefill pool now predicts ~1 s > 0.5 s
    busy = await metric(
        router, "tandem_router_pd_decisions_total", decision="decode_only", reason="prefill_busy"
    )
    if convertible:
        assert third == "" and busy == 1
    else:
        assert third != "" and busy == 0
    # An objective the prefill pool meets (3 s against its ~1 s): disaggregated again.
    assert await complete(prompt(4), {"x-slo-ttft-ms": "3000"}) != ""


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_a_request_that_pre_empted_a_stream_there_decides_as_auto_would(mode: DisaggregationMode) -> None:
    """The swap (`tandem.router.pd.disagg`): a short prompt goes decode-only into the stopped stream's
    place in any mode; a long one, or one the pool cannot be asked about, is decided as before."""

    def decided(prompt: int, *, available: int | None = 0, swap: bool = True) -> PDDecision:
        return decide(
            mode,
            prefill_members=2,
            prompt_tokens=prompt,
            available_tokens=available,
            min_uncached_tokens=512,
            swap=swap,
        )

    assert decided(286) == PDDecision(False, "preempting")
    assert decided(2000, available=1600) == PDDecision(False, "preempting")  # 400 uncached
    long = PDDecision(True, "always" if mode == "always" else "many_uncached")
    assert decided(2000) == long
    assert decided(286, available=None) == (
        long if mode == "always" else PDDecision(False, "pool_unavailable")
    )
    assert decided(286, swap=False) == (
        PDDecision(True, "always") if mode == "always" else PDDecision(False, "few_uncached")
    )
    assert decide(
        "off", prefill_members=2, prompt_tokens=286, available_tokens=0, min_uncached_tokens=512, swap=True
    ) == PDDecision(False, "off")
