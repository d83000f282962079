"""Endpoint state from the engines' `/metrics`: the parser as a table, the registry's staleness and
scrape-based rotation as fake-clock stories, and the collector over `httpx.MockTransport`.

Faked: the engines (a MockTransport handler answering per URL, scriptable per test) and the clock.
Real: the parser (checked against prometheus_client's on random pages), the registry, the collector's
round and its outcome rules.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.router.harness import FakeClock
from tests.router.raw_engine import Answer as RawAnswer
from tests.router.raw_engine import raw_engine, response
from tests.router.servers import closed_port_url

from tandem.router.discovery.collector import MetricsCollector, httpx_fetch
from tandem.router.discovery.enginestats import NotEngineMetrics, parse_engine_metrics
from tandem.router.discovery.registry import EndpointRegistry
from tandem.router.settings import CollectorSettings
from tandem.router.types import POOLS, EngineStats
from tandem.router.upstream.client import metrics_fetch
from tandem.router.upstream.wire import Wire

URL_A, URL_B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"

SIM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting{engine="0",model_name="qwen"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.25
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 96.0
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="256"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1200.0
vllm:prompt_tokens_created{engine="0",model_name="qwen"} 1.7e9
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 340.0
"""
TWO_ENGINES = """vllm:num_requests_running{engine="0"} 3
vllm:num_requests_running{engine="1"} 2
vllm:num_requests_waiting{engine="0"} 1
vllm:num_requests_waiting{engine="1"} 0
vllm:gpu_cache_usage_perc{engine="0"} 0.2
vllm:gpu_cache_usage_perc{engine="1"} 0.6
vllm:cache_config_info{block_size="32",num_gpu_blocks="100",engine="0"} 1
vllm:cache_config_info{block_size="32",num_gpu_blocks="100",engine="1"} 1
"""

#: What tells whether an engine is new, restarted, or pre-empting: finished requests (every reason
#: and engine summed), the counters' creation time (the earliest), pre-emptions (summed).
SERVED_PAGE = """# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop"} 10
vllm:request_success_total{engine="0",finished_reason="length"} 3
vllm:request_success_total{engine="1",finished_reason="abort"} 1
vllm:request_success_created{engine="0",finished_reason="stop"} 1795900000.5
vllm:request_success_created{engine="1",finished_reason="abort"} 1795900001.0
vllm:num_preemptions_total{engine="0"} 2
vllm:num_preemptions_total{engine="1"} 1
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            SIM_PAGE,
            EngineStats(
                running=3, waiting=1, kv_usage=0.25, block_size=16, num_gpu_blocks=256, tokens=1540.0
            ),
            id="sim",
        ),
        pytest.param(
            TWO_ENGINES,
            EngineStats(running=5, waiting=1, kv_usage=0.4, block_size=32, num_gpu_blocks=200),
            id="data-parallel-older-kv-name",
        ),
        pytest.param(
            TWO_ENGINES + SERVED_PAGE,
            EngineStats(
                running=5,
                waiting=1,
                kv_usage=0.4,
                block_size=32,
                num_gpu_blocks=200,
                served=14.0,
                started=1795900000.5,
                preemptions=3.0,
            ),
            id="served-started-preempted",
        ),
        pytest.param(
            "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n",
            EngineStats(running=0, waiting=0, kv_usage=None, block_size=None, num_gpu_blocks=None),
            id="gauges-only",
        ),
    ],
)
def test_engine_metrics_are_read_from_vllm_names(text: str, expected: EngineStats) -> None:
    assert parse_engine_metrics(text) == expected


@pytest.mark.parametrize(
    "text", ["", "<html>not found</html>", "other_metric 1\n", "vllm:num_requests_running {{{"], ids=str
)
def test_text_without_the_engine_gauges_is_not_engine_metrics(text: str) -> None:
    with pytest.raises(NotEngineMetrics):
        parse_engine_metrics(text)


def reference_stats(text: str) -> EngineStats:
    """The same numbers through `prometheus_client`'s own text parser (what the parser replaced)."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    wanted = [line for line in text.splitlines() if line.startswith("vllm:")]
    for family in text_string_to_metric_families("\n".join(wanted)):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    usage = samples.get("vllm:kv_cache_usage_perc") or samples.get("vllm:gpu_cache_usage_perc") or []
    config = samples.get("vllm:cache_config_info", [])
    blocks = sum(int(labels.get("num_gpu_blocks", 0)) for labels, _ in config)
    tokens = [
        v
        for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
        for _, v in samples.get(name, [])
    ]
    return EngineStats(
        running=round(sum(v for _, v in samples["vllm:num_requests_running"])),
        waiting=round(sum(v for _, v in samples["vllm:num_requests_waiting"])),
        kv_usage=sum(v for _, v in usage) / len(usage) if usage else None,
        block_size=int(config[0][0]["block_size"]) if config else None,
        num_gpu_blocks=blocks or None,
        tokens=sum(tokens) if tokens else None,
    )


