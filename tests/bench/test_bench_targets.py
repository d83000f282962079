"""Harness targets from the command line: Tandem variants (`--variant NAME=POLICY ARG...`) beside
policies, peers and command peers, and gateway replicas (`--gateway-replicas`) for Tandem's only.

Real: the pure parser of `tandem.bench.targets`. Nothing is faked; nothing is started (the harness
test starts a variant's gateway).
"""

from __future__ import annotations

import pytest

from tandem.bench.targets import (
    Target,
    TargetError,
    parse_starts,
    parse_targets,
    parse_variant,
    with_gateway_replicas,
    with_starts,
)


@pytest.mark.parametrize(
    ("value", "policy", "args"),
    [
        ("fcfs=tandem --fairness=fcfs", "tandem", ("--fairness=fcfs",)),
        ("rr-2= round-robin  --fairness fcfs --lookahead 0.5", "round-robin",
         ("--fairness", "fcfs", "--lookahead", "0.5")),
        ("plain=prefix", "prefix", ()),
        ("w=tandem --tenant-weight 'light=2'", "tandem", ("--tenant-weight", "light=2")),
    ],
)  # fmt: skip
def test_a_variant_is_a_policy_with_gateway_arguments_of_its_own(
    value: str, policy: str, args: tuple[str, ...]
) -> None:
    target = parse_variant(value)
    name = value.partition("=")[0]
    assert target == Target("tandem", policy, name=name, router_args=args)
    assert target.label == name
    assert target.describe() == {"kind": "tandem", "policy": policy, "router_args": list(args), "replicas": 1}


@pytest.mark.parametrize(
    ("variants", "commands", "message"),
    [
        (["tandem --fairness=fcfs"], [], "--variant 'tandem --fairness=fcfs': expected NAME=POLICY"),
        (["a/b=tandem"], [], "--variant 'a/b': NAME must be letters, digits and -_."),
        (["x=nope --fairness=fcfs"], [], "--variant x: the policy is 'nope'; choose from tandem, prefix"),
        (["x="], [], "--variant x: the policy is nothing"),
        (["x=tandem '--fairness"], [], "--variant x: cannot split"),
        (["round-robin=tandem"], [], "--variant round-robin: the label 'round-robin' is taken"),
        (["direct=tandem"], [], "the label 'direct' is taken"),
        (["x=tandem", "x=prefix"], [], "--variant x: the label 'x' is taken"),
        (["x=tandem"], ["x=r {port}"], "--peer-command x: the label 'x' is taken"),
    ],
)  # fmt: skip
def test_a_bad_variant_is_named_in_the_error(variants: list[str], commands: list[str], message: str) -> None:
    with pytest.raises(TargetError) as caught:
        parse_targets(policies=["tandem"], variants=variants, peers=[], commands=commands, direct=True)
    assert message in str(caught.value)


def test_variants_come_after_the_policies_and_the_same_variant_twice_is_one_target() -> None:
    targets = parse_targets(
        policies=["tandem"], variants=["fcfs=tandem --fairness=fcfs", "fcfs=tandem  --fairness=fcfs"],
        peers=["vllm-router:round_robin"], commands=["a=r {port}"], direct=True,
    )  # fmt: skip
    assert [t.label for t in targets] == ["tandem", "fcfs", "vllm-router:round_robin", "a", "direct"]
    assert targets[0].router_args == ()
    assert targets[0].describe() == {"kind": "tandem", "policy": "tandem", "replicas": 1}


def test_gateway_replicas_apply_to_tandem_targets_only_and_are_recorded_in_their_description() -> None:
    targets = parse_targets(
        policies=["tandem"], variants=["fcfs=tandem --fairness=fcfs"], peers=["vllm-router:round_robin"],
        commands=["a=r {port}"], direct=True,
    )  # fmt: skip
    replicated = with_gateway_replicas(targets, 2)
    assert [(t.label, t.replicas) for t in replicated] == [
        ("tandem", 2), ("fcfs", 2), ("vllm-router:round_robin", 1), ("a", 1), ("direct", 1),
    ]  # fmt: skip
    assert [t.describe().get("replicas") for t in replicated] == [2, 2, 1, 1, None], "direct has no gateway"
    assert replicated[1].describe() == {
        "kind": "tandem", "policy": "tandem", "router_args": ["--fairness=fcfs"], "replicas": 2,
    }  # fmt: skip
    assert with_gateway_replicas(targets, 1) == targets


def test_each_start_is_a_target_of_its_own_and_direct_runs_cold_only() -> None:
    targets = parse_targets(policies=["tandem"], peers=["vllm-router:cache_aware"], direct=True)
    starts = parse_starts(["cold,restarted", "warm", "cold"])
    assert starts == ["cold", "restarted", "warm"]
    expanded = with_starts(targets, starts)
    assert [t.label for t in expanded] == [
        "tandem", "tandem@restarted", "tandem@warm",
        "vllm-router:cache_aware", "vllm-router:cache_aware@restarted", "vllm-router:cache_aware@warm",
        "direct",
    ]  # fmt: skip
    assert expanded[1].describe() == {
        "kind": "tandem",
        "policy": "tandem",
        "replicas": 1,
        "start": "restarted",
    }
    assert expanded[0].describe() == {"kind": "tandem", "policy": "tandem", "replicas": 1}
    assert parse_starts([]) == ["cold"]
    with pytest.raises(TargetError, match="--start 'hot': choose from cold, restarted, warm"):
        parse_starts(["cold,hot"])
