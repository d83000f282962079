"""The pure parts of pre-emption: whom to stop, which answers can be continued, the text they
carried, the body that continues them and the usage the client is told."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from tandem.router.admission.fairness.vtc import VTCQueue
from tandem.router.admission.preemption import victim
from tandem.router.types import Route
from tandem.router.upstream.continuation import (
    _NOT_PLAIN,
    KEEP_BYTES,
    Generated,
    Kept,
    continuable,
    continuation_body,
    generated,
    shift_usage,
)


def grant(tenant: str, tokens: int = 0, *, priority: int = 0, preemptible: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        tenant=tenant, priority=priority, completion_tokens=tokens, preemptible=preemptible
    )


def equal(_: str) -> float:
    return 1.0


# -- whom to stop ------------------------------------------------------------------------------


def only_this(_: str) -> int:
    return 1  # the newcomer is its tenant's only waiting request


def test_the_youngest_stream_of_the_tenant_furthest_over_its_share_is_stopped() -> None:
    running = [grant("a", 30), grant("a", 5), grant("a", 12), grant("b", 1), grant("b", 2), grant("c", 40)]
    chosen = victim(running, tenant="new", priority=0, capacity=6, weight=equal, waiting=only_this)
    assert chosen is running[1]  # shares 1.5: a holds 3, b 2 (not a whole slot over), c 1


def test_a_tenant_already_at_its_share_or_with_a_backlog_waits_its_turn() -> None:
    running = [grant("heavy", 5)] * 4 + [grant("light", 50)] * 4  # shares 4 and 4
    assert victim(running, tenant="light", priority=0, capacity=8, weight=equal, waiting=only_this) is None
    running = [grant("heavy", 5)] * 7 + [grant("light", 50)]
    chosen = victim(running, tenant="light", priority=0, capacity=8, weight=equal, waiting=only_this)
    assert chosen is not None and chosen.tenant == "heavy"  # light would hold 2 of its 4
    backlog = victim(running, tenant="light", priority=0, capacity=8, weight=equal, waiting=lambda t: 3)
    assert backlog is None  # VTC orders a backlogged tenant's requests: no pre-emption


def test_nobody_is_stopped_when_no_tenant_holds_a_slot_more_than_its_share() -> None:
    running = [grant("a"), grant("b"), grant("c")]  # with the newcomer, shares of 3/4 each
    assert victim(running, tenant="d", priority=0, capacity=3, weight=equal, waiting=only_this) is None


def test_weights_set_the_shares() -> None:
    running = [grant("heavy")] * 5 + [grant("b")] * 3  # 8 slots; with the newcomer, shares 8/3 each
    weights = {"heavy": 1.0}

    def weight(t: str) -> float:
        return weights.get(t, 1.0)

    chosen = victim(running, tenant="new", priority=0, capacity=8, weight=weight, waiting=only_this)
    assert chosen is not None and chosen.tenant == "heavy"
    weights["heavy"] = 4.0  # shares 5.33 / 1.33 / 1.33: heavy is within its share, b is a slot over
    chosen = victim(running, tenant="new", priority=0, capacity=8, weight=weight, waiting=only_this)
    assert chosen is not None and chosen.tenant == "b"


def test_a_higher_band_and_a_stream_that_cannot_be_continued_are_never_stopped() -> None:
    def pick(running: list[SimpleNamespace], priority: int) -> SimpleNamespace | None:
        return victim(running, tenant="b", priority=priority, capacity=4, weight=equal, waiting=only_this)

    assert pick([grant("a", priority=1)] * 4, 0) is None
    assert pick([grant("a", preemptible=False)] * 4, 0) is None
    assert pick([grant("a", priority=0)] * 4, 1) is not None


# -- the queue ---------------------------------------------------------------------------------


def test_a_continuation_waits_at_the_front_of_its_tenants_requests_even_in_a_full_queue() -> None:
    queue: VTCQueue[str] = VTCQueue(max_size=2)
    queue.push("heavy-1", tenant="heavy", prompt_tokens=10)
    queue.push("heavy-2", tenant="heavy", prompt_tokens=10)
    queue.push("heavy-continued", tenant="heavy", prompt_tokens=0, front=True)
    popped = [queue.pop() for _ in range(3)]
    assert [t.item for t in popped if t is not None] == ["heavy-continued", "heavy-1", "heavy-2"]


def test_take_dispatches_one_ticket_out_of_turn_and_charges_its_prompt() -> None:
    queue: VTCQueue[str] = VTCQueue()
    queue.push("a", tenant="a", prompt_tokens=10)
    late = queue.push("b", tenant="b", prompt_tokens=30)
    queue.take(late)
    assert len(queue) == 1 and queue.counter("b") == 30
    queue.take(late)  # idempotent
    assert queue.counter("b") == 30


# -- which answers can be continued --------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "expected"),
    [
        (Route.CHAT, {"stream": True, "messages": [{"role": "user", "content": "x"}]}, True),
        (Route.COMPLETIONS, {"stream": True, "prompt": "x"}, True),
        (Route.COMPLETIONS, {"stream": True, "prompt": ["x"]}, True),
        (Route.CHAT, {"messages": [{"role": "user", "content": "x"}]}, False),  # not a stream
        (Route.COMPLETIONS, {"stream": True, "prompt": [1, 2, 3]}, False),  # token ids
        (Route.COMPLETIONS, {"stream": True, "prompt": "x", "echo": True}, False),
        (Route.COMPLETIONS, {"stream": True, "prompt": "x", "n": 2}, False),
        (
            Route.CHAT,
            {"stream": True, "messages": [{"role": "user"}], "tools": [{"type": "function"}]},
            False,
        ),
        (Route.CHAT, {"stream": True, "messages": [{"role": "user"}], "logprobs": True}, False),
        (
            Route.CHAT,
            {"stream": True, "messages": [{"role": "user"}], "response_format": {"type": "json"}},
            False,
        ),
        (Route.CHAT, {"stream": True, "messages": [{"role": "user"}], "continue_final_message": True}, False),
        (Route.CHAT, {"stream": True, "messages": [{"role": "user"}], "add_generation_prompt": False}, False),
    ],
)
def test_only_plain_text_streams_of_one_choice_can_be_continued(
    route: Route, body: dict[str, object], expected: bool
) -> None:
    assert continuable(route, body) is expected


# -- the text so far -----------------------------------------------------------------------------


def chat_event(content: str | None, finish: str | None = None, **delta: object) -> bytes:
    choice = {"index": 0, "delta": {"content": content, **delta}, "finish_reason": finish}
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def test_the_text_so_far_is_the_whole_events_content_and_a_cut_event_is_left_out() -> None:
    raw = (
        chat_event("", role="assistant")
        + chat_event(" Hello")
        + chat_event(" world")
        + chat_event(" agai")[:-5]
    )
    assert generated(raw, chat=True) == Generated(" Hello world", finished=False)


def test_an_answer_that_had_finished_is_seen_as_finished() -> None:
    done = generated(chat_event(" a") + chat_event("", finish="length"), chat=True)
    assert done is not None and done.finished and done.text == " a"
    done = generated(b'data: {"choices":[{"index":0,"text":" a"}]}\n\ndata: [DONE]\n\n', chat=False)
    assert done is not None and done.finished


def test_tool_calls_reasoning_and_other_choices_cannot_be_continued() -> None:
    assert generated(chat_event(None, tool_calls=[{"index": 0}]), chat=True) is None
    assert generated(chat_event(None, reasoning_content="hmm"), chat=True) is None
    other = b'data: {"choices":[{"index":1,"text":" x"}]}\n\n'
    assert generated(other, chat=False) is None


# -- the continuation's body ---------------------------------------------------------------------


def test_a_chat_continues_its_last_assistant_message_with_the_limits_less_what_was_generated() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Q"}],
        "max_completion_tokens": 10,
        "min_tokens": 4,
        "stream": True,
    }
    out = continuation_body(Route.CHAT, body, " Hello world", 6)
    assert out["messages"] == [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": " Hello world"},
    ]
    assert out["add_generation_prompt"] is False and out["continue_final_message"] is True
    assert out["max_completion_tokens"] == 4 and out["min_tokens"] == 0
    assert body["messages"] == [{"role": "user", "content": "Q"}]  # the original is left alone


def test_a_completion_continues_after_its_prompt_and_never_asks_for_zero_tokens() -> None:
    out = continuation_body(Route.COMPLETIONS, {"prompt": ["Once"], "max_tokens": 3}, " upon a", 3)
    assert out == {"prompt": "Once upon a", "max_tokens": 1}


# -- the usage the client is told ----------------------------------------------------------------


def test_usage_is_told_as_the_whole_answers_and_other_events_pass_untouched() -> None:
    content = chat_event(" x")
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}\n\n'
    out = shift_usage(content + usage, 7)
    assert out.startswith(content)
    told = orjson.loads(out[len(content) + 6 : -2])["usage"]
    assert told == {"prompt_tokens": 13, "completion_tokens": 12, "total_tokens": 25}
    assert shift_usage(content, 7) is content


def test_escaped_text_is_read_back_exactly() -> None:
    pieces = [' say "hi"', "\n\tnext line", " caf\u00e9 \u2603 \U0001f600", " back\\slash", ' "content":"x"']
    raw = b"".join(chat_event(p) for p in pieces)
    assert generated(raw, chat=True) == Generated("".join(pieces), finished=False)


def test_a_long_answer_is_kept_as_its_text() -> None:
    kept = Kept(chat=True)
    pieces = [f" token{i} with some padding to make the event longer" for i in range(2_000)]
    for piece in pieces:
        kept.add(chat_event(piece))
    kept.add(chat_event("", finish="length"))
    assert kept.result() == Generated("".join(pieces), finished=True)
    assert sum(len(chat_event(p)) for p in pieces) > KEEP_BYTES  # it was reduced on the way


def test_a_stream_that_turns_out_not_to_be_plain_text_is_not_continuable() -> None:
    told: list[str] = []
    kept = Kept(chat=True, on_unplain=lambda: told.append("withdrawn"))
    kept.add(chat_event(" a"))
    assert kept.plain and not told
    kept.add(chat_event(None, reasoning_content="hmm"))  # a reasoning model sends it unasked
    assert told == ["withdrawn"]  # at once, not when the text is next reduced
    kept.add(chat_event(None, tool_calls=[{"index": 0}]))
    kept.add(chat_event(" b"))
    assert kept.result() is None and not kept.plain and told == ["withdrawn"]


@pytest.mark.parametrize("marker", _NOT_PLAIN)
def test_every_marker_of_what_is_not_plain_text_withdraws_a_kept_stream_at_once(marker: bytes) -> None:
    told: list[str] = []
    kept = Kept(chat=True, on_unplain=lambda: told.append("withdrawn"))
    kept.add(chat_event(" a"))
    kept.add(b'data: {"choices":[{"index":0,"delta":{' + marker + b"...}}]}\n\n")
    assert told == ["withdrawn"] and not kept.plain


def test_spaced_json_from_another_engine_is_read_too() -> None:
    spaced = b'data: {"choices": [{"index": 0, "delta": {"content": " a \\"b\\""}, "finish_reason": null}]}'
    end = b'data: {"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]}\n\n'
    raw = spaced + b"\n\n" + chat_event(" c") + end
    assert generated(raw, chat=True) == Generated(' a "b" c', finished=True)
