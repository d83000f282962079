"""The load driver against a real HTTP server: bodies and headers sent, records kept, failures
recorded, and every run bounded in time.

Real: aiohttp streaming over loopback to a uvicorn server (tests.servers.run_uvicorn) and the driver's
asyncio scheduling. Faked: the endpoint is `tests.bench.fake_openai` (scripted answers chosen by the
prompt). Assertions are on counts, order and contents, never on how fast anything was.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from tests.bench.fake_openai import PROMPT_TOKENS, FakeState, create_app
from tests.servers import free_port, run_uvicorn

from tandem.bench.driver import DriverSettings, drive, request_body
from tandem.bench.records import RequestRecord, apply_event
from tandem.bench.workloads import BenchRequest, Workload


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeState]]:
    state = FakeState()
    with run_uvicorn(create_app(state)) as url:
        yield url, state


def chat(text: str, *, tenant: str = "default", offset: float = 0.0, tokens: int = 3) -> BenchRequest:
    return BenchRequest(offset, tenant, tokens, messages=({"role": "user", "content": text},))


def settings(url: str, **overrides: object) -> DriverSettings:
    return DriverSettings(base_url=f"{url}/v1", model="qwen", label="t", **overrides)  # type: ignore[arg-type]


def test_request_bodies_stream_with_usage_and_exact_lengths() -> None:
    body = request_body(chat("hi", tokens=7), model="qwen", ignore_eos=True)
    assert body == {
        "model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    plain = request_body(BenchRequest(0, "t", 2, prompt="p"), model="m", ignore_eos=False)
    assert plain == {
        "model": "m",
        "prompt": "p",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize(
    ("event", "tokens", "usage", "error"),
    [
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0, None, None),
        ({"choices": [{"delta": {"content": " hi"}}]}, 1, None, None),
        ({"choices": [{"text": " hi", "index": 0}]}, 1, None, None),
        ({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}, 0, (5, 2), None),
        ({"error": {"message": "bad"}}, 0, None, "error event: bad"),
        (["not", "an", "object"], 0, None, "unexpected event: ['not', 'an', 'object']"),
    ],
)
def test_stream_events_fold_into_the_record(
    event: object, tokens: int, usage: tuple[int, int] | None, error: str | None
) -> None:
    record = RequestRecord(0, "t", None, 2, arrival_s=0.0)
    apply_event(record, event, now=1.5)
    assert record.token_times_s == [1.5] * tokens
    assert (
        None if record.prompt_tokens is None else (record.prompt_tokens, record.completion_tokens)
    ) == usage
    assert record.error == error


async def test_every_request_is_recorded_with_its_tokens_and_tenant_header(
    fake: tuple[str, FakeState],
) -> None:
    url, state = fake
    workload = Workload("w", (chat("a", tenant="x", tokens=4), BenchRequest(0.01, "y", 2, prompt="b")))
    result = await drive(workload, settings(url))
    first, second = result.records
    assert [r.ok for r in result.records] == [True, True]
    assert (first.tenant, first.completion_tokens, len(first.token_times_s), first.prompt_tokens) == (
        "x",
        4,
        4,
        PROMPT_TOKENS,
    )
    assert (second.tenant, second.completion_tokens, len(second.token_times_s)) == ("y", 2, 2)
    for r in result.records:
        assert r.start_s is not None and r.end_s is not None
        assert r.arrival_s <= r.start_s <= r.token_times_s[0] <= r.token_times_s[-1] <= r.end_s
    sent = {body.get("prompt") or body["messages"][0]["content"]: headers for body, headers in state.received}
    assert sent["a"]["x-tenant-id"] == "x" and sent["a"]["x-request-id"] == "bench-t-0"
    assert sent["b"]["x-tenant-id"] == "y" and sent["b"]["x-request-id"] == "bench-t-1"
    assert result.wall_s >= max(r.end_s or 0 for r in result.records)


async def test_arrivals_follow_the_offsets_divided_by_the_time_scale(fake: tuple[str, FakeState]) -> None:
    url, _ = fake
    workload = Workload("w", tuple(chat(str(i), offset=i * 2.0) for i in range(3)))
    result = await drive(workload, settings(url, time_scale=100.0))
    assert [r.arrival_s for r in result.records] == [0.0, 0.02, 0.04]
    assert all(r.start_s is not None and r.start_s >= r.arrival_s for r in result.records)


@pytest.mark.parametrize(
    ("prompt", "status", "error"),
    [
        ("status-500", 500, "HTTP 500: "),
        ("error-event", 200, "error event: engine died"),
        ("no-done", 200, "stream ended without [DONE]"),
        ("broken", 200, "ReadError"),
        ("hang", None, "timeout after 2s"),
    ],
)
async def test_failures_are_recorded_not_raised(
    fake: tuple[str, FakeState], prompt: str, status: int | None, error: str
) -> None:
    url, _ = fake
    # the fine request shares the hang's timeout: long enough that a loaded host still answers it
    timeout = 2.0 if prompt == "hang" else 30.0
    workload = Workload("w", (chat(prompt), chat("fine")))
    result = await drive(workload, settings(url, request_timeout_s=timeout))
    failed, fine = result.records
    assert not failed.ok and failed.status == status and failed.error is not None
    assert failed.error.startswith(error)
    assert failed.end_s is not None
    assert fine.ok


async def test_a_line_longer_than_a_clients_default_limit_is_read_whole(fake: tuple[str, FakeState]) -> None:
    url, _ = fake
    result = await drive(Workload("w", (chat("long-token", tokens=3),)), settings(url))
    (record,) = result.records
    assert record.ok, record.error
    assert len(record.token_times_s) == 3 and record.completion_tokens == 3


async def test_a_refused_connection_is_an_error_record() -> None:
    result = await drive(Workload("w", (chat("a"),)), settings(f"http://127.0.0.1:{free_port()}"))
    (record,) = result.records
    assert not record.ok and record.error is not None and record.error.startswith("ConnectError")


async def test_a_tenant_over_its_concurrency_waits_but_the_run_ends_at_its_deadline(
    fake: tuple[str, FakeState],
) -> None:
    url, state = fake
    hanging = tuple(chat("hang", tenant="heavy") for _ in range(3))
    workload = Workload("w", (*hanging, chat("fine", tenant="light", offset=0.05)))
    limits = settings(url, max_concurrency=1, request_timeout_s=2.0, deadline_slack_s=0.0)
    result = await drive(workload, limits)
    first, second, third, light = result.records
    assert first.error == "timeout after 2s"
    assert third.start_s is None and third.error == "cancelled at the run deadline", "it never got a slot"
    assert second.error in ("timeout after 2s", "cancelled at the run deadline")
    assert light.ok, "the light tenant has its own slots"
    assert len(state.received) <= 3


async def test_progress_lines_name_the_run(fake: tuple[str, FakeState]) -> None:
    url, state = fake
    state.token_delay = 0.05
    lines: list[str] = []
    await drive(
        Workload("w", (chat("a", tokens=6),)), settings(url, progress_every_s=0.05), progress=lines.append
    )
    assert lines and all(line.startswith("[t] ") and "/1 done" in line for line in lines)


async def test_an_empty_workload_finishes_at_once() -> None:
    result = await drive(Workload("w", ()), settings("http://127.0.0.1:9"))
    assert result.records == ()


async def test_each_tenant_has_its_own_bound_and_none_means_unbounded(fake: tuple[str, FakeState]) -> None:
    url, state = fake
    state.token_delay = 0.02
    workload = Workload("w", tuple(chat(f"{t}{i}", tenant=t) for t in ("one", "free") for i in range(4)))
    result = await drive(
        workload, settings(url, max_concurrency=3, tenant_concurrency={"one": 1, "free": None})
    )
    assert all(r.ok for r in result.records)
    one = sorted((r.start_s or 0.0, r.end_s or 0.0) for r in result.records if r.tenant == "one")
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(one)), "one at a time"
    free = [r for r in result.records if r.tenant == "free"]
    assert max(r.start_s or 0.0 for r in free) < min(r.end_s or 0.0 for r in free), "all four at once"
    assert settings(url, max_concurrency=3).bound("anyone") == 3


async def test_a_closed_loop_keeps_its_slots_busy_until_its_end_and_drops_what_it_never_sent(
    fake: tuple[str, FakeState],
) -> None:
    url, state = fake
    state.token_delay = 0.05  # each request lasts at least 3 × 50 ms, so 2 streams send < 100 in 1 s
    heavy = tuple(chat(f"h{i}", tenant="heavy") for i in range(100))
    workload = Workload("w", (*heavy, chat("l", tenant="light", offset=0.1)), closed_loop={"heavy": 1.0})
    result = await drive(workload, settings(url, time_scale=2.0, tenant_concurrency={"heavy": 2}))
    sent = [r for r in result.records if r.tenant == "heavy"]
    assert 1 <= len(sent) < 100 and result.unissued == 100 - len(sent)
    assert len(state.received) == len(sent) + 1, "what was never sent was never sent"
    assert [r.index for r in sent] == sorted(r.index for r in sent), "records stay in workload order"
    for r in sent:
        assert r.ok and r.start_s is not None and r.start_s < 0.5, "1 engine second at time scale 2"
        assert r.arrival_s == r.start_s, "a closed-loop request arrives when it is sent"
    spans = sorted((r.start_s or 0.0, r.end_s or 0.0) for r in sent)
    assert all(sum(s <= t < e for s, e in spans) <= 2 for t, _ in spans), "never more than 2 open"
    (light,) = [r for r in result.records if r.tenant == "light"]
    assert light.ok and light.arrival_s == 0.05, "open-loop tenants keep their offsets"


@pytest.fixture
def fake_pair() -> Iterator[tuple[tuple[str, FakeState], tuple[str, FakeState]]]:
    first, second = FakeState(), FakeState()
    with run_uvicorn(create_app(first)) as one, run_uvicorn(create_app(second)) as two:
        yield (one, first), (two, second)


@pytest.mark.parametrize(
    ("urls", "indices", "expected"),
    [
        ((), [0, 1, 5], ["a", "a", "a"]),
        (("r0", "r1"), [0, 1, 2, 3, 4], ["r0", "r1", "r0", "r1", "r0"]),
        (("r0", "r1", "r2"), [0, 2, 3, 7], ["r0", "r2", "r0", "r1"]),
    ],
)
def test_request_i_goes_to_replica_i_mod_n_and_one_url_is_the_only_one(
    urls: tuple[str, ...], indices: list[int], expected: list[str]
) -> None:
    spread = DriverSettings(base_url="a", model="qwen", base_urls=urls)
    assert [spread.url_for(i) for i in indices] == expected


async def test_several_base_urls_share_the_workload_by_index_so_every_tenant_reaches_every_replica(
    fake_pair: tuple[tuple[str, FakeState], tuple[str, FakeState]],
) -> None:
    (one, first), (two, second) = fake_pair
    tenants = ["heavy", "heavy", "light", "heavy", "light", "light"]
    workload = Workload("w", tuple(chat(f"m{i}", tenant=t) for i, t in enumerate(tenants)))
    result = await drive(workload, settings(one, base_urls=(f"{one}/v1", f"{two}/v1")))
    assert all(r.ok for r in result.records)
    got = [
        sorted((h["x-request-id"], h["x-tenant-id"]) for _, h in state.received) for state in (first, second)
    ]
    assert got == [
        [("bench-t-0", "heavy"), ("bench-t-2", "light"), ("bench-t-4", "light")],
        [("bench-t-1", "heavy"), ("bench-t-3", "heavy"), ("bench-t-5", "light")],
    ]
