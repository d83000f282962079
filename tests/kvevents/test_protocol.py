"""vLLM's KV-event framing and the sequence rules (`tandem.router.discovery.kvevents.protocol`).

Pure: frames are byte lists as pyzmq delivers them; the tracker is driven by sequence numbers.
Nothing is faked.
"""

from __future__ import annotations

import pytest

from tandem.router.discovery.kvevents.protocol import (
    END_SEQ,
    FrameError,
    SequenceTracker,
    Verdict,
    decode_seq,
    encode_seq,
    parse_live,
    parse_replay,
    replay_request,
)

MINUS_ONE = (-1).to_bytes(8, "big", signed=True)  # vLLM's ZmqEventPublisher.END_SEQ


def test_seq_frames_are_8_byte_big_endian() -> None:
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    assert decode_seq(encode_seq(2**40 + 5)) == 2**40 + 5
    assert decode_seq(MINUS_ONE) == END_SEQ
    with pytest.raises(FrameError):
        decode_seq(b"\x01")


def test_live_messages_are_topic_seq_payload() -> None:
    assert parse_live([b"kv@pod@m", encode_seq(3), b"x"]) == (b"kv@pod@m", 3, b"x")
    with pytest.raises(FrameError, match="3 frames"):
        parse_live([encode_seq(3), b"x"])


@pytest.mark.parametrize(
    ("frames", "parsed"),
    [
        pytest.param([b"", encode_seq(4), b"p"], (4, b"p"), id="vllm-seq-payload"),
        pytest.param([b"", b"kv", encode_seq(4), b"p"], (4, b"p"), id="vllm-45177-with-topic"),
        pytest.param([encode_seq(4), b"p"], (4, b"p"), id="req-socket-strips-the-delimiter"),
        pytest.param([b"", MINUS_ONE, b""], None, id="end-marker"),
        pytest.param([b"", b"kv", MINUS_ONE, b""], None, id="end-marker-with-topic"),
        pytest.param([b"", b""], None, id="oldest-end-marker"),
    ],
)
def test_replay_replies_in_every_vllm_shape(frames: list[bytes], parsed: tuple[int, bytes] | None) -> None:
    assert parse_replay(frames) == parsed


def test_a_replay_request_is_the_delimiter_and_the_start_seq() -> None:
    assert replay_request(7) == [b"", encode_seq(7)]
    with pytest.raises(FrameError):
        parse_replay([b"", b"a", b"b", b"c", b"d"])


@pytest.mark.parametrize(
    ("applied", "live", "seq", "verdict", "replay_from", "missed"),
    [
        pytest.param(None, None, 0, Verdict.APPLY, 0, 0, id="first-ever-is-zero"),
        pytest.param(None, None, 5, Verdict.GAP, 0, 5, id="first-ever-is-late"),
        pytest.param(4, 4, 5, Verdict.APPLY, 0, 0, id="next"),
        pytest.param(4, 4, 7, Verdict.GAP, 5, 2, id="gap"),
        pytest.param(8, 6, 7, Verdict.DUPLICATE, 0, 0, id="replay-got-ahead"),
        pytest.param(8, 8, 0, Verdict.RESTART, 0, 0, id="engine-restarted"),
        pytest.param(8, 8, 8, Verdict.RESTART, 0, 0, id="same-live-seq-again"),
    ],
)
def test_what_a_live_seq_means(
    applied: int | None, live: int | None, seq: int, verdict: Verdict, replay_from: int, missed: int
) -> None:
    tracker = SequenceTracker()
    tracker.last_applied, tracker.last_live = applied, live
    decision = tracker.on_live(seq)
    assert (decision.verdict, decision.replay_from, decision.missed) == (verdict, replay_from, missed)
    assert tracker.last_live == seq


def test_a_restart_forgets_what_was_applied_and_replayed_batches_are_deduplicated() -> None:
    tracker = SequenceTracker()
    for seq in range(3):
        tracker.applied(seq)
    assert tracker.next_expected == 3
    assert not tracker.should_apply(2) and tracker.should_apply(3)
    tracker.last_live = 2
    tracker.on_live(0)
    assert tracker.last_applied is None and tracker.next_expected == 0 and tracker.should_apply(0)