def random_page(rng: random.Random) -> str:
    """A page in the text format with what real pages hold around the wanted samples: HELP and TYPE
    lines, histograms, names that start like wanted ones, label values with escapes, commas and
    braces, a trailing comma, timestamps, NaN and infinities (in other metrics), several engines, blank
    lines, CRLF."""

    def value(*, finite: bool = True) -> str:
        odd = [] if finite else ["NaN", "+Inf", "-Inf"]
        return rng.choice(["0", "3", "1.0", "0.25", "1.7e+09", "2e-3", str(rng.randint(0, 500)), *odd])

    def label_value() -> str:
        return "".join(
            rng.choice(["a", "0", ",", "}", "{", "=", " ", "\\\\", '\\"', "\\n", "é"])
            for _ in range(rng.randint(0, 6))
        )

    def labels(extra: dict[str, str]) -> str:
        pairs = [f'{k}="{v}"' for k, v in extra.items()]
        pairs += [f'model_name="{label_value()}"'] * rng.randint(0, 1)
        rng.shuffle(pairs)
        if not pairs:
            return ""
        return "{" + ",".join(pairs) + ("," if rng.random() < 0.2 else "") + "}"

    lines: list[str] = []
    for engine in range(rng.randint(1, 3)):
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):  # fmt: skip
            if rng.random() < 0.3:
                lines.append(f"# HELP {name} Its help, with {{braces}} and \\ escapes.")
                lines.append(f"# TYPE {name} gauge")
            stamp = f" {rng.randint(0, 2**40)}" if rng.random() < 0.2 else ""
            lines.append(f"{name}{labels({'engine': str(engine)})} {value()}{stamp}")
            if rng.random() < 0.3:
                lines.append(f"{name}_max{labels({})} {value(finite=False)}")
        blocks = {"block_size": "16", "num_gpu_blocks": str(rng.randint(1, 9999)), "engine": str(engine)}
        lines.append(f"vllm:cache_config_info{labels(blocks)} 1.0")
        for bucket in ("0.1", "1.0", "+Inf"):
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{bucket}"}} {rng.randint(0, 9)}')
        lines.append("")
    rng.shuffle(lines)
    return ("\r\n" if rng.random() < 0.2 else "\n").join(lines) + "\n"


def test_the_parser_reads_what_prometheus_clients_parser_reads_on_random_pages() -> None:
    rng = random.Random(7)
    for _ in range(400):
        page = random_page(rng)
        expected = reference_stats(page.replace("\r\n", "\n"))
        got = parse_engine_metrics(page)
        assert got.running == expected.running and got.waiting == expected.waiting, page
        assert (got.kv_usage, got.tokens) == pytest.approx((expected.kv_usage, expected.tokens)), page
        assert (got.block_size, got.num_gpu_blocks) == (expected.block_size, expected.num_gpu_blocks), page


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{engine="0"} three',
        'vllm:num_requests_running{engine="0} 1',
        "vllm:num_requests_running{engine=0} 1",
        'vllm:num_requests_running{engine="0"}',
        'vllm:num_requests_running{engine="0"} 1 soon',
    ],
)
def test_a_malformed_sample_of_a_wanted_metric_makes_the_page_unusable(line: str) -> None:
    page = f"{line}\nvllm:num_requests_waiting 0\n"
    with pytest.raises(ValueError):  # the reference parser refuses it too
        reference_stats(page)
    with pytest.raises(NotEngineMetrics, match="unparsable metrics text"):
        parse_engine_metrics(page)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
