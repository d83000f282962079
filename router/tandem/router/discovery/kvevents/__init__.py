"""Precise prefix state from vLLM KV events (ZMQ), and the `PrefixSource` interface it shares with the
approximate index. See docs/kv-events.md.

- `decode` (pure): msgpack payload → typed events, array and map encodings, int or bytes hashes.
- `index` (pure): `PrecisePrefixIndex`, the dual-key (router key / engine hash) prefix index.
- `protocol` (pure): ZMQ frames and the sequence rules (gaps, duplicates, engine restarts).
- `ports` (typing only): `PrefixSource`, `EventSink`, `KVEventMetrics`, `NoMetrics`.
- `subscriber` (I/O): `KVEventSubscriber` per engine and `KVEventSubscribers` for a discovered set.

This file imports only the interfaces, so importing a pure module never pulls in zmq.
"""

from tandem.router.discovery.kvevents.ports import EventSink, KVEventMetrics, NoMetrics, PrefixSource

__all__ = ["EventSink", "KVEventMetrics", "NoMetrics", "PrefixSource"]
