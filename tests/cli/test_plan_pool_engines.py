"""`tandem up`'s plan applies each pool's engine settings as the operator renders them, and names what
it cannot apply locally.

Pure: the local plan (`tandem.local.plan`), the real-vLLM command line (`tandem.local.vllm_engine`) and
the operator's container builders (`tandem.operator.resources`) on the same spec; ports are a counter.
The real `tandem up` of such a spec is tests/cli/test_up_pool_engines.py; here, `tandem up` runs in a
subprocess only to refuse a spec before starting anything.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.servers import free_port

from tandem.cli.up import SIM_FLAGS
from tandem.core.specrules import parse_inference_service
from tandem.local.plan import (
    LocalPlan,
    PlanError,
    build_plan,
    local_notes,
    local_preflight,
    not_applied_line,
    not_applied_locally,
)
from tandem.local.vllm_engine import engine_command
from tandem.operator.resources import Images, Owner, Role, desired_children

POOLS: dict[str, Any] = {
    "engine": {"kind": "sim", "args": ["--max-num-seqs", "64"], "env": [{"name": "SHARED", "value": "1"}]},
    "prefill": {
        "engine": {
            "args": ["--max-num-batched-tokens", "1024"],
            "env": [{"name": "SHARED", "value": "p"}, {"name": "ONLY_PREFILL", "value": "yes"}],
        }
    },
    "decode": {"engine": {"args": ["--max-num-seqs", "8"], "env": [{"name": "ONLY_DECODE", "value": "yes"}]}},
}


def isvc_of(spec: dict[str, Any]) -> Any:
    doc = {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "demo"},
        "spec": {"model": {"name": "m/7b", "servedName": "m"}, **spec},
    }
    return parse_inference_service(doc)


def plan_for(spec: dict[str, Any]) -> LocalPlan:
    return build_plan(
        isvc_of(spec), ports=itertools.count(9000), router_port=8080, python="/py",
        redis_server="/usr/bin/redis-server", state_dir=Path("/state"),
    )  # fmt: skip


def test_each_simulated_pool_gets_the_shared_args_then_its_own_and_its_env_over_the_shared() -> None:
    by_name = {p.name: p for p in plan_for(POOLS).processes}
    prefill, decode = by_name["prefill-0"], by_name["decode-0"]
    assert prefill.argv[-4:] == ("--max-num-seqs", "64", "--max-num-batched-tokens", "1024")
    assert decode.argv[-4:] == ("--max-num-seqs", "64", "--max-num-seqs", "8")
    assert "--max-num-batched-tokens" not in decode.argv
    assert (prefill.env["SHARED"], prefill.env["ONLY_PREFILL"]) == ("p", "yes")
    assert (decode.env["SHARED"], decode.env["ONLY_DECODE"]) == ("1", "yes")
    assert "ONLY_DECODE" not in prefill.env and "ONLY_PREFILL" not in decode.env


def test_an_engine_started_later_by_the_autoscaler_gets_its_pools_settings_too() -> None:
    plan = plan_for({**POOLS, "decode": {**POOLS["decode"], "autoscaling": {"enabled": True}}})
    assert plan.new_engine is not None
    later = plan.new_engine("decode", 5, 9100)
    assert later.argv[-2:] == ("--max-num-seqs", "8") and later.env["ONLY_DECODE"] == "yes"


def test_the_local_engines_user_args_and_env_are_the_operators_for_the_same_spec() -> None:
    isvc = isvc_of(POOLS)
    owner = Owner(name="demo", namespace="ns1", uid="u1")
    children = desired_children(isvc.spec, owner=owner, images=Images(tandem="tandem:1", redis="redis:7"))
    rendered = {
        c.manifest["metadata"]["name"]: c.manifest for c in children if c.manifest["kind"] == "Deployment"
    }
    by_name = {p.name: p for p in plan_for(POOLS).processes}
    keys = {"SHARED", "ONLY_PREFILL", "ONLY_DECODE"}
    for role, process in ((Role.PREFILL, by_name["prefill-0"]), (Role.DECODE, by_name["decode-0"])):
        pod = rendered[f"demo-{role.value}"]["spec"]["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "engine"]
        told = len(POOLS["engine"]["args"]) + len(POOLS[role.value]["engine"]["args"])
        assert tuple(container["args"][-told:]) == process.argv[-told:]
        in_cluster = {e["name"]: e.get("value") for e in container["env"] if e["name"] in keys}
        assert in_cluster == {k: v for k, v in process.env.items() if k in keys}


def test_a_real_vllm_engine_gets_its_pools_settings_and_its_max_model_len_replaces_the_default() -> None:
    spec = {
        **POOLS,
        "engine": {**POOLS["engine"], "kind": "vllm"},
        "decode": {
            "engine": {"args": ["--max-model-len", "4096"], "env": [{"name": "ONLY_DECODE", "value": "yes"}]}
        },
    }
    isvc = isvc_of(spec)
    pool_url = "redis://127.0.0.1:9000"
    prefill_argv, prefill_env = engine_command(
        isvc, role="prefill", ordinal=0, port=9001, python="/py", pool_url=pool_url, cpus=2
    )
    decode_argv, decode_env = engine_command(
        isvc, role="decode", ordinal=1, port=9002, python="/py", pool_url=pool_url, cpus=2
    )
    assert prefill_argv[-4:] == ("--max-num-seqs", "64", "--max-num-batched-tokens", "1024")
    assert prefill_argv[prefill_argv.index("--max-model-len") + 1] == "2048"  # the local default
    assert decode_argv[-4:] == ("--max-num-seqs", "64", "--max-model-len", "4096")
    assert decode_argv.count("--max-model-len") == 1  # decode's own, no default before it
    assert (prefill_env["SHARED"], prefill_env["ONLY_PREFILL"]) == ("p", "yes")
    assert decode_env["ONLY_DECODE"] == "yes" and decode_env["SHARED"] == "1"


TEMPLATE = {"spec": {"nodeSelector": {"gpu": "h20"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}}


@pytest.mark.parametrize(
    ("spec", "gaps"),
    [
        (POOLS, []),  # per-pool args and env are applied: nothing to say
        (
            {"engine": {"kind": "sim", "template": TEMPLATE}, "decode": {"template": TEMPLATE}},
            [("pod templates", "spec.engine.template"), ("pod templates", "spec.decode.template")],
        ),
        (
            {"engine": {"kind": "sim", "image": "vllm:a"}, "prefill": {"engine": {"image": "vllm:b"}}},
            [("images", "spec.engine.image"), ("images", "spec.prefill.engine.image")],
        ),
        (
            {"router": {"template": TEMPLATE}, "kvPool": {"redis": {"template": TEMPLATE}}},
            [("pod templates", "spec.router.template"), ("pod templates", "spec.kvPool.redis.template")],
        ),
        (
            {"engine": {"kind": "vllm"}, "decode": {"nodesPerReplica": 2}},
            [("multi-node engines (one process each here)", "spec.decode.nodesPerReplica")],
        ),
    ],
)
def test_what_a_local_run_cannot_apply_is_named_by_its_field(
    spec: dict[str, Any], gaps: list[tuple[str, str]]
) -> None:
    assert not_applied_locally(isvc_of(spec)) == gaps


def test_it_is_said_in_one_warning_line_before_the_stack_starts() -> None:
    spec = {
        "engine": {"kind": "sim", "template": TEMPLATE},
        "decode": {"template": TEMPLATE, "engine": {"image": "vllm:b"}},
    }
    (line,) = local_notes(isvc_of(spec))
    assert line == (
        "warning: InferenceService demo: not applied locally (processes here, not pods): "
        "pod templates spec.engine.template, spec.decode.template; images spec.decode.engine.image"
    )
    assert not_applied_line("demo", []) is None
    assert local_notes(isvc_of(POOLS)) == []


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (POOLS, None),
        ({**POOLS, "decode": {"engine": {"args": ["--max-num-seqs=8"]}}}, None),  # flag=value
        (
            {"engine": {"kind": "sim", "args": ["--max-num-seqs", "8", "--trust-remote-code"]}},
            "spec.engine.args[2]: --trust-remote-code",
        ),
        (
            {"engine": {"kind": "sim"}, "decode": {"engine": {"args": ["--enable-expert-parallel"]}}},
            "spec.decode.engine.args[0]: --enable-expert-parallel",
        ),
        # Real vLLM takes its own flags: nothing is checked against the simulator's.
        ({"engine": {"kind": "vllm", "args": ["--trust-remote-code"]}}, None),
    ],
)
def test_a_simulated_engine_flag_the_simulator_lacks_is_refused_before_anything_starts(
    spec: dict[str, Any], problem: str | None
) -> None:
    isvc = isvc_of(spec)
    if problem is None:
        assert local_preflight(isvc, sim_flags=SIM_FLAGS) == local_notes(isvc)
        return
    with pytest.raises(PlanError) as refused:
        local_preflight(isvc, sim_flags=SIM_FLAGS)
    assert str(refused.value) == (
        f"InferenceService demo: {problem} is not a flag of tandem sim (engine.kind sim runs the "
        "simulator): drop it for a local run, or use --engine vllm"
    )


def test_tandem_up_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    """The seed's DeepSeek-V3 example (vLLM flags) run with simulated engines: nothing starts."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "deepseek-v3-pd.yaml"
    state_dir = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "up", "--engine", "sim", "-f", str(example),
         "--port", str(free_port()), "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "tandem: error: InferenceService deepseek-v3: spec.engine.args[0]: --trust-remote-code is not a flag "
        "of tandem sim (engine.kind sim runs the simulator): drop it for a local run, or use --engine vllm"
    ]
    assert not state_dir.exists()
