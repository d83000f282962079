"""The one rule for a pool's engine settings over the shared ones (`tandem.core.poolengine`).

Pure tables; nothing is faked.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.core.poolengine import PoolName, merged_env, pool_engine_args, pool_engine_env
from tandem.core.spec import EnvVar, InferenceServiceSpec


def spec_of(**sections: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({"model": {"name": "m"}, **sections})


@pytest.mark.parametrize(
    ("sections", "pool", "args"),
    [
        ({}, "decode", []),
        ({"engine": {"args": ["--a"]}}, "prefill", ["--a"]),
        (
            {
                "engine": {"args": ["--max-num-seqs", "128"]},
                "decode": {"engine": {"args": ["--max-num-seqs", "256"]}},
            },
            "decode",
            ["--max-num-seqs", "128", "--max-num-seqs", "256"],  # the last one wins in the engine's parser
        ),
        (
            {"engine": {"args": ["--a"]}, "decode": {"engine": {"args": ["--max-num-seqs", "256"]}}},
            "prefill",
            ["--a"],  # decode's settings stay on decode
        ),
        (
            {"prefill": {"engine": {"args": ["--max-num-batched-tokens", "16384"]}}},
            "prefill",
            ["--max-num-batched-tokens", "16384"],
        ),
    ],
)
def test_a_pools_args_follow_the_shared_ones(
    sections: dict[str, Any], pool: PoolName, args: list[str]
) -> None:
    assert pool_engine_args(spec_of(**sections), pool) == args


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


@pytest.mark.parametrize(
    ("sections", "pool", "expected"),
    [
        ({"engine": {"env": env(A="1", B="2")}}, "decode", {"A": "1", "B": "2"}),
        (
            {"engine": {"env": env(A="1", B="2")}, "decode": {"engine": {"env": env(B="3", C="4")}}},
            "decode",
            {"A": "1", "B": "3", "C": "4"},
        ),
        ({"engine": {"env": env(A="1")}, "decode": {"engine": {"env": env(A="9")}}}, "prefill", {"A": "1"}),
    ],
)
def test_a_pools_env_wins_by_name_over_the_shared_env(
    sections: dict[str, Any], pool: PoolName, expected: dict[str, str]
) -> None:
    merged = pool_engine_env(spec_of(**sections), pool)
    assert merged == expected and list(merged) == list(expected)


def test_a_later_layer_wins_and_names_keep_their_first_place() -> None:
    layers = ([EnvVar(name="A", value="1"), EnvVar(name="B", value="2")], [EnvVar(name="A", value="3")])
    assert list(merged_env(*layers).items()) == [("A", "3"), ("B", "2")]
