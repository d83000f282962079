"""What a harness run measures (pure): Tandem's gateway with a policy, a peer router, or one engine.

- `tandem` + policy (a value of `tandem.core.spec.ROUTING_POLICIES`): `tandem router` with
  `spec.router.policy` set to it; the run's label is the policy (`round-robin`). A **variant**
  (`--variant NAME=POLICY ARG...`) is the same with extra `tandem router` arguments of its own
  (after `--router-arg`s, so they win), labelled NAME: `--variant 'fcfs=tandem --fairness=fcfs'`.
- `vllm-router` + policy: the Rust vLLM router (PyPI `vllm-router`, 0.1.17 was used) with
  `--policy` (`round_robin`, `cache_aware`, ...); label `vllm-router:cache_aware`.
- `command`: any router the user has, started from a command line template
  (`tandem.bench.command_peer`); label its NAME.
- `direct`: no router; the workload goes straight to one engine; label `direct`.

Tandem targets may run as `replicas` gateway processes in front of the same engines
(`--gateway-replicas N`, `with_gateway_replicas`); peers and command peers are one process each.

Every target with a gateway may also be measured from another **start** (`--start`, `with_starts`):
`cold` (engines and gateway just started, the default), `restarted` (a warm-up through the gateway,
then a fresh gateway in front of the warm engines, as after a rollout or a new replica) or `warm`
(the same warm-up, the same gateway). The label then ends in `@restarted` or `@warm`.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from tandem.bench.command_peer import NAME, PeerCommand, PeerCommandError, parse_peer_command
from tandem.core.spec import ROUTING_POLICIES

TargetKind = Literal["tandem", "vllm-router", "command", "direct"]
Start = Literal["cold", "restarted", "warm"]
STARTS: tuple[Start, ...] = ("cold", "restarted", "warm")
VLLM_ROUTER = "vllm-router"
#: vllm-router policies that work with plain OpenAI engines (kv_aware needs ZMQ KV events).
VLLM_ROUTER_POLICIES = ("round_robin", "cache_aware", "random", "power_of_two", "consistent_hash")
VLLM_ROUTER_INSTALL = "pip install 'vllm-router==0.1.17' (or the tandem[bench] extra)"


class TargetError(ValueError):
    """A `--policy`/`--peer`/`--peer-command` value that names nothing we can run."""


@dataclass(frozen=True)
class Target:
    """What one run measures; `policy` for `tandem` and `vllm-router`, `peer` for `command`; a
    `tandem` variant's `name` and extra gateway arguments `router_args`; `replicas`: the gateway
    processes the harness starts for it (more than 1 only for `tandem`); `start`: the state the run
    begins from (module docstring)."""

    kind: TargetKind
    policy: str | None = None
    peer: PeerCommand | None = None
    name: str | None = None
    router_args: tuple[str, ...] = ()
    replicas: int = 1
    start: Start = "cold"

    @property
    def label(self) -> str:
        return self._base_label if self.start == "cold" else f"{self._base_label}@{self.start}"

    @property
    def _base_label(self) -> str:
        if self.kind == "tandem":
            return self.name or str(self.policy)
        if self.kind == "vllm-router":
            return f"{VLLM_ROUTER}:{self.policy}"
        if self.kind == "command" and self.peer is not None:
            return self.peer.name
        return "direct"

    def describe(self) -> dict[str, str | int | list[str] | None]:
        """bench.json's `target`: kind, policy, a command peer's command, a variant's arguments, the
        gateway processes (`replicas`; none for `direct`) and, when not cold, the `start`."""
        described: dict[str, str | int | list[str] | None]
        if self.peer is not None:
            described = {"kind": self.kind, "policy": None, "command": self.peer.template}
        elif self.name is not None:
            described = {"kind": self.kind, "policy": self.policy, "router_args": list(self.router_args)}
        else:
            described = {"kind": self.kind, "policy": self.policy}
        if self.kind != "direct":
            described["replicas"] = self.replicas
        if self.start != "cold":
            described["start"] = self.start
        return described


def parse_targets(
    *,
    policies: Sequence[str],
    peers: Sequence[str],
    commands: Sequence[str] = (),
    direct: bool,
    variants: Sequence[str] = (),
) -> list[Target]:
    """`--policy a,b` (repeatable), `--variant NAME=POLICY ARG...` (repeatable), `--peer vllm-router:P`
    (repeatable), `--peer-command NAME=TEMPLATE` (repeatable) and `--direct` → targets in that order,
    without duplicates. Raises TargetError naming the bad value and the choices, or a NAME that
    another target's label (or any policy's, or `direct`) already is."""
    targets: list[Target] = []
    for value in (p.strip() for item in policies for p in item.split(",") if p.strip()):
        if value not in ROUTING_POLICIES:
            raise TargetError(f"--policy {value!r}: choose from {', '.join(ROUTING_POLICIES)}")
        targets.append(Target("tandem", value))
    targets += _variant_targets(variants, taken=[t.label for t in targets])
    for peer in peers:
        name, _, policy = peer.partition(":")
        if name != VLLM_ROUTER:
            raise TargetError(
                f"--peer {peer!r}: the only peer is {VLLM_ROUTER}:<policy> (any other: --peer-command)"
            )
        policy = policy or "cache_aware"
        if policy not in VLLM_ROUTER_POLICIES:
            raise TargetError(f"--peer {peer!r}: policy must be one of {', '.join(VLLM_ROUTER_POLICIES)}")
        targets.append(Target("vllm-router", policy))
    targets += _command_targets(commands, taken=[t.label for t in targets])
    if direct:
        targets.append(Target("direct"))
    return list(dict.fromkeys(targets))


def with_gateway_replicas(targets: Sequence[Target], replicas: int) -> list[Target]:
    """The targets with every Tandem target running `replicas` gateway processes (pure); peers,
    command peers and `direct` are unchanged (one process, or none)."""
    return [replace(t, replicas=replicas) if t.kind == "tandem" else t for t in targets]


def parse_starts(values: Sequence[str]) -> list[Start]:
    """`--start cold,restarted` (repeatable) → the starts in order, without duplicates; none given →
    `["cold"]`. Raises TargetError naming a value that is not one of `STARTS`."""
    starts: list[Start] = []
    for value in (v.strip() for item in values for v in item.split(",") if v.strip()):
        match = next((s for s in STARTS if s == value), None)
        if match is None:
            raise TargetError(f"--start {value!r}: choose from {', '.join(STARTS)}")
        starts.append(match)
    return list(dict.fromkeys(starts)) or ["cold"]


def with_starts(targets: Sequence[Target], starts: Sequence[Start]) -> list[Target]:
    """Every target once per start, target after target (pure); `direct` has no gateway to restart
    and runs cold only. Example: [tandem, vllm-router:cache_aware] × [cold, restarted] → tandem,
    tandem@restarted, vllm-router:cache_aware, vllm-router:cache_aware@restarted."""
    cold: list[Start] = ["cold"]
    return [replace(t, start=start) for t in targets for start in (starts if t.kind != "direct" else cold)]


def parse_variant(value: str) -> Target:
    """`NAME=POLICY ARG...` → a `tandem` target labelled NAME with extra `tandem router` arguments,
    split as a shell would. Example: `fcfs=tandem --fairness=fcfs` → policy `tandem`, router_args
    `("--fairness=fcfs",)`. Raises TargetError for a missing `NAME=`, a bad NAME (as `--peer-command`'s),
    an unsplittable or empty rest, or an unknown policy."""
    name, sep, rest = value.partition("=")
    name = name.strip()
    if not sep or len(name.split()) > 1:  # `tandem --fairness=fcfs`: the NAME was left out
        raise TargetError(f"--variant {value!r}: expected NAME=POLICY [ROUTER-ARG ...]")
    if not NAME.fullmatch(name):
        raise TargetError(
            f"--variant {name!r}: NAME must be letters, digits and -_. (starting with a letter or digit)"
        )
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise TargetError(f"--variant {name}: cannot split {rest!r}: {exc}") from None
    if not words or words[0] not in ROUTING_POLICIES:
        got = repr(words[0]) if words else "nothing"
        raise TargetError(f"--variant {name}: the policy is {got}; choose from {', '.join(ROUTING_POLICIES)}")
    return Target("tandem", words[0], name=name, router_args=tuple(words[1:]))


def _variant_targets(values: Sequence[str], *, taken: Sequence[str]) -> list[Target]:
    """The `--variant` targets; a NAME must differ from every policy, `direct` and other variants
    (the same variant twice is one target)."""
    reserved = {*ROUTING_POLICIES, "direct", *taken}
    targets: dict[str, Target] = {}
    for value in values:
        target = parse_variant(value)
        known = targets.get(target.label)
        if known == target:
            continue
        if target.label in reserved or known is not None:
            raise TargetError(
                f"--variant {target.label}: the label {target.label!r} is taken; choose another"
            )
        targets[target.label] = target
    return list(targets.values())


def _command_targets(commands: Sequence[str], *, taken: Sequence[str]) -> list[Target]:
    """The `--peer-command` targets; a NAME must differ from every other label, also as a file name
    (`vllm-router:x` is written as `vllm-router-x`)."""
    reserved = {*ROUTING_POLICIES, "direct"}
    used = {*taken, *(label.replace(":", "-") for label in taken)}
    targets: dict[str, Target] = {}
    for value in commands:
        try:
            peer = parse_peer_command(value)
        except PeerCommandError as exc:
            raise TargetError(str(exc)) from None
        known = targets.get(peer.name)
        if known is not None and known.peer is not None and known.peer.argv == peer.argv:
            continue  # the same command twice: one target, as for a repeated --policy
        if peer.name in reserved | used or known is not None:
            raise TargetError(f"--peer-command {peer.name}: the label {peer.name!r} is taken; choose another")
        targets[peer.name] = Target("command", peer=peer)
    return list(targets.values())


def find_vllm_router(*, python: str) -> str | None:
    """The `vllm-router` binary beside `python` (its virtual environment), else on PATH, else None."""
    beside = Path(python).parent / VLLM_ROUTER
    if beside.is_file():
        return str(beside)
    return shutil.which(VLLM_ROUTER)


def vllm_router_argv(
    binary: str,
    *,
    port: int,
    metrics_port: int,
    policy: str,
    decode: Sequence[str],
    prefill: Sequence[str] = (),
) -> tuple[str, ...]:
    """The command line of vllm-router on 127.0.0.1 in front of the engines.

    With `prefill` engines it runs in vLLM P/D mode (`--vllm-pd-disaggregation --prefill URL ...
    --decode URL ...`), else it balances `--worker-urls`. Its Prometheus listener gets its own free
    port (the default 29000 would collide between runs). The start-up check interval is 1 s (the
    default 30 s would make every start wait that long when an engine is slow to answer).
    """
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy]
    if prefill:
        argv.append("--vllm-pd-disaggregation")
        for url in prefill:
            argv += ["--prefill", url]
        for url in decode:
            argv += ["--decode", url]
    else:
        argv += ["--worker-urls", *decode]
    argv += [
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--worker-startup-check-interval", "1", "--log-level", "warning",
    ]  # fmt: skip
    return tuple(argv)
