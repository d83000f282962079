"""The adapters a service serves follow what it declares while the gateway runs.

**New names without a restart** (`AdapterNamesFile`). With `adapterNamesFile` in the router config
(the operator's gateways mount ConfigMap `<service>-adapter-names` there, `tandem.core.adapternames`),
the gateway reads the file at start-up and again whenever `os.stat` (following the kubelet's symlink
swap) sees it change, checked every `interval_s` (2 s). Its names become the service's adapters
(`tandem.router.request.adapters.ServiceAdapters`) at once: a name added there is served, one removed
is refused (404). A file that exists but cannot be read or parsed at start-up stops the gateway
(`ConfigurationError`); one that does not exist yet (an InferenceGateway's optional mount of a
service whose names the operator has not written) means no names until it appears (a warning); later,
the last good names stay (logged, counted as a failed reload).

**Names dropped are unloaded** (`AdapterJanitor`). Adapters load on the engines on first use (vLLM's
filesystem resolver), so adding one needs nothing more, and an engine that restarts loads them again as
requests come. The janitor, told each engine the collector's round finds (`follow`), asks every engine
it has not seen before for its `/v1/models` and unloads (`POST /v1/unload_lora_adapter`, vLLM's runtime
API, which the operator turns on) every adapter there that the service does not serve; when names
are dropped (`dropped`) it sweeps every engine again. One engine's sweep at a time, in the background:
a slow engine never delays the collector's round.

Off when the service's names are not all known to the gateway: an adapter catalog on a volume
(`pvc://`) without a names file, whose adapters only the engines can list. Locally (`tandem up`), with
`spec.adapters` alone, or with a names file (which lists the catalog's names), they are known.

The copies, loads ahead and decode-side reads the gateway makes itself are in
`tandem.router.upstream.adaptercopy`; `AdapterNamesCollector` counts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.core.adapternames import MAX_NAMES_BYTES, parse_names
from tandem.core.adapters import AdapterError
from tandem.core.files import Signature, signature
from tandem.core.tasks import Every
from tandem.router.errors import ConfigurationError, UpstreamError
from tandem.router.observe.metrics import PREFIX
from tandem.router.request.adapters import Change, ServiceAdapters
from tandem.router.types import Endpoint
from tandem.router.upstream.adaptercopy import AdapterCopier, post_json
from tandem.router.upstream.client import HTTPUpstream

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
        #: What the service serves: read at each sweep (a live set follows the names file).
        self._declared = declared
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

    def dropped(self, change: Change) -> None:
        """A `ServiceAdapters` listener: names were dropped, so every engine is swept again."""
        if not change.removed:
            return
        self._queue += [u for u in self._seen if u not in self._queue]
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
            status, why = await post_json(self._upstream, endpoint, UNLOAD_PATH, {"lora_name": name},
                                          timeout_s=self._timeout_s)  # fmt: skip
            fields = {"endpoint": endpoint.name, "adapter": name}
            if not status:
                log.warning("adapter unload failed", extra=fields | {"why": why})
            elif status < 300:
                done.append(name)
                log.info("adapter unloaded: the service no longer declares it", extra=fields)
            else:
                log.warning("adapter unload refused", extra=fields | {"status": status})
        if done:
            self.unloaded.setdefault(url, []).extend(done)
        return done

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


#: The signature of a file not written yet.
_MISSING: Signature = (0, 0, 0, 0)


def _read(path: Path) -> tuple[Signature, tuple[str, ...]]:
    """The file's signature and names; raises `OSError` or `AdapterError`."""
    seen = signature(path)
    if seen[2] > MAX_NAMES_BYTES:
        raise AdapterError(f"{path} is over {MAX_NAMES_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise AdapterError(f"{path} is not UTF-8: {exc}") from None
    return seen, parse_names(text)


class AdapterNamesFile:
    """Keeps `adapters` equal to the names file at `path` (module docstring). Construction reads
    the file and raises `ConfigurationError` when it cannot; `reloads` counts later reads by outcome
    (`ok`, `error`) for the metrics."""

    def __init__(self, path: Path, adapters: ServiceAdapters, *, interval_s: float = 2.0) -> None:
        self.path = path
        self.adapters = adapters
        self.interval_s = interval_s
        self.reloads = {"ok": 0, "error": 0}
        self.error = ""
        self._every = Every(self.check, interval_s=interval_s, name="tandem-adapter-names")
        try:
            self._signature, names = _read(path)
        except FileNotFoundError:
            self._signature, self.error = _MISSING, f"{path} does not exist (yet)"
            log.warning("adapter names file missing; serving no listed adapters until it appears",
                        extra={"file": str(path)})  # fmt: skip
            return
        except (OSError, AdapterError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise ConfigurationError(f"adapterNamesFile {path}: {why}") from None
        self._apply(names)

    def check(self) -> Change | None:
        """Read the file again if it changed; the change it made (None: the file did not change or
        could not be read, and the names stay)."""
        try:
            if signature(self.path) == self._signature:
                return None
            seen, names = _read(self.path)
        except FileNotFoundError:
            if self._signature == _MISSING:
                return None  # not written yet: said once at start-up, not a failed reload
            self._failed("the file is gone")
            return None
        except (OSError, AdapterError) as exc:
            # Mid-update (the link briefly points nowhere) or a bad list: the names stay.
            self._failed(str(getattr(exc, "strerror", None) or exc))
            return None
        self._signature, self.error = seen, ""
        self.reloads["ok"] += 1
        return self._apply(names)

    def _failed(self, why: str) -> None:
        """A reload that failed: the names stay; logged once per reason, counted each time."""
        if why != self.error:
            log.warning("adapter names not reloaded; keeping the previous ones",
                        extra={"file": str(self.path), "why": why})  # fmt: skip
        self.error = why
        self.reloads["error"] += 1

    def _apply(self, names: tuple[str, ...]) -> Change:
        change = self.adapters.replace(names)
        for name, why in self.adapters.refused.items():
            log.warning("adapter name not served", extra={"adapter": name, "why": why})
        if change:
            log.info(
                "adapter names changed",
                extra={"file": str(self.path), "added": list(change.added)[:20],
                       "removed": list(change.removed)[:20], "adapters": len(self.adapters)},
            )  # fmt: skip
        return change

    async def start(self) -> None:
        await self._every.start()

    async def stop(self) -> None:
        await self._every.stop()


class AdapterNamesCollector(Collector):
    """Scrape-time metrics of a service's adapter names: served and refused now; the names file's
    reloads by outcome (with a file); the copies of hot adapters by outcome (with a copier)."""

    def __init__(self, adapters: ServiceAdapters, names_file: AdapterNamesFile | None) -> None:
        self._adapters = adapters
        self._file = names_file
        #: The copier of hot adapters, when the gateway has one (its copies by outcome).
        self.copier: AdapterCopier | None = None

    def collect(self) -> Iterator[Metric]:
        served = GaugeMetricFamily(f"{PREFIX}_adapters", "LoRA adapters the gateway serves now.")
        served.add_metric([], len(self._adapters))
        refused = GaugeMetricFamily(
            f"{PREFIX}_adapters_refused",
            "Adapter names listed but not served (another model's, adapter's or alias's name).",
        )
        refused.add_metric([], len(self._adapters.refused))
        yield from (served, refused)
        if self._file is not None:
            yield _by_outcome(
                "adapter_names_reloads",
                "Reads of the adapter names file after it changed, by outcome (ok; error: the names stay).",
                self._file.reloads,
            )
        if self.copier is not None:
            yield _by_outcome(
                "adapter_copies",
                "Hot adapters loaded onto another engine ahead of their requests, by outcome (loaded, "
                "failed: the requests load it there themselves).",
                self.copier.copies,
            )
            yield _by_outcome(
                "adapter_warm_loads",
                "Declared adapters loaded onto an engine ahead of their first request, by outcome "
                "(loaded, or found there already; failed: its first request loads it).",
                self.copier.warm_loads,
            )
            yield _by_outcome(
                "adapter_prefetches",
                "Adapters loaded onto a disaggregated request's decode engine while its prefill ran, by "
                "outcome (loaded; failed: the request loads it there itself).",
                self.copier.prefetches,
            )

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _by_outcome(name: str, doc: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter family `<PREFIX>_<name>_total{outcome}` from counts by outcome."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["outcome"])
    for outcome, count in counts.items():
        family.add_metric([outcome], count)
    return family
