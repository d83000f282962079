"""Publish the simulated engine's KV events over ZMQ exactly as vLLM's `ZmqEventPublisher` does.

- PUB socket, bound to `endpoint` (the simulator always binds; `tcp://127.0.0.1:*` picks a free port,
  read it back from `.endpoint`). Each batch is one multipart message `(topic, seq, payload)`: seq is
  a uint64 big-endian counter starting at 0, payload a msgpack `EventBatch` (`kvevents_wire`).
- One batch per engine step that produced events: the block pool reports events through `collect`
  while the step is planned, and the engine loop calls `flush` when the step ends (vLLM, too, takes
  the step's events from its KV cache manager after the step and publishes them if there are any).
- Replay: an optional ROUTER socket bound to `replay_endpoint`. A client sends `(b"", start_seq as
  8 bytes big-endian)` (a REQ socket adds the empty frame itself; a DEALER sends it); the publisher
  answers `(b"", seq, payload)` for every buffered batch with seq >= start, then `(b"", -1 as 8 signed
  bytes, b"")`. The buffer keeps the last `buffer_steps` batches.
- Like vLLM's, it drops rather than blocks: a subscriber that falls `hwm` messages behind loses them
  (and can ask for a replay); if the send queue holds `max_queue` batches, new ones are dropped.

The engine core stays pure: `collect` and `flush` only queue; one task sends, another serves replays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from tandem.core.tasks import stop_tasks
from tandem.sim.engine.blocks import KVEvent
from tandem.sim.kvevents_wire import Encoding, encode_batch

logger = logging.getLogger("tandem.sim.kvevents")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVEventPublisher:
    """The ZMQ shell around `kvevents_wire` (module docstring). `start()` binds, `aclose()` unbinds."""

    def __init__(
        self,
        *,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        encoding: Encoding = "map",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue: int = 100_000,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._encoding: Encoding = encoding
        self._hwm = hwm
        self._wall = wall
        self._pending: list[KVEvent] = []
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self.dropped_batches = 0
        self._context: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def published_batches(self) -> int:
        return self._next_seq

    async def start(self) -> None:
        """Bind the sockets (a bad or busy address raises `zmq.ZMQError` here) and start the tasks."""
        context = self._context = zmq.asyncio.Context()
        pub = context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        try:
            pub.bind(self.endpoint)
            self.endpoint = _bound(pub)
            self._tasks.append(asyncio.create_task(self._send_loop(pub), name="tandem-sim-kv-events"))
            if self.replay_endpoint is not None:
                replay = context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.replay_endpoint)
                self.replay_endpoint = _bound(replay)
                self._tasks.append(
                    asyncio.create_task(self._serve_replays(replay), name="tandem-sim-kv-replay")
                )
        except zmq.ZMQError:
            await self.aclose()
            raise
        logger.info(
            "kv events published",
            extra={"endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint},
        )

    def collect(self, event: KVEvent) -> None:
        """The block pool's event sink: hold the event until the step ends."""
        self._pending.append(event)

    def flush(self) -> None:
        """End of an engine step: queue the step's events as one batch (nothing if there were none)."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        payload = encode_batch(events, ts=self._wall(), encoding=self._encoding)
        try:
            self._queue.put_nowait(payload)
        except asyncio.QueueFull:
            self.dropped_batches += 1

    async def aclose(self) -> None:
        """Stop the tasks and close the sockets at once (queued batches are dropped)."""
        await stop_tasks(self._tasks)
        self._tasks.clear()
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    async def _send_loop(self, pub: zmq.asyncio.Socket) -> None:
        while True:
            payload = await self._queue.get()
            seq = self._next_seq
            await pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])
            self._next_seq += 1
            self._buffer.append((seq, payload))

    async def _serve_replays(self, replay: zmq.asyncio.Socket) -> None:
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                logger.warning("invalid kv-events replay request", extra={"frames": len(frames)})
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            sent = 0
            for seq, payload in list(self._buffer):
                if seq >= start_seq:
                    await replay.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
                    sent += 1
            await replay.send_multipart([client, b"", END_SEQ, b""])
            logger.debug("kv-events replay served", extra={"start_seq": start_seq, "batches": sent})


def _bound(socket: zmq.asyncio.Socket) -> str:
    """The address a socket is bound to, with a wildcard port resolved (`tcp://127.0.0.1:*`)."""
    value = socket.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)
