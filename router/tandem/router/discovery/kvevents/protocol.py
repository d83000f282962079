"""The ZMQ side of vLLM's KV-event protocol, as pure functions: frames and sequence numbers.

Live messages (PUB → SUB) are three frames: `topic`, `seq` (uint64 big-endian, +1 per batch, starting
at 0 when the engine starts) and the msgpack payload. A replay request (DEALER → the engine's ROUTER)
is `b""` and the first wanted seq as 8 bytes big-endian; the engine answers one message per buffered
batch with seq >= start, `seq, payload` (vLLM before PR #45177) or `topic, seq, payload` (after it),
then an end marker whose seq is -1 (`0xFFFF_FFFF_FFFF_FFFF`) with an empty payload. Every answer
starts with the empty delimiter frame, which a DEALER sees.

`SequenceTracker` decides what to do with each live seq (apply, drop a duplicate, fill a gap, or
notice that the engine restarted because its seq went backwards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

END_SEQ = (1 << 64) - 1  # -1 as a signed 8-byte big-endian int, read unsigned


class FrameError(ValueError):
    """A message does not have the protocol's shape."""


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def decode_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise FrameError(f"a seq frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def parse_live(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """`(topic, seq, payload)` of a live message."""
    if len(frames) != 3:
        raise FrameError(f"a live message has 3 frames (topic, seq, payload), got {len(frames)}")
    return frames[0], decode_seq(frames[1]), frames[2]


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to ask for every buffered batch from `start_seq` on."""
    return [b"", encode_seq(start_seq)]


def parse_replay(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """`(seq, payload)` of one replayed batch, or None for the end marker. Accepts both reply shapes
    (with or without the topic frame) and the leading empty delimiter."""
    parts = list(frames[1:] if frames and frames[0] == b"" else frames)
    if len(parts) == 3:
        parts = parts[1:]  # drop the topic (vLLM >= PR #45177)
    if len(parts) == 1 and parts[0] == b"":
        return None  # the oldest vLLM end marker: just an empty frame
    if len(parts) != 2:
        raise FrameError(f"a replay reply has (topic,) seq, payload; got {len(frames)} frames")
    seq = decode_seq(parts[0])
    if seq == END_SEQ or not parts[1]:
        return None
    return seq, parts[1]


class Verdict(Enum):
    APPLY = "apply"  # the next seq: apply it
    DUPLICATE = "duplicate"  # already applied (a replay got ahead of the live stream): drop it
    GAP = "gap"  # seqs were missed: replay from `replay_from`, then apply it
    RESTART = "restart"  # seq went backwards: the engine restarted; clear, replay from 0, apply it


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    replay_from: int = 0
    missed: int = 0


class SequenceTracker:
    """Per-subscription sequence state. `last_applied` is the newest batch applied (live or replayed);
    `last_live` the newest seq seen on the live socket, which only grows while the engine lives.

    Example: applied 0..4, live 7 arrives → GAP(replay_from=5, missed=2); a replay brings 5..8 → live
    8 is then a DUPLICATE; after an engine restart live 0 arrives (0 <= 8) → RESTART."""

    def __init__(self) -> None:
        self.last_applied: int | None = None
        self.last_live: int | None = None

    @property
    def next_expected(self) -> int:
        return 0 if self.last_applied is None else self.last_applied + 1

    def on_live(self, seq: int) -> Decision:
        """Classify a live seq (and remember it as the newest live one)."""
        previous_live, self.last_live = self.last_live, seq
        if previous_live is not None and seq <= previous_live:
            self.last_applied = None
            return Decision(Verdict.RESTART, replay_from=0, missed=0)
        if self.last_applied is not None and seq <= self.last_applied:
            return Decision(Verdict.DUPLICATE)
        expected = self.next_expected
        if seq == expected:
            return Decision(Verdict.APPLY)
        return Decision(Verdict.GAP, replay_from=expected, missed=seq - expected)

    def should_apply(self, seq: int) -> bool:
        """True for a batch newer than everything applied (replayed batches are deduplicated so)."""
        return self.last_applied is None or seq > self.last_applied

    def applied(self, seq: int) -> None:
        self.last_applied = seq
