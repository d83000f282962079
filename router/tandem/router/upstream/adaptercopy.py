"""Adapters loaded onto engines by the gateway itself, through vLLM's runtime API, ahead of the
requests that need them.

**Copies of a hot adapter ahead of its requests** (`AdapterCopier`). With `adapterLoadDir` in the
router config (the directory in which the engines' filesystem resolver finds each adapter by name),
the placement may ask for an adapter to be loaded onto another engine before any request goes there
(`tandem.router.scheduling.adapterplace`). The copier sends that engine `POST /v1/load_lora_adapter
{"lora_name": name, "lora_path": <adapterLoadDir>/<name>, "load_inplace": true}` (vLLM's runtime
API, which the operator turns on; in place, so that an adapter the engine resolved once and has
since evicted from its CPU tier is read again rather than refused as loaded) and tells the placement
when it answers: 2xx, the engine holds the adapter; anything else, or no answer within the timeout,
it does not (a warning), and no copy starts for `COPY_PAUSE_S` (engines without the runtime API are
not asked at every request of a hot adapter). vLLM answers after the load (its `add_lora` runs
between two engine steps).

**Declared adapters loaded ahead of their first requests** (`AdapterWarmer`). With a copier and
engines whose CPU tier (`maxCpuLoras`) has room beyond their GPU slots for every declared adapter,
each gateway process loads each adapter onto one engine (`tandem.router.scheduling.adapterwarm`: the
first engine of its rendezvous order with room), one load per engine at a time and only while that
engine has nothing in flight, not in place (an engine that has it answers vLLM's 400 "has already
been loaded" without a read, which counts as held). The placement then finds each adapter held,
and its first request reads nothing from disk. When they do not all fit, adapters load on first use.

**A disaggregated request's decode engine reads its adapter while the prefill runs**
(`tandem.router.pd.prefetch`): the copier's in-place load, started with the prefill, counted in
`prefetches`.

`post_json` is the one call to the engines' runtime LoRA routes, shared with the names' janitor
(`tandem.router.upstream.adapters`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

import orjson

from tandem.router.errors import UpstreamError
from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.scheduling.adapterwarm import warm_plan
from tandem.router.types import Endpoint
from tandem.router.upstream.client import HTTPUpstream, UpstreamCall

log = logging.getLogger(__name__)

LOAD_PATH = "/v1/load_lora_adapter"
#: Seconds without copies after one failed (`AdapterCopier.start`).
COPY_PAUSE_S = 30.0
#: vLLM's words for a load of an adapter it has (`OpenAIServingModels._check_load_lora_adapter_request`).
ALREADY_LOADED = "has already been loaded"
#: Seconds between the warmer's looks at the engines while it has adapters to load.
WARM_INTERVAL_S = 0.05


async def post_json(
    upstream: HTTPUpstream, endpoint: Endpoint, path: str, payload: Mapping[str, object], *, timeout_s: float
) -> tuple[int, str]:
    """POST `payload` to one of an engine's runtime routes (vLLM's LoRA load and unload): its status
    and the first 200 characters of its answer; status 0 and why when no answer came (an
    `UpstreamError`, or nothing within `timeout_s`)."""
    call = UpstreamCall(path=path, body=orjson.dumps(payload), headers={}, stream=False,
                        read_timeout_s=timeout_s)  # fmt: skip
    try:
        reply = await asyncio.wait_for(upstream.open(endpoint, call), timeout_s)
    except UpstreamError as exc:
        return 0, exc.message
    except TimeoutError:
        return 0, f"no answer within {timeout_s:g} s"
    why = reply.head[:200].decode("utf-8", "replace")
    reply.close()
    return reply.status, why


class AdapterCopier:
    """Loads adapters onto engines ahead of their requests (module docstring); `done(url, adapter,
    ok)` hears how each copy ended (`AdapterLoads.copy_done`). `copies` counts them by outcome
    (`loaded`, `failed`) for the metrics."""

    def __init__(
        self,
        upstream: HTTPUpstream,
        *,
        directory: str,
        timeout_s: float,
        done: Callable[[str, str, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._upstream = upstream
        self._directory = directory.rstrip("/")  # "/" → "": the path is then "/<name>"
        self._timeout_s = timeout_s
        self.done = done
        self._tasks: set[asyncio.Task[bool]] = set()
        self.copies = {"loaded": 0, "failed": 0}
        #: Loads ahead of first requests (`AdapterWarmer`), by outcome.
        self.warm_loads = {"loaded": 0, "failed": 0}
        #: Decode engines' loads started with a disaggregated request's prefill, by outcome.
        self.prefetches = {"loaded": 0, "failed": 0}
        self._clock = clock
        self._pause_until = -math.inf

    def path(self, adapter: str) -> str:
        """The adapter's directory on the engines.

        >>> AdapterCopier(None, directory="/adapters/", timeout_s=1).path("sql")  # type: ignore[arg-type]
        '/adapters/sql'"""
        return f"{self._directory}/{adapter}"

    def start(self, url: str, adapter: str, *, inplace: bool = True) -> bool:
        """Load `adapter` onto the engine at `url` in the background (`begin`); whether it started."""
        return self.begin(url, adapter, inplace=inplace) is not None

    def begin(
        self, url: str, adapter: str, *, inplace: bool = True, prefetch: bool = False
    ) -> asyncio.Task[bool] | None:
        """Load `adapter` onto the engine at `url` in the background: the task of its `copy`; None
        (nothing started) for `COPY_PAUSE_S` after a copy failed, so engines without the runtime API
        are not asked for every request of a hot adapter. `inplace`, `prefetch`: see `copy`."""
        if self._clock() < self._pause_until:
            return None
        copy = self.copy(url, adapter, inplace=inplace, prefetch=prefetch)
        task = asyncio.create_task(copy, name="tandem-adapter-copy")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def copy(self, url: str, adapter: str, *, inplace: bool = True, prefetch: bool = False) -> bool:
        """One copy: whether the engine holds `adapter` now; `done` hears it either way. `inplace`
        (a hot adapter's copy): read it again even if the engine loaded it once; False (a load ahead
        of the first request, `AdapterWarmer`): an engine that has it already answers vLLM's 400
        "has already been loaded" without a read, which counts as held (another worker or replica
        loaded it). `prefetch`: a disaggregated request's decode engine, read while its prefill runs
        (`tandem.router.pd.prefetch`; in place), counted in `prefetches`."""
        endpoint = Endpoint("decode", url)
        payload = {"lora_name": adapter, "lora_path": self.path(adapter), "load_inplace": inplace}
        status, why = await post_json(self._upstream, endpoint, LOAD_PATH, payload, timeout_s=self._timeout_s)
        ok = 200 <= status < 300 or (not inplace and status == 400 and ALREADY_LOADED in why)
        counts = self.prefetches if prefetch else self.copies if inplace else self.warm_loads
        counts["loaded" if ok else "failed"] += 1
        fields = {"endpoint": endpoint.name, "adapter": adapter}
        if ok:
            what = (
                "adapter loaded on the decode engine while the prefill runs"
                if prefetch
                else "adapter copied ahead of its requests"
                if inplace
                else "adapter loaded ahead of its first request"
            )
            log.info(what, extra=fields)
        else:
            self._pause_until = self._clock() + COPY_PAUSE_S
            log.warning("adapter copy failed; no copies for a while, requests load adapters themselves",
                        extra=fields | {"status": status, "why": why, "pause_s": COPY_PAUSE_S})  # fmt: skip
        if self.done is not None:
            self.done(url, adapter, ok)
        return ok

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class AdapterWarmer:
    """Loads the declared adapters onto the engines ahead of their first requests when the engines'
    CPU tiers hold them all (`tandem.router.scheduling.adapterwarm`: the plan). One load per engine
    at a time, only while the engine has nothing in flight from this gateway and no load running
    (a load stalls the engine's step), by the copier with `inplace=False`; each one done is in the
    placement's record (`AdapterLoads.copy_done`). A load is tried once per engine and adapter (one
    that failed or was refused loads on its first request; the copier pauses after a failure,
    `COPY_PAUSE_S`). `kick` plans again when engines or names change; a round ends when its plan
    has nothing left to start.

    `pools()`: each pool's engines as (URL, requests in flight); every pool gets its own plan (P/D:
    each adapter on one prefill and one decode engine, since a request needs it on both); `names`:
    the declared adapters in order (a live sequence follows the names file); `capacity`: the
    engines' CPU tier, `room`: how many of it warming may fill (`warm_room`).

    **Ready once loaded** (`warming`, read by `GET /health`): from the warmer's start until its first
    round over known engines has nothing left to start, or `ready_after_s` has passed (0: never),
    the gateway reports itself not ready, as vLLM is not ready before its `--lora-modules` are
    loaded: its first requests then meet engines that hold their adapters, not engines busy reading
    them. Rounds after the first (an engine added or restarted, names added) run while it serves.
    A load's end starts the engine's next one at once (not at the next look), so a gateway in
    front of engines that hold every adapter already (answers "already loaded", no read) is ready
    within a round trip per adapter."""

    def __init__(
        self,
        loads: AdapterLoads,
        copier: AdapterCopier,
        *,
        pools: Callable[[], Sequence[Sequence[tuple[str, int]]]],
        names: Callable[[], Sequence[str]],
        capacity: int,
        room: int,
        interval_s: float = WARM_INTERVAL_S,
        ready_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loads = loads
        self._copier = copier
        self._pools = pools
        self._names = names
        self._capacity = capacity
        self.room = room
        self._interval_s = interval_s
        self._tried: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self._stale = False
        self._clock = clock
        self._until = clock() + ready_after_s
        #: The first round over known engines is over (or there is nothing to wait for).
        self._ready = room < 1 or ready_after_s <= 0
        self._began: float | None = None
        self._wake = asyncio.Event()

    def warming(self) -> str | None:
        """Why the gateway is not ready yet (class docstring), or None."""
        if self._ready:
            return None
        if self._clock() >= self._until:
            self._ready = True
            log.warning(
                "declared adapters still loading ahead of their first requests: ready anyway, "
                "loading on while serving", extra={"left": sum(map(len, self.todo().values()))},
            )  # fmt: skip
            return None
        return "loading the declared adapters onto the engines ahead of their first requests"

    def kick(self, *_: object) -> None:
        """Plan again (engines joined or left, names were added), in the running round or a new one."""
        if self.room < 1:
            return
        self._stale = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="tandem-adapter-warmer")

    def todo(self) -> dict[str, list[str]]:
        """What is left to load: the plan less what was tried (pure over the current state)."""
        names = list(self._names())
        left: dict[str, list[str]] = {}
        for pool in self._pools():
            urls = [url for url, _ in pool]
            held = {url: self._loads.residency.adapters(url) for url in urls}
            for url, adapters in warm_plan(names, urls, held, room=self.room).items():
                todo = [a for a in adapters if (url, a) not in self._tried]
                if todo:
                    left[url] = todo
        return left

    def step(self, left: dict[str, list[str]]) -> int:
        """Start the next load of `left` (a `todo`, consumed) on every idle engine; how many started.
        An adapter that came to be held meanwhile in the engine's pool (a request loaded it) is
        dropped, and so is an engine that left its pool."""
        started = 0
        pool_of = {url: pool for pool in map(dict, self._pools()) for url in pool}
        for url in list(left):
            adapters, pool = left[url], pool_of.get(url, {})
            while adapters and any(self._loads.residency.holds(u, adapters[0]) for u in pool):
                adapters.pop(0)
            if not pool or not adapters:
                del left[url]
                continue
            adapter = adapters[0]
            if pool[url] or self._loads.in_flight(url) or adapter in self._loads.copying:
                continue
            adapters.pop(0)
            self._tried.add((url, adapter))
            if self._loads.copy(url, adapter, capacity=self._capacity, start=self._start):
                started += 1
        return started

    def restarted(self, url: str) -> None:
        """The engine at `url` restarted and holds nothing: its adapters may be loaded again."""
        self._tried = {(u, a) for u, a in self._tried if u != url}
        self.kick()

    def _start(self, url: str, adapter: str) -> bool:
        task = self._copier.begin(url, adapter, inplace=False)
        if task is None:
            return False
        task.add_done_callback(lambda _: self._wake.set())  # the engine's next load: at once
        return True

    async def _run(self) -> None:
        """Plans when kicked (not at every look: a plan hashes every adapter against every engine)
        and starts loads until the plan is done; looks again every `interval_s` or when a load
        ends."""
        left: dict[str, list[str]] = {}
        engines = False
        try:
            while True:
                if self._stale:
                    self._stale = False
                    left = self.todo()
                    engines = any(self._pools())
                    if self._began is None and engines:
                        self._began = self._clock()
                if not left:
                    if engines and not self._ready:
                        self._ready = True
                        took = self._clock() - (self._began or self._clock())
                        log.info(
                            "declared adapters loaded ahead of their first requests: ready",
                            extra={"loaded": self._copier.warm_loads["loaded"], "seconds": round(took, 3)},
                        )  # fmt: skip
                    return
                self._wake.clear()  # before the loads start: one that ends at once still wakes us
                self.step(left)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._interval_s)
        except Exception:  # a bug here must not end the gateway; requests load adapters themselves
            self._ready = True  # nor keep it unready until the bound
            log.exception("adapter warming stopped")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
