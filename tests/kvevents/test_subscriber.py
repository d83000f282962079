"""The KV-event subscriber (`tandem.router.discovery.kvevents.subscriber`) against a scripted publisher.

Real: ZMQ sockets on 127.0.0.1 (the subscriber's SUB and DEALER, the publisher's XPUB and ROUTER),
the decoder and the index. Scripted: the publisher side (`tests.kvevents.harness.ScriptedPublisher`)
sends exactly the sequence numbers a story needs, in vLLM's framing. No test looks at how fast it was.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import pytest
from tests.kvevents.harness import (
    RecordingIndex,
    RecordingMetrics,
    ScriptedPublisher,
    eventually,
    stored_batch,
    stream_tokens,
)
from tests.servers import free_port

from tandem.router.discovery.kvevents.decode import KVEvent
from tandem.router.discovery.kvevents.subscriber import (
    EventSource,
    KVEventSubscriber,
    KVEventSubscribers,
    SubscriberOptions,
)

ENGINE = "http://127.0.0.1:8101"
FAST = SubscriberOptions(replay_timeout_s=5.0, reconnect_ivl_ms=20, reconnect_ivl_max_ms=200)

Start = Callable[..., Awaitable[tuple[ScriptedPublisher, KVEventSubscriber]]]


@pytest.fixture
async def index() -> RecordingIndex:
    return RecordingIndex()


@pytest.fixture
async def metrics() -> RecordingMetrics:
    return RecordingMetrics()


@pytest.fixture
async def start(index: RecordingIndex, metrics: RecordingMetrics) -> AsyncIterator[Start]:
    """`await start(publisher)`: start it, then a subscriber on it; both are closed afterwards."""
    opened: list[ScriptedPublisher | KVEventSubscriber] = []

    async def _start(
        publisher: ScriptedPublisher, *, topic: str = ""
    ) -> tuple[ScriptedPublisher, KVEventSubscriber]:
        await publisher.start()
        opened.append(publisher)
        source = EventSource(ENGINE, publisher.events_url, publisher.replay_url, topic)
        subscriber = KVEventSubscriber(source, sink=index, metrics=metrics, options=FAST)
        await subscriber.start()
        opened.append(subscriber)
        return publisher, subscriber

    yield _start
    for item in reversed(opened):
        await item.aclose()


def matched(index: RecordingIndex, batches: int) -> bool:
    return index.longest_prefix([ENGINE], stream_tokens(batches))[ENGINE] == 4 * batches


@pytest.mark.parametrize("topic_frame", [False, True], ids=["vllm-replay", "vllm-45177-replay"])
async def test_a_late_subscriber_catches_up_from_the_replay_buffer(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics, topic_frame: bool
) -> None:
    publisher = ScriptedPublisher(topic=b"kv@a@m", replay_topic_frame=topic_frame)
    for seq in range(3):  # published before anyone listened: only the buffer has them
        publisher.keep(seq, stored_batch(seq))
    _, subscriber = await start(publisher, topic="kv@a")
    await subscriber.wait_synced()
    assert matched(index, 3) and subscriber.tracker.last_applied == 2
    assert publisher.replay_requests == [0]
    assert metrics.named("replay") == [("ok", 3)]
    assert metrics.named("events_applied") == [("BlockStored", 1)] * 3


async def test_a_missed_live_seq_is_replayed_before_the_live_batch(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    publisher, subscriber = await start(ScriptedPublisher())
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    await publisher.publish(0, stored_batch(0))
    await publisher.publish(1, stored_batch(1))
    await eventually(lambda: subscriber.tracker.last_applied == 1)
    publisher.keep(2, stored_batch(2))  # lost on the live stream
    await publisher.publish(3, stored_batch(3))
    await eventually(lambda: len(metrics.named("replay")) == 2)  # the catch-up one, then this one
    assert index.applied_hashes == [1000, 1001, 1002, 1003]  # in order, each once
    assert matched(index, 4)
    assert metrics.named("gap") == [(1,)]
    assert publisher.replay_requests[-1] == 2
    assert metrics.named("replay")[-1] == ("ok", 2) and not metrics.named("lost")


async def test_a_seq_going_backwards_means_the_engine_restarted(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    publisher, subscriber = await start(ScriptedPublisher())
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    for seq in range(3):
        await publisher.publish(seq, stored_batch(seq))
    await eventually(lambda: matched(index, 3))
    publisher.buffer.clear()  # the new engine process: empty cache, seq from 0
    await publisher.publish(0, stored_batch(0))
    await eventually(lambda: bool(metrics.named("restart")))
    await eventually(lambda: subscriber.tracker.last_applied == 0)
    assert index.clears == [ENGINE]
    assert matched(index, 1) and not matched(index, 2)


async def test_a_publisher_restarted_on_the_same_port_is_followed_again(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    port, replay_port = free_port(), free_port()
    first, subscriber = await start(ScriptedPublisher(port=port, replay_port=replay_port))
    await first.wait_subscribed()
    await subscriber.wait_synced()
    for seq in range(3):
        await first.publish(seq, stored_batch(seq))
    await eventually(lambda: subscriber.tracker.last_applied == 2)
    await first.aclose()
    await eventually(lambda: ("connection", "disconnected") in metrics.calls)

    second = ScriptedPublisher(port=port, replay_port=replay_port)
    await second.start()
    try:
        await second.wait_subscribed()  # ZMQ reconnected by itself
        await eventually(lambda: subscriber.synced)
        await second.publish(0, stored_batch(0))
        await second.publish(1, stored_batch(1))
        await eventually(lambda: subscriber.tracker.last_applied == 1)
    finally:
        await second.aclose()
    assert index.clears == [ENGINE] and metrics.named("restart") == [()]
    assert matched(index, 2) and not matched(index, 3)


async def test_without_a_replay_endpoint_a_gap_is_counted_as_lost(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    publisher, subscriber = await start(ScriptedPublisher(replay=False))
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    await publisher.publish(0, stored_batch(0))
    await publisher.publish(2, stored_batch(2))
    await eventually(lambda: subscriber.tracker.last_applied == 2)
    assert metrics.named("gap") == [(1,)] and metrics.named("lost") == [(1,)]
    assert ("unavailable", 0) in metrics.named("replay")
    assert index.applied_hashes == [1000, 1002]
    assert matched(index, 1) and not matched(index, 2)  # batch 2's parent is unknown: detached


async def test_undecodable_batches_are_counted_and_skipped(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    publisher, subscriber = await start(ScriptedPublisher())
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    await publisher.publish(0, b"\xc1")
    await publisher.publish(1, stored_batch(0))
    await eventually(lambda: subscriber.tracker.last_applied == 1)
    assert metrics.named("decode_error") == [()] and not metrics.named("gap")
    assert index.applied_hashes == [1000]


async def test_the_topic_filter_keeps_other_engines_out(start: Start, index: RecordingIndex) -> None:
    publisher, subscriber = await start(ScriptedPublisher(topic=b"kv@a@m"), topic="kv@a@")
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    await publisher.publish(0, stored_batch(0), topic=b"kv@b@m")
    await publisher.publish(0, stored_batch(0))
    await eventually(lambda: subscriber.tracker.last_applied == 0)
    assert index.applied_hashes == [1000]


async def test_subscribers_follow_discovery(index: RecordingIndex, metrics: RecordingMetrics) -> None:
    publisher = ScriptedPublisher()
    await publisher.start()
    publisher.keep(0, stored_batch(0))
    subscribers = KVEventSubscribers(sink=index, metrics=metrics, options=FAST)
    try:
        await subscribers.sync([EventSource(ENGINE, publisher.events_url, publisher.replay_url)])
        subscriber = subscribers.get(ENGINE)
        assert subscriber is not None
        await subscriber.wait_synced()
        assert matched(index, 1) and ENGINE in index.endpoints()
        await subscribers.sync([])
        assert subscribers.get(ENGINE) is None and not matched(index, 1)
        # Left discovery: forgotten entirely (not merely cleared), its connection gauge dropped.
        assert index.forgotten == [ENGINE] and index.clears == [] and ENGINE not in index.endpoints()
        assert metrics.named("forget") == [()]
    finally:
        await subscribers.aclose()
        await publisher.aclose()


async def test_an_endpoint_whose_addresses_change_is_cleared_and_followed_anew(index: RecordingIndex) -> None:
    first, second = ScriptedPublisher(), ScriptedPublisher()
    await first.start()
    await second.start()
    first.keep(0, stored_batch(0))
    subscribers = KVEventSubscribers(sink=index, options=FAST)
    try:
        await subscribers.sync([EventSource(ENGINE, first.events_url, first.replay_url)])
        subscriber = subscribers.get(ENGINE)
        assert subscriber is not None
        await subscriber.wait_synced()
        assert matched(index, 1)
        await subscribers.sync([EventSource(ENGINE, second.events_url, second.replay_url)])
        assert index.clears == [ENGINE] and index.forgotten == [] and not matched(index, 1)
        replaced = subscribers.get(ENGINE)
        assert replaced is not None and replaced.source.events_url == second.events_url
    finally:
        await subscribers.aclose()
        await first.aclose()
        await second.aclose()


class FailsOnce(RecordingIndex):
    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def apply(self, endpoint: str, events: Iterable[KVEvent]) -> None:
        if not self.failures:
            self.failures += 1
            raise RuntimeError("a bug in the sink")
        super().apply(endpoint, events)


async def test_a_failing_sink_does_not_end_the_subscription() -> None:
    index = FailsOnce()
    publisher = ScriptedPublisher()
    await publisher.start()
    subscriber = KVEventSubscriber(
        EventSource(ENGINE, publisher.events_url, publisher.replay_url), sink=index, options=FAST
    )
    await subscriber.start()
    try:
        await publisher.wait_subscribed()
        await subscriber.wait_synced()
        await publisher.publish(0, stored_batch(0))
        await publisher.wait_subscribed()  # the session was rebuilt: a new subscription
        await eventually(lambda: subscriber.synced)
        await publisher.publish(1, stored_batch(1))
        await eventually(lambda: subscriber.tracker.last_applied == 1)
    finally:
        await subscriber.aclose()
        await publisher.aclose()
    assert index.failures == 1 and index.applied_hashes == [1001]


async def test_a_burst_of_live_batches_is_applied_in_order_without_gaps(
    start: Start, index: RecordingIndex, metrics: RecordingMetrics
) -> None:
    """Batches sent faster than the subscriber wakes are all applied, in order, none counted missing."""
    publisher, subscriber = await start(ScriptedPublisher())
    await publisher.wait_subscribed()
    await subscriber.wait_synced()
    for seq in range(150):  # sent back to back, before the subscriber wakes
        await publisher.publish(seq, stored_batch(seq))
    await eventually(lambda: subscriber.tracker.last_applied == 149)
    assert index.applied_hashes == [1000 + seq for seq in range(150)]
    assert matched(index, 150) and metrics.named("gap") == [] and metrics.named("lost") == []
