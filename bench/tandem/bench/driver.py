"""Open-loop load generation against an OpenAI endpoint, with one streamed HTTP request per workload item.

Contract of `drive(workload, settings)`:
- **Arrivals.** Request i is released at `offset_s / time_scale` wall seconds after the run starts
  (open loop: arrivals never wait for answers), then waits for a slot of its tenant (at most
  `tenant_concurrency[tenant]` in flight, else `max_concurrency`; None: no bound. Each tenant is its
  own client, so one tenant's backlog never delays another's sends) and is sent.
- **Closed loops.** A tenant in `workload.closed_loop` (tenant → offset in engine seconds) issues
  its requests as its slots free: a request arrives when it is sent (its `arrival_s` is its send
  time, so its queue time is 0), and none is sent at or after the loop's end. Requests it never
  sent are left out of the records and counted in `DriveResult.unissued`.
- **Requests.** `POST {base}/chat/completions` (workload messages) or `/completions` (prompt)
  with `stream: true`, `stream_options.include_usage: true`, `max_tokens` and `ignore_eos: true` (so
  output lengths are exact), the tenant in `tenant_header` and `x-request-id: bench-<label>-<i>`.
  `{base}` is `base_url`, or with several `base_urls` (gateway replicas) `base_urls[i mod N]`, i the
  request's index in the workload: both tenants of a workload reach every replica, as a Kubernetes
  Service spreads a client's connections over the replicas behind it.
- **Records.** One `RequestRecord` per workload item (but closed-loop requests never sent), in
  workload order, whatever happened: wall seconds since the run start for arrival, send, every
  content chunk (the first is the first token) and end; token counts from the final `usage` chunk;
  the HTTP status; an error string or None.
- **Never a hang.** Each request has `request_timeout_s` from send to end; the whole run has a hard
  deadline of the last arrival + `request_timeout_s` + `deadline_slack_s`, after which what is left
  is cancelled and recorded as such (a closed loop's end counts as an arrival here). The count is
  bounded by the workload.

Times are wall seconds here; `tandem.bench.stats.timed` multiplies them by the time scale.

The client is aiohttp (its HTTP parser is C): the load generator shares the host's cores with the
engines and the gateways it measures, and at thousands of streamed events a second httpx's pure-Python
parsing took 2.4× the CPU per event (about 100 against 40 µs), which every target's latency paid for.
A connection error's record reads `ConnectError: ...`, a broken stream `ReadError: ...`, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tandem.bench.records import DriveResult, RequestRecord, apply_event
from tandem.bench.workloads import BenchRequest, Workload

Progress = Callable[[str], None]
_ERROR_BODY_CHARS = 300
#: Longest line of a streamed answer read at once (aiohttp's default limit is 64 KiB).
_LINE_LIMIT = 1 << 22


@dataclass(frozen=True)
class DriverSettings:
    """Where and how to send. `base_url` ends in `/v1`; `base_urls`, when given, are several such URLs
    (replicas of one gateway) that replace it: request i of the workload goes to `base_urls[i mod N]`
    (`url_for`). `time_scale` is engine seconds per wall second (a workload offset of 2 s is released
    after 2 / time_scale wall seconds). `tenant_concurrency` bounds the tenants it names instead of
    `max_concurrency` (None: no bound for that tenant)."""

    base_url: str
    model: str
    label: str = "run"
    max_concurrency: int = 256
    request_timeout_s: float = 300.0
    tenant_header: str = "x-tenant-id"
    ignore_eos: bool = True
    time_scale: float = 1.0
    progress_every_s: float = 5.0
    deadline_slack_s: float = 5.0
    tenant_concurrency: Mapping[str, int | None] = field(default_factory=dict)
    base_urls: tuple[str, ...] = ()
    #: When given, one base URL per request of the workload, in order (several models' own gateways).
    request_urls: tuple[str, ...] = ()

    def url_for(self, index: int) -> str:
        """The base URL of the workload's request `index`: `request_urls[index]`, else `base_url`, or
        `base_urls[index mod N]`.

        Example: two replicas, requests 0..4 → replicas 0, 1, 0, 1, 0, whichever tenant sent them."""
        if self.request_urls:
            return self.request_urls[index]
        urls = self.base_urls or (self.base_url,)
        return urls[index % len(urls)]

    def bound(self, tenant: str) -> int | None:
        """Most requests of `tenant` in flight (None: unbounded)."""
        return self.tenant_concurrency.get(tenant, self.max_concurrency)


def request_body(request: BenchRequest, *, model: str, ignore_eos: bool) -> dict[str, Any]:
    """The JSON body of one streamed request (pure)."""
    body: dict[str, Any] = {"model": model}
    if request.messages is not None:
        body["messages"] = [dict(m) for m in request.messages]
    else:
        body["prompt"] = request.prompt
    body.update(max_tokens=request.max_tokens, stream=True, stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def drive(
    workload: Workload,
    settings: DriverSettings,
    *,
    client: aiohttp.ClientSession | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> DriveResult:
    """Run the workload against `settings.base_url`, or its `base_urls` (the module docstring's contract).

    `client` is used as is when given (the caller owns it); otherwise one is made for loopback
    (no proxies from the environment) and closed at the end.
    """
    owned = client is None
    http = client or aiohttp.ClientSession(
        # Each request's own bound is `request_timeout_s` (`_Run._one`); connecting has its own.
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        trust_env=False,
        read_bufsize=_LINE_LIMIT // 2,  # the reader holds up to twice this: its longest line
    )
    try:
        return await _Run(workload, settings, http=http, clock=clock, progress=progress).run()
    finally:
        if owned:
            await http.close()


class _Run:
    """The state of one `drive` call: the records, the tenant slots and the start time."""

    def __init__(
        self,
        workload: Workload,
        settings: DriverSettings,
        *,
        http: aiohttp.ClientSession,
        clock: Callable[[], float],
        progress: Progress | None,
    ) -> None:
        self.workload = workload
        self.settings = settings
        self.http = http
        self.clock = clock
        self.progress = progress
        self.t0 = clock()
        scale = settings.time_scale
        self.records = [
            RequestRecord(i, r.tenant, r.group, r.max_tokens, arrival_s=r.offset_s / scale)
            for i, r in enumerate(workload.requests)
        ]
        self.slots: dict[str, contextlib.AbstractAsyncContextManager[Any]] = {
            tenant: contextlib.nullcontext()
            if (n := settings.bound(tenant)) is None
            else asyncio.Semaphore(n)
            for tenant in workload.tenants
        }
        # Closed loops' ends in wall seconds since the start.
        self.loop_ends = {tenant: until / scale for tenant, until in workload.closed_loop.items()}

    def now(self) -> float:
        return self.clock() - self.t0

    async def run(self) -> DriveResult:
        pairs = zip(self.workload.requests, self.records, strict=True)
        tasks = [asyncio.ensure_future(self._one(request, record)) for request, record in pairs]
        last_arrival = max([r.arrival_s for r in self.records] + list(self.loop_ends.values()), default=0.0)
        deadline = last_arrival + self.settings.request_timeout_s + self.settings.deadline_slack_s
        reporter = asyncio.ensure_future(self._report()) if self.progress else None
        try:
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - self.now()))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        kept = [r for r in self.records if r.tenant not in self.loop_ends or r.start_s is not None]
        for record in kept:
            if record.end_s is None:
                record.error = record.error or "cancelled at the run deadline"
        ends = [r.end_s for r in kept if r.end_s is not None]
        return DriveResult(tuple(kept), max(ends, default=self.now()), unissued=len(self.records) - len(kept))

    async def _one(self, request: BenchRequest, record: RequestRecord) -> None:
        await asyncio.sleep(max(0.0, record.arrival_s - self.now()))
        async with self.slots[request.tenant]:
            now, loop_end = self.now(), self.loop_ends.get(request.tenant)
            if loop_end is not None:
                if now >= loop_end:
                    return  # the closed loop has ended: never sent, left out of the records
                record.arrival_s = now
            record.start_s = now
            try:
                async with asyncio.timeout(self.settings.request_timeout_s):
                    await self._stream(request, record)
            except TimeoutError:
                record.error = f"timeout after {self.settings.request_timeout_s:g}s"
            except aiohttp.ClientError as exc:
                record.error = f"{_kind(exc)}: {exc}".rstrip(": ")
            except asyncio.CancelledError:
                record.error = record.error or "cancelled at the run deadline"
                raise
            finally:
                record.end_s = self.now()

    async def _stream(self, request: BenchRequest, record: RequestRecord) -> None:
        s = self.settings
        path = "/chat/completions" if request.api == "chat" else "/completions"
        body = request_body(request, model=request.model or s.model, ignore_eos=s.ignore_eos)
        headers = {s.tenant_header: request.tenant, "x-request-id": f"bench-{s.label}-{record.index}"}
        async with self.http.post(
            s.url_for(record.index).rstrip("/") + path, json=body, headers=headers
        ) as resp:
            record.status = resp.status
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", errors="replace")
                record.error = f"HTTP {resp.status}: {text[:_ERROR_BODY_CHARS]}"
                return
            async for line in _lines(resp.content):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    event = json.loads(data)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    record.error = f"invalid JSON event: {data[:100].decode('utf-8', errors='replace')}"
                    return
                apply_event(record, event, now=self.now())
            if record.error is None:
                record.error = "stream ended without [DONE]"

    async def _report(self) -> None:
        assert self.progress is not None
        # A closed loop sends only what its time allows, so its requests are no total to count down.
        of = "" if self.loop_ends else f"/{len(self.records)}"
        while True:
            await asyncio.sleep(self.settings.progress_every_s)
            done = sum(r.end_s is not None for r in self.records)
            running = sum(r.start_s is not None and r.end_s is None for r in self.records)
            errors = sum(r.end_s is not None and not r.ok for r in self.records)
            self.progress(
                f"[{self.settings.label}] {done}{of} done, {running} in flight, {errors} errors, "
                f"{self.now():.0f}s"
            )


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The stream's lines (each with its `\\n`; the last may lack it), however the chunks split them."""
    while True:
        try:
            line = await content.readuntil(b"\n")
        except ValueError as exc:  # a line beyond the reader's high-water mark
            raise aiohttp.ClientPayloadError(f"a streamed line too long: {exc}") from exc
        if not line:
            return
        yield line


def _kind(exc: aiohttp.ClientError) -> str:
    """A client error's kind in the words of the records: `ConnectError` when no connection was made,
    `ReadError` when an answer broke off, else the exception's class name."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "ReadError"
    return type(exc).__name__
