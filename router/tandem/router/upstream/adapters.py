"""Adapters a service no longer declares leave its engines: the gateway unloads them.

An InferenceService's adapters load on the engines on first use (vLLM's filesystem resolver), so adding
one needs nothing more, and an engine that restarts loads them again as requests come. Removing one
changes the gateway's configuration, which rolls its pods: the new gateway refuses the name (404), and
this janitor, told each engine the collector's round finds (`follow`), asks every engine it has not
seen before for its `/v1/models` and unloads (`POST /v1/unload_lora_adapter`, vLLM's runtime API,
which the operator turns on) every adapter there that the service does not declare. One engine's
sweep at a time, in the background: a slow engine never delays the collector's round.

Off when the service's names are not all known to the gateway: an adapter catalog on a volume
(`pvc://`), whose adapters only the engines can list. Locally (`tandem up`) and with `spec.adapters`
the names are known.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping

import orjson

from tandem.router.errors import UpstreamError
from tandem.router.types import Endpoint
from tandem.router.upstream.client import HTTPUpstream, UpstreamCall

log = logging.getLogger(__name__)

UNLOAD_PATH = "/v1/unload_lora_adapter"


def undeclared(entries: Collection[Mapping[str, object]], declared: Collection[str]) -> list[str]:
    """The adapters among an engine's `/v1/models` entries (those with a `parent`) that are not
    `declared`, in the engine's order (pure).

    >>> entries = [{"id": "qwen"}, {"id": "sql", "parent": "qwen"}, {"id": "old", "parent": "qwen"}]
    >>> undeclared(entries, {"sql"})
    ['old']"""
    return [str(e["id"]) for e in entries if e.get("parent") and e.get("id") not in declared]


class AdapterJanitor:
    """Unloads undeclared adapters from each engine the first time it is seen (module docstring)."""

    def __init__(self, upstream: HTTPUpstream, *, declared: Collection[str], timeout_s: float) -> None:
        self._upstream = upstream
        self._declared = frozenset(declared)
        self._timeout_s = timeout_s
        self._seen: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._queue: list[str] = []
        #: Adapters unloaded so far, by engine URL (for the logs and tests).
        self.unloaded: dict[str, list[str]] = {}

    def follow(self, urls: Collection[str]) -> None:
        """Sweep the engines not seen before; forget those gone (one that comes back is swept again)."""
        current = set(urls)
        self._queue += [u for u in urls if u not in self._seen]
        self._seen = current
        if self._queue and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="tandem-adapter-janitor")

    async def _run(self) -> None:
        while self._queue:
            url = self._queue.pop(0)
            try:
                await self.sweep(url)
            except Exception:  # one engine's failure must not stop the others' sweeps
                log.exception("adapter sweep failed", extra={"endpoint": url})

    async def sweep(self, url: str) -> list[str]:
        """Unload from the engine at `url` what the service does not declare; returns the names."""
        endpoint = Endpoint("decode", url)
        try:
            answer = await self._upstream.get_json(endpoint, "/v1/models", timeout_s=self._timeout_s)
        except (UpstreamError, ValueError) as exc:
            log.info("engine did not list its adapters", extra={"endpoint": endpoint.name, "why": str(exc)})
            return []
        data = answer.get("data") if isinstance(answer, Mapping) else None
        entries = [e for e in data if isinstance(e, Mapping)] if isinstance(data, list) else []
        done = []
        for name in undeclared(entries, self._declared):
            body = orjson.dumps({"lora_name": name})
            call = UpstreamCall(path=UNLOAD_PATH, body=body, headers={}, stream=False,
                                read_timeout_s=self._timeout_s)  # fmt: skip
            try:
                reply = await self._upstream.open(endpoint, call)
                reply.close()
            except UpstreamError as exc:
                log.warning("adapter unload failed", extra={"endpoint": endpoint.name, "adapter": name,
                                                             "why": exc.message})  # fmt: skip
                continue
            if reply.status < 300:
                done.append(name)
                log.info("adapter unloaded: the service no longer declares it",
                         extra={"endpoint": endpoint.name, "adapter": name})  # fmt: skip
            else:
                log.warning("adapter unload refused", extra={"endpoint": endpoint.name, "adapter": name,
                                                              "status": reply.status})  # fmt: skip
        if done:
            self.unloaded.setdefault(url, []).extend(done)
        return done

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
