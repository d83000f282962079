"""P/D under a LoRA adapter: the decode engine reads the adapter while the prefill runs.

A disaggregated request needs its adapter on two engines, the prefill engine's and the decode
engine's. Sent as it is, the decode request reaches its engine only after the prefill, and when that
engine does not hold the adapter its first step waits for a disk read there too (about 70 ms for a
rank-8 adapter in the simulator's time model): two reads one after the other on the request's way to
its first token. The decode engine is chosen before the prefill (`pipeline.stages.Pick`), so when the
placement marked that choice as a load (`adapterplace.AdapterPlacement.picked`), the gateway starts
the read itself as the prefill starts: `POST /v1/load_lora_adapter` in place on the decode engine
(`upstream.adaptercopy.AdapterCopier`, as for a hot adapter's copy), and the request is no longer the
one that loads it (`adapterload.AdapterLoads.take_load`). The P/D step then waits for the prefill, the
KV barrier and the read, whichever ends last, before the decode request goes out
(`Disaggregator.run`), so the request arrives at an engine that holds its adapter. vLLM answers the
load once its engine core has run `add_lora` (between two steps), so the decode request never meets a
name that is half registered (without the filesystem resolver such a request would be refused).

Example: prefill 60 ms, read 70 ms. Before: 60 ms, then the decode engine's step waits 70 ms for the
read. Now: both start together, the decode request goes out at 70 ms, and its first step reads
nothing. The read stalls the decode engine's other requests as long as it would have (it counts as a
load in flight there, which the scheduler prices), only earlier.

Only with a copier (`adapterLoadDir`, the runtime API) and only for requests that are disaggregated;
decode-only requests load their adapter themselves, as nothing runs before them to overlap with. A
read that fails puts the load back on the request (its mark), so it is still priced as one;
`tandem_router_adapter_prefetches_total{outcome}` counts them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tandem.router.scheduling.adapterload import AdapterLoads
from tandem.router.upstream.adaptercopy import AdapterCopier


@dataclass(frozen=True, slots=True)
class Reading:
    """One decode engine's read of a request's adapter, started with its prefill."""

    task: asyncio.Task[bool]
    url: str
    adapter: str
    loads: AdapterLoads

    async def wait(self) -> None:
        """Until the read has ended (not cancelled with the request that waits: the engine reads the
        adapter anyway); one that failed is the request's own load again (its mark)."""
        task = self.task
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None or not task.result():
            self.loads.mark(self.url, self.adapter)


class DecodeAdapterLoad:
    """Starts a disaggregated request's decode-side adapter read with its prefill (module docstring)."""

    def __init__(self, loads: AdapterLoads, copier: AdapterCopier) -> None:
        self._loads = loads
        self._copier = copier

    def start(self, url: str, adapter: str | None) -> Reading | None:
        """The read of `adapter` on the decode engine at `url`, started now; None when there is
        nothing to read (the base model, an engine that holds it or is being sent it already) or
        copies are paused after a failure."""
        if adapter is None:
            return None
        started: list[asyncio.Task[bool]] = []

        def begin(url: str, adapter: str) -> bool:
            task = self._copier.begin(url, adapter, inplace=True, prefetch=True)
            if task is not None:
                started.append(task)
            return task is not None

        if not self._loads.take_load(url, adapter, start=begin):
            return None
        return Reading(started[0], url, adapter, self._loads)