@pytest.mark.parametrize(
    "name", ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total"]
)
def test_a_wanted_sample_that_is_not_a_finite_number_makes_the_page_unusable(name: str, value: str) -> None:
    page = f"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n{name} {value}\n"
    with pytest.raises(NotEngineMetrics, match=f"{name} is {re.escape(value)}, not a finite number"):
        parse_engine_metrics(page)


STATS = EngineStats(running=1, waiting=0, kv_usage=0.5, block_size=16, num_gpu_blocks=256)


def registry(clock: FakeClock) -> EndpointRegistry:
    reg = EndpointRegistry(
        failure_threshold=3, cooldown_seconds=10, clock=clock, stale_after=2, unreachable_after=3
    )
    reg.set_pool("decode", [URL_A, URL_B])
    reg.set_pool("prefill", [URL_A])
    return reg


def test_snapshots_carry_the_last_good_scrape_with_its_age_until_it_is_stale() -> None:
    clock = FakeClock()
    reg = registry(clock)
    assert reg.urls() == [URL_A, URL_B]  # A is in both pools: one engine, scraped once
    assert reg.snapshots("decode")[0].engine is None
    reg.record_scrape(URL_A, STATS)
    clock.advance(1.5)
    reading = reg.snapshots("decode")[0].engine
    assert reading is not None
    assert (reading.stats, reading.age_s(clock()), reading.stale, reading.fresh) == (STATS, 1.5, False, STATS)
    assert reg.snapshots("prefill")[0].engine == reading
    reg.record_scrape_miss(URL_A, unreachable=False)
    reading = reg.snapshots("decode")[0].engine
    assert reading is not None and not reading.stale
    reg.record_scrape_miss(URL_A, unreachable=False)
    reading = reg.snapshots("decode")[0].engine
    assert reading is not None and (reading.stale, reading.fresh) == (True, None)
    reg.record_scrape(URL_A, STATS)
    reading = reg.snapshots("decode")[0].engine
    assert reading is not None and not reading.stale


def in_rotation(reg: EndpointRegistry) -> dict[str, list[str]]:
    return {pool: [s.endpoint.url for s in reg.candidates(pool)] for pool in POOLS}


def test_an_unreachable_engine_leaves_both_pools_after_n_failed_scrapes_and_returns_on_recovery() -> None:
    reg = registry(FakeClock())
    assert not reg.record_scrape_miss(URL_A, unreachable=True)
    assert not reg.record_scrape_miss(URL_A, unreachable=False)  # an answer: the run starts again
    assert not reg.record_scrape_miss(URL_A, unreachable=True)
    assert not reg.record_scrape_miss(URL_A, unreachable=True)
    assert in_rotation(reg) == {"prefill": [URL_A], "decode": [URL_A, URL_B]}
    assert reg.record_scrape_miss(URL_A, unreachable=True)
    assert in_rotation(reg) == {"prefill": [], "decode": [URL_B]}
    reg.record_scrape(URL_A, STATS)
    assert in_rotation(reg) == {"prefill": [URL_A], "decode": [URL_A, URL_B]}


def test_engines_that_leave_discovery_lose_their_readings() -> None:
    reg = registry(FakeClock())
    reg.record_scrape(URL_B, STATS)
    reg.set_pool("decode", [URL_A])
    reg.record_scrape(URL_B, STATS)  # ignored: not a member
    reg.set_pool("decode", [URL_A, URL_B])
    assert reg.snapshots("decode")[1].engine is None


