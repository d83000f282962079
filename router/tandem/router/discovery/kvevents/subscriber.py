"""Subscribe to engines' KV events over ZMQ and feed them, in sequence order, to an `EventSink`.

One `KVEventSubscriber` per engine (`EventSource`): a SUB socket connected to the engine's events
address with a topic filter, plus a short-lived DEALER to the engine's replay address when needed.

Sequence handling (pure rules in `protocol.SequenceTracker`):
- every time the SUB connection is (re-)established (ZMQ handshake done), the subscriber first asks
  for a replay from the last applied seq + 1 (from 0 the first time: a subscriber started late
  catches up on everything the engine still buffers) and applies it before any live batch;
- a live seq beyond the next expected one is a gap: replay from the next expected seq, then apply it;
- a live seq at or below one already applied is a duplicate (a replay got there first) and is dropped;
- a live seq at or below the previous *live* seq means the engine restarted (vLLM starts again at 0
  with an empty cache): the sink forgets the endpoint, then replay from 0.
Batches no replay can deliver (no replay address, timeout, or older than the engine's buffer) are
counted as lost and skipped; the index then may hold stale blocks until the engine removes them.

Connections: ZMQ reconnects by itself with exponential backoff (`reconnect_ivl_ms` doubling up to
`reconnect_ivl_max_ms`); each reconnect triggers the catch-up replay above. A socket error rebuilds
the sockets after the same kind of backoff. Lifecycle: `await start()`, then `await aclose()`.
`KVEventSubscribers` keeps one subscriber per endpoint in step with discovery.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from tandem.core.tasks import stop_tasks
from tandem.router.discovery.kvevents.decode import DecodeError, decode_batch
from tandem.router.discovery.kvevents.ports import EventSink, KVEventMetrics, NoMetrics
from tandem.router.discovery.kvevents.protocol import (
    FrameError,
    SequenceTracker,
    Verdict,
    parse_live,
    parse_replay,
    replay_request,
)

logger = logging.getLogger("tandem.router.discovery.kvevents")


@dataclass(frozen=True)
class EventSource:
    """Where one engine publishes: `endpoint` is the router's name for it (its base URL), the others
    are ZMQ addresses (`tcp://10.0.0.5:5557`); `topic` filters by prefix ("" takes everything)."""

    endpoint: str
    events_url: str
    replay_url: str | None = None
    topic: str = ""


@dataclass(frozen=True)
class SubscriberOptions:
    """Timeouts in seconds, ZMQ intervals in milliseconds."""

    replay_timeout_s: float = 2.0
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 5_000
    rcvhwm: int = 100_000


class KVEventSubscriber:
    """Follows one engine's KV events into `sink` (module docstring)."""

    def __init__(
        self,
        source: EventSource,
        *,
        sink: EventSink,
        metrics: KVEventMetrics | None = None,
        context: zmq.asyncio.Context | None = None,
        options: SubscriberOptions | None = None,
    ) -> None:
        self.source = source
        self.tracker = SequenceTracker()
        self._sink = sink
        self._metrics = metrics or NoMetrics()
        self._options = options or SubscriberOptions()
        self._context = context
        self._owns_context = context is None
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """Connected, and caught up by the replay that follows every (re)connection."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the subscriber is already started")
        if self._context is None:
            self._context = zmq.asyncio.Context()
        self._task = asyncio.create_task(self._run(), name=f"kv-events {self.source.endpoint}")

    async def aclose(self) -> None:
        """Stop following; closes the sockets (and the ZMQ context, if this subscriber made it)."""
        task, self._task = self._task, None
        await stop_tasks([task] if task is not None else [])
        if self._owns_context and self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    async def _run(self) -> None:
        delay = self._options.reconnect_ivl_ms / 1000
        while True:
            try:
                await self._session()
            except zmq.ZMQError as exc:
                logger.warning(
                    "kv-events socket failed", extra={"endpoint": self.source.endpoint, "error": str(exc)}
                )
            except Exception:
                # Top of a background task: a malformed frame or a bug in the sink must not end the
                # subscription for good; the session is rebuilt (and caught up) after a backoff.
                logger.exception("kv-events session failed", extra={"endpoint": self.source.endpoint})
            if self._synced.is_set():
                delay = self._options.reconnect_ivl_ms / 1000
            self._synced.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._options.reconnect_ivl_max_ms / 1000)

    async def _session(self) -> None:
        assert self._context is not None
        options = self._options
        sub = self._context.socket(zmq.SUB)
        monitor: zmq.asyncio.Socket | None = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, options.rcvhwm)
            sub.setsockopt(zmq.RECONNECT_IVL, options.reconnect_ivl_ms)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, options.reconnect_ivl_max_ms)
            sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
            monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
            sub.connect(self.source.events_url)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    await self._on_monitor(await monitor.recv_multipart())
                if sub in ready:
                    await self._on_live(await sub.recv_multipart())
        finally:
            if monitor is not None:
                sub.disable_monitor()
                monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_monitor(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        endpoint = self.source.endpoint
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._metrics.connection(endpoint, "connected")
            logger.info("kv-events connected", extra={"endpoint": endpoint, "url": self.source.events_url})
            await self._replay(self.tracker.next_expected)
            self._synced.set()
        elif event == zmq.EVENT_DISCONNECTED:
            self._metrics.connection(endpoint, "disconnected")
            logger.warning("kv-events disconnected", extra={"endpoint": endpoint})
            self._synced.clear()

    async def _on_live(self, frames: list[bytes]) -> None:
        endpoint = self.source.endpoint
        try:
            _, seq, payload = parse_live(frames)
        except FrameError:
            self._metrics.decode_error(endpoint)
            return
        decision = self.tracker.on_live(seq)
        if decision.verdict is Verdict.DUPLICATE:
            return
        if decision.verdict is Verdict.RESTART:
            logger.warning("kv-events engine restarted", extra={"endpoint": endpoint, "seq": seq})
            self._metrics.restart(endpoint)
            self._sink.clear(endpoint)
        elif decision.verdict is Verdict.GAP:
            self._metrics.gap(endpoint, decision.missed)
        if decision.verdict is not Verdict.APPLY:
            await self._replay(decision.replay_from)
            still_missing = seq - self.tracker.next_expected
            if still_missing > 0:
                self._metrics.lost(endpoint, still_missing)
        if self.tracker.should_apply(seq):
            self._apply(seq, payload)

    async def _replay(self, start: int) -> None:
        """Apply every batch from `start` on that the engine still buffers and we have not applied."""
        endpoint, url = self.source.endpoint, self.source.replay_url
        if url is None:
            self._metrics.replay(endpoint, "unavailable", 0)
            return
        assert self._context is not None
        timeout_s = self._options.replay_timeout_s
        dealer = self._context.socket(zmq.DEALER)
        applied, first = 0, True
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(url)
            await asyncio.wait_for(dealer.send_multipart(replay_request(start)), timeout_s)
            while True:
                if not await dealer.poll(int(timeout_s * 1000)):  # POLLIN
                    raise TimeoutError
                item = parse_replay(await dealer.recv_multipart())
                if item is None:
                    break
                seq, payload = item
                if first and seq > start:  # older than the engine's buffer: gone
                    self._metrics.lost(endpoint, seq - start)
                first = False
                if self.tracker.should_apply(seq):
                    self._apply(seq, payload)
                    applied += 1
        except TimeoutError:
            self._metrics.replay(endpoint, "timeout", applied)
        except FrameError:
            self._metrics.replay(endpoint, "error", applied)
        else:
            self._metrics.replay(endpoint, "ok", applied)
        finally:
            dealer.close(linger=0)

    def _apply(self, seq: int, payload: bytes) -> None:
        endpoint = self.source.endpoint
        self.tracker.applied(seq)
        try:
            batch = decode_batch(payload)
        except DecodeError as exc:
            self._metrics.decode_error(endpoint)
            logger.warning("undecodable kv-events batch", extra={"endpoint": endpoint, "error": str(exc)})
            return
        self._sink.apply(endpoint, batch.events)
        for kind, count in Counter(type(e).__name__ for e in batch.events).items():
            self._metrics.events_applied(endpoint, kind, count)
        if batch.unknown_tags:
            self._metrics.unknown_events(endpoint, len(batch.unknown_tags))


class KVEventSubscribers:
    """One `KVEventSubscriber` per endpoint, sharing one ZMQ context; `sync` follows discovery."""

    def __init__(
        self,
        *,
        sink: EventSink,
        metrics: KVEventMetrics | None = None,
        options: SubscriberOptions | None = None,
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self._options = options
        self._context: zmq.asyncio.Context | None = None
        self._subscribers: dict[str, KVEventSubscriber] = {}

    def get(self, endpoint: str) -> KVEventSubscriber | None:
        return self._subscribers.get(endpoint)

    async def sync(self, sources: Iterable[EventSource]) -> None:
        """Start subscribers for new sources; stop the ones whose endpoint left discovery (the sink
        and the metrics forget it) or whose addresses changed (the sink clears it: a new engine)."""
        wanted = {source.endpoint: source for source in sources}
        for endpoint, subscriber in list(self._subscribers.items()):
            if wanted.get(endpoint) != subscriber.source:
                del self._subscribers[endpoint]
                await subscriber.aclose()
                if endpoint in wanted:
                    self._sink.clear(endpoint)
                else:
                    self._sink.forget(endpoint)
                    if self._metrics is not None:
                        self._metrics.forget(endpoint)
        if self._context is None:
            self._context = zmq.asyncio.Context()
        for endpoint, source in wanted.items():
            if endpoint not in self._subscribers:
                subscriber = KVEventSubscriber(
                    source,
                    sink=self._sink,
                    metrics=self._metrics,
                    context=self._context,
                    options=self._options,
                )
                await subscriber.start()
                self._subscribers[endpoint] = subscriber

    async def aclose(self) -> None:
        subscribers, self._subscribers = list(self._subscribers.values()), {}
        await asyncio.gather(*(s.aclose() for s in subscribers))
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None
