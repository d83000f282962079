"""Helpers for the subscriber tests: a publisher the test drives seq by seq, and recorders.

- `ScriptedPublisher`: real ZMQ sockets on 127.0.0.1 that speak vLLM's protocol (live `(topic, seq,
  payload)`, replay on a ROUTER), but publish only what the test says, so it can skip a seq on the
  live stream, keep batches only for replay, or start again at seq 0. It binds an XPUB instead of a
  PUB: the same wire for subscribers, and the test can wait until a subscription has arrived (no
  slow-joiner races). `replay_topic_frame` answers replays in vLLM's newer shape (PR #45177).
- `RecordingIndex`: a real `PrecisePrefixIndex` that also records the batches and clears it got.
- `RecordingMetrics`: a `KVEventMetrics` that appends every call to a list.
- `eventually`: wait (with a generous deadline) until a condition holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import zmq
import zmq.asyncio
from tests.kvevents.payloads import batch, stored_array

from tandem.router.discovery.kvevents.decode import BlockStored, KVEvent
from tandem.router.discovery.kvevents.index import PrecisePrefixIndex
from tandem.router.discovery.kvevents.ports import ConnectionState, ReplayOutcome

MINUS_ONE = (-1).to_bytes(8, "big", signed=True)
TOKENS_PER_BATCH = 4


def stored_batch(seq: int) -> bytes:
    """Batch number `seq` of a test stream: one block, engine hash 1000 + seq, chained to the last."""
    tokens = list(range(seq * TOKENS_PER_BATCH, (seq + 1) * TOKENS_PER_BATCH))
    parent = None if seq == 0 else 1000 + seq - 1
    return batch(stored_array([1000 + seq], tokens, parent=parent, block_size=TOKENS_PER_BATCH))


def stream_tokens(batches: int) -> list[int]:
    """The tokens the first `batches` batches of `stored_batch` cover, in order."""
    return list(range(batches * TOKENS_PER_BATCH))


async def eventually(condition: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    """Return once `condition()` is true; fail if it is not within `timeout_s` (a liveness guard,
    not a speed check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition still false")
        await asyncio.sleep(0.005)


class ScriptedPublisher:
    """A vLLM-style KV-event publisher driven by the test (module docstring)."""

    def __init__(
        self,
        *,
        topic: bytes = b"",
        replay: bool = True,
        replay_topic_frame: bool = False,
        port: int | None = None,
        replay_port: int | None = None,
    ) -> None:
        self.topic = topic
        self.buffer: dict[int, bytes] = {}
        self.replay_requests: list[int] = []
        self.events_url = f"tcp://127.0.0.1:{port or '*'}"
        self.replay_url: str | None = f"tcp://127.0.0.1:{replay_port or '*'}" if replay else None
        self._topic_frame = replay_topic_frame
        self._context = zmq.asyncio.Context()
        self._xpub = self._context.socket(zmq.XPUB)
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._xpub.setsockopt(zmq.LINGER, 0)
        self._xpub.bind(self.events_url)
        self.events_url = self._xpub.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.replay_url is not None:
            router = self._router = self._context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(self.replay_url)
            self.replay_url = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._task = asyncio.create_task(self._serve(router))

    async def wait_subscribed(self) -> bytes:
        """The next subscription message (`b"\\x01" + topic`), skipping unsubscriptions."""
        while True:
            frame: bytes = await asyncio.wait_for(self._xpub.recv(), 10)
            if frame[:1] == b"\x01":
                return frame

    def keep(self, seq: int, payload: bytes) -> None:
        """Buffer a batch for replay without publishing it live."""
        self.buffer[seq] = payload

    async def publish(self, seq: int, payload: bytes, *, topic: bytes | None = None) -> None:
        self.keep(seq, payload)
        await self._xpub.send_multipart(
            [self.topic if topic is None else topic, seq.to_bytes(8, "big"), payload]
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._context.destroy(linger=0)

    async def _serve(self, router: zmq.asyncio.Socket) -> None:
        prefix = [self.topic] if self._topic_frame else []
        while True:
            client, _, start = await router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.replay_requests.append(start_seq)
            for seq in sorted(self.buffer):
                if seq >= start_seq:
                    await router.send_multipart(
                        [client, b"", *prefix, seq.to_bytes(8, "big"), self.buffer[seq]]
                    )
            await router.send_multipart([client, b"", *prefix, MINUS_ONE, b""])


class RecordingIndex(PrecisePrefixIndex):
    """A real index that also records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.applied_hashes: list[int] = []
        self.clears: list[str] = []
        self.forgotten: list[str] = []

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None:
        events = list(events)
        self.applied_hashes += [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
        super().apply(endpoint, events)

    def clear(self, endpoint: str) -> None:
        self.clears.append(endpoint)
        super().clear(endpoint)

    def forget(self, endpoint: str) -> None:
        self.forgotten.append(endpoint)
        super().forget(endpoint)


class RecordingMetrics:
    """Every metrics call as a tuple, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def named(self, name: str) -> list[tuple[object, ...]]:
        return [c[1:] for c in self.calls if c[0] == name]

    def events_applied(self, endpoint: str, kind: str, count: int) -> None:
        self.calls.append(("events_applied", kind, count))

    def unknown_events(self, endpoint: str, count: int) -> None:
        self.calls.append(("unknown_events", count))

    def decode_error(self, endpoint: str) -> None:
        self.calls.append(("decode_error",))

    def gap(self, endpoint: str, missed: int) -> None:
        self.calls.append(("gap", missed))

    def lost(self, endpoint: str, batches: int) -> None:
        self.calls.append(("lost", batches))

    def replay(self, endpoint: str, outcome: ReplayOutcome, batches: int) -> None:
        self.calls.append(("replay", outcome, batches))

    def restart(self, endpoint: str) -> None:
        self.calls.append(("restart",))

    def connection(self, endpoint: str, state: ConnectionState) -> None:
        self.calls.append(("connection", state))

    def forget(self, endpoint: str) -> None:
        self.calls.append(("forget",))