Handler = Callable[[httpx.Request], httpx.Response]


def engines(pages: dict[str, Callable[[], httpx.Response]]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return pages[f"{request.url.scheme}://{request.url.netloc.decode()}"]()

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def time_out() -> httpx.Response:
    raise httpx.ReadTimeout("no answer in time")


def refuse() -> httpx.Response:
    raise httpx.ConnectError("refused")


async def test_a_collector_round_scrapes_every_engine_and_records_the_outcomes() -> None:
    reg = registry(FakeClock())
    seen: list[tuple[str, str]] = []
    members: list[list[str]] = []

    async def follow(urls: object) -> None:
        members.append(list(urls))  # type: ignore[call-overload]

    pages = {URL_A: lambda: httpx.Response(200, text=SIM_PAGE), URL_B: lambda: httpx.Response(404, text="no")}
    async with engines(pages) as client:
        collector = MetricsCollector(
            registry=reg,
            fetch=httpx_fetch(client),
            settings=CollectorSettings(),
            on_scrape=lambda url, outcome: seen.append((url, outcome)),
            on_members=follow,
        )
        assert await collector.scrape_all() == {URL_A: "ok", URL_B: "unusable"}
    assert sorted(seen) == [(URL_A, "ok"), (URL_B, "unusable")]
    assert members == [[URL_A, URL_B]]
    engine_a = reg.snapshots("decode")[0].engine
    assert engine_a is not None and engine_a.stats.block_size == 16


@pytest.mark.parametrize(
    ("page", "outcome"),
    [
        pytest.param(refuse, "unreachable", id="refused"),
        pytest.param(time_out, "slow", id="timeout"),
        pytest.param(lambda: httpx.Response(503), "unreachable", id="5xx"),
        pytest.param(lambda: httpx.Response(200, text="hello"), "unusable", id="not-metrics"),
        pytest.param(lambda: httpx.Response(200, text=SIM_PAGE), "ok", id="metrics"),
    ],
)
async def test_scrape_outcomes(page: Callable[[], httpx.Response], outcome: str) -> None:
    reg = registry(FakeClock())
    async with engines({URL_A: page, URL_B: page}) as client:
        collector = MetricsCollector(registry=reg, fetch=httpx_fetch(client), settings=CollectorSettings())
        assert await collector.scrape(URL_A) == outcome


async def test_a_slow_engine_stays_in_rotation_while_its_numbers_go_stale() -> None:
    reg = registry(FakeClock())
    async with engines({URL_A: time_out, URL_B: time_out}) as client:
        collector = MetricsCollector(registry=reg, fetch=httpx_fetch(client), settings=CollectorSettings())
        for _ in range(5):
            assert await collector.scrape(URL_A) == "slow"
    snapshot = reg.snapshots("decode")[0]
    assert snapshot.in_rotation
    assert snapshot.engine is None or snapshot.engine.fresh is None


async def test_the_background_task_scrapes_every_interval_until_stopped() -> None:
    reg = registry(FakeClock())
    pauses: list[float] = []
    three_rounds = asyncio.Event()

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            three_rounds.set()
            await asyncio.Event().wait()  # until cancelled by stop()

    async with engines({URL_A: refuse, URL_B: refuse}) as client:
        collector = MetricsCollector(
            registry=reg,
            fetch=httpx_fetch(client),
            settings=CollectorSettings(interval_seconds=0.5, learning_interval_seconds=0.5),
            sleep=sleep,
        )
        await collector.start()  # the first round, before it returns
        await asyncio.wait_for(three_rounds.wait(), timeout=10)
        await collector.stop()
    assert all(0 < s <= 0.5 for s in pauses)
    assert in_rotation(reg) == {"prefill": [], "decode": []}  # 3 unreachable rounds: out


async def test_urgent_engines_are_read_between_the_rounds() -> None:
    """A round reads every engine every `interval_seconds`; while `urgent()` names an engine (its
    capacity is being learned) that one alone is read again every `learning_interval_seconds`, in
    pauses of that length so that urgency is noticed within one."""
    reg = registry(FakeClock())
    urgent: list[str] = []
    reads: list[tuple[int, str]] = []  # (pauses before it, engine)
    pauses: list[float] = []
    done = asyncio.Event()

    async def fetch(url: str, timeout_s: float) -> tuple[int, str]:
        reads.append((len(pauses), url))
        return 200, SIM_PAGE

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        urgent[:] = [URL_A] if len(pauses) >= 8 else []
        if len(pauses) == 12:
            done.set()
            await asyncio.Event().wait()

    collector = MetricsCollector(
        registry=reg,
        fetch=fetch,
        settings=CollectorSettings(interval_seconds=1.0, learning_interval_seconds=0.25),
        urgent=lambda: urgent,
        sleep=sleep,
    )
    await collector.start()
    await asyncio.wait_for(done.wait(), timeout=10)
    await collector.stop()
    assert pauses[:8] == pytest.approx([0.25] * 8, abs=0.01)  # less the reads' own time
    a = [n for n, url in reads if url == URL_A]
    b = [n for n, url in reads if url == URL_B]
    assert b == [0, 4, 8], "every engine: at start, then once a second (four quarter pauses)"
    assert a[:3] == [0, 4, 8] and a[3:6] == [9, 10, 11], "the urgent one: every quarter second once urgent"


async def test_a_disabled_collector_starts_nothing() -> None:
    async with engines({}) as client:
        collector = MetricsCollector(
            registry=registry(FakeClock()),
            fetch=httpx_fetch(client),
            settings=CollectorSettings(enabled=False),
        )
        await collector.start()
        assert collector._task is None
        await collector.stop()


# -- over the gateway's own wire (what the gateway uses): real TCP to a raw engine on 127.0.0.1 --


async def test_over_the_wire_every_round_reads_the_page_on_one_kept_alive_connection(wire: Wire) -> None:
    async def page(request: bytes, writer: asyncio.StreamWriter) -> None:
        assert request.startswith(b"GET /metrics HTTP/1.1\r\n")
        writer.write(response(200, SIM_PAGE.encode(), content_type=b"text/plain"))

    async with raw_engine(page) as engine:
        reg = EndpointRegistry(failure_threshold=3, cooldown_seconds=10, clock=FakeClock())
        reg.set_pool("decode", [engine.url])
        collector = MetricsCollector(registry=reg, fetch=metrics_fetch(wire), settings=CollectorSettings())
        assert [await collector.scrape(engine.url) for _ in range(3)] == ["ok"] * 3
    assert engine.connections == 1 and len(engine.requests) == 3
    reading = reg.snapshots("decode")[0].engine
    assert reading is not None and reading.stats.running == 3 and reading.stats.kv_usage == 0.25


async def silent(request: bytes, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(10)


async def unavailable(request: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(response(503, b"busy"))


async def cut(request: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nvllm:num_")
    writer.close()


@pytest.mark.parametrize(
    ("answer", "outcome", "kept"),
    [(silent, "slow", 0), (unavailable, "unreachable", 1), (cut, "unreachable", 0)],
    ids=["silent", "503", "cut-short"],
)
async def test_over_the_wire_the_outcomes_are_those_of_the_table(
    wire: Wire, answer: RawAnswer, outcome: str, kept: int
) -> None:
    async with raw_engine(answer) as engine:
        collector = MetricsCollector(
            registry=registry(FakeClock()),
            fetch=metrics_fetch(wire),
            settings=CollectorSettings(timeout_seconds=0.2),
        )
        assert await collector.scrape(engine.url) == outcome
    assert wire.idle_connections() == kept  # a whole answer's connection is kept; a broken one is not


async def test_over_the_wire_an_engine_nobody_listens_on_is_unreachable(wire: Wire) -> None:
    collector = MetricsCollector(
        registry=registry(FakeClock()), fetch=metrics_fetch(wire), settings=CollectorSettings()
    )
    assert await collector.scrape(closed_port_url()) == "unreachable"
