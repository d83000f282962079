"""Deterministic generation and stop strings (`tandem.sim.engine.generation`, and the engine core's
use of it).

Pure: token streams are functions of their seed; the engine stories step an `EngineCore` in simulated
time with explicit timestamps. Nothing is faked.
"""

from __future__ import annotations

import pytest
from tests.sim.builders import make_core, prompt, request, run_to_completion

from tandem.core.tokenizer import EOS_TOKEN_ID, decode, encode
from tandem.sim.engine.core import EngineCore
from tandem.sim.engine.generation import (
    EOS_PROBABILITY,
    WORDS,
    find_stop,
    sample_token,
    stop_buffer,
    stream_seed,
    visible_length,
)
from tandem.sim.engine.requests import NewRequest

PROMPT = prompt(40)


def tokens_of(seed: int, n: int, *, allow_eos: bool = False) -> list[int]:
    return [sample_token(seed, i, allow_eos=allow_eos) for i in range(n)]


def test_every_word_is_one_token_of_at_most_four_bytes() -> None:
    for word in WORDS:
        assert len(word.encode()) <= 4
        assert len(encode(word)) == 1


def test_generated_text_encodes_back_to_the_generated_ids() -> None:
    ids = tokens_of(stream_seed(PROMPT, temperature=0, seed=None, entropy=0), 200)
    assert encode(decode(ids)) == ids


def test_greedy_text_depends_on_the_prompt_only() -> None:
    a = stream_seed(PROMPT, temperature=0, seed=None, entropy=1)
    b = stream_seed(PROMPT, temperature=0, seed=42, entropy=2)
    other = stream_seed(prompt(40, salt=9), temperature=0, seed=None, entropy=1)
    assert a == b
    assert tokens_of(a, 30) == tokens_of(b, 30)
    assert tokens_of(a, 30) != tokens_of(other, 30)


def test_the_same_seed_gives_the_same_text_and_another_seed_another() -> None:
    one = stream_seed(PROMPT, temperature=0.8, seed=7, entropy=1)
    again = stream_seed(PROMPT, temperature=1.0, seed=7, entropy=2)
    other = stream_seed(PROMPT, temperature=0.8, seed=8, entropy=1)
    assert tokens_of(one, 30) == tokens_of(again, 30)
    assert tokens_of(one, 30) != tokens_of(other, 30)


def test_unseeded_sampling_follows_the_entropy() -> None:
    a = stream_seed(PROMPT, temperature=1.0, seed=None, entropy=1)
    b = stream_seed(PROMPT, temperature=1.0, seed=None, entropy=2)
    assert tokens_of(a, 30) != tokens_of(b, 30)


def test_eos_comes_at_about_the_documented_rate_and_never_when_ignored() -> None:
    seed = stream_seed(PROMPT, temperature=0, seed=None, entropy=0)
    n = 100_000
    drawn = sum(sample_token(seed, i, allow_eos=True) == EOS_TOKEN_ID for i in range(n))
    assert 0.5 * EOS_PROBABILITY * n < drawn < 1.5 * EOS_PROBABILITY * n
    assert EOS_TOKEN_ID not in tokens_of(seed, 20_000, allow_eos=False)


@pytest.mark.parametrize(
    ("text", "stop", "new_chars", "found"),
    [
        pytest.param(" the cat sat", [" cat"], 4, None, id="earlier-text-is-not-searched-again"),
        pytest.param(" the cat", [" cat"], 4, (4, " cat"), id="in-the-new-text"),
        pytest.param(" the cat", ["e c"], 4, (3, "e c"), id="straddling-old-and-new"),
        pytest.param(" a b c", [" c", " b"], 4, (2, " b"), id="earliest-wins"),
        pytest.param(" a b c", ["x", ""], 4, None, id="absent-or-empty"),
    ],
)
def test_stop_strings_are_found_where_new_text_could_complete_them(
    text: str, stop: list[str], new_chars: int, found: tuple[int, str] | None
) -> None:
    assert find_stop(text, stop, new_chars=new_chars) == found


@pytest.mark.parametrize(
    ("stop", "held_back", "visible_while_running"),
    [((), 0, 10), ((" x",), 1, 9), ((" x", "longer"), 5, 5)],
)
def test_streaming_holds_back_what_could_start_a_stop_string(
    stop: tuple[str, ...], held_back: int, visible_while_running: int
) -> None:
    assert stop_buffer(stop) == held_back
    assert visible_length("0123456789", finished=False, held_back=held_back) == visible_while_running
    assert visible_length("0123456789", finished=True, held_back=held_back) == 10


def test_the_engine_cuts_the_text_before_a_stop_string_and_finishes_with_stop() -> None:
    free = run_to_completion(_engine_with(request("r", PROMPT, max_tokens=12)))
    text = free.text("r")
    third_word = text.split(" ")[3]
    stopped = run_to_completion(_engine_with(request("r", PROMPT, max_tokens=12, stop=(third_word,))))
    last = stopped.outputs["r"][-1]
    assert stopped.text("r") == text[: text.index(third_word)]
    assert (last.finish_reason, last.stop_reason) == ("stop", third_word)
    assert last.num_output_tokens == 3


def test_the_engine_finishes_with_length_at_max_tokens() -> None:
    run = run_to_completion(_engine_with(request("r", PROMPT, max_tokens=5)))
    assert [o.finish_reason for o in run.outputs["r"]] == [None, None, None, None, "length"]
    assert len(encode(run.text("r"))) == 5


def test_an_emitted_eos_finishes_with_stop_and_adds_no_text() -> None:
    seed = stream_seed(PROMPT, temperature=0, seed=None, entropy=0)
    first_eos = next(i for i in range(1, 100_000) if sample_token(seed, i, allow_eos=True) == EOS_TOKEN_ID)
    run = run_to_completion(_engine_with(request("r", PROMPT, max_tokens=first_eos + 10, ignore_eos=False)))
    last = run.outputs["r"][-1]
    assert (last.finish_reason, last.token_id, last.text_delta) == ("stop", EOS_TOKEN_ID, "")
    assert last.num_output_tokens == first_eos + 1


def _engine_with(new: NewRequest) -> EngineCore:
    core = make_core()
    core.add_request(new, now=0.0)
    return core
