"""The scraper's HTTP half: a reading per answer, stamped with when the answer arrived (the rates'
Δt), and None for an answer that is not metrics."""

from __future__ import annotations

import httpx

from tandem.autoscaler.scraper import Scraper

ENGINE = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 9000.0
"""
GATEWAY = """\
# TYPE tandem_router_arrival_prompt_tokens counter
tandem_router_arrival_prompt_tokens_total 84000.0
# TYPE tandem_router_arrivals counter
tandem_router_arrivals_total 28.0
"""


def answer(request: httpx.Request) -> httpx.Response:
    pages = {"engine": ENGINE, "gateway": GATEWAY}
    page = pages.get(request.url.host)
    return httpx.Response(200, text=page) if page else httpx.Response(200, text="{not metrics")


async def test_readings_carry_the_time_their_answer_arrived() -> None:
    times = iter([5.25, 5.5, 6.0])
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        scraper = Scraper(client, clock=lambda: next(times))
        engines = await scraper.scrape(["http://engine"])
        gateways = await scraper.gateways(["http://gateway"])
        broken = await scraper.one("http://broken")
    engine = engines["http://engine"]
    assert engine is not None and (engine.waiting, engine.prompt_tokens, engine.at) == (3.0, 9000.0, 5.25)
    gateway = gateways["http://gateway"]
    assert gateway is not None
    assert (gateway.arrivals, gateway.arrival_tokens, gateway.at) == (28.0, 84000.0, 5.5)
    assert broken is None
