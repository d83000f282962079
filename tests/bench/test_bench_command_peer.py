"""`--peer-command NAME=TEMPLATE`: parsing, placeholder filling and labels.

Real: `tandem.bench.command_peer` and `tandem.bench.targets` (pure), `shutil.which` on files the test
writes. Nothing is started here; the harness runs a command peer in test_bench_harness.py.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tandem.bench.command_peer import (
    PeerCommand,
    PeerCommandError,
    Wiring,
    fill,
    find_program,
    parse_peer_command,
    placeholders,
)
from tandem.bench.targets import Target, TargetError, parse_targets

WIRING = Wiring(
    port=9000, metrics_port=9001, model="qwen",
    decode=("http://127.0.0.1:8101", "http://127.0.0.1:8102"), prefill=("http://127.0.0.1:8201",),
)  # fmt: skip
NO_PREFILL = Wiring(port=9000, metrics_port=9001, model="qwen", decode=("http://127.0.0.1:8101",))


@pytest.mark.parametrize(
    ("template", "wiring", "argv"),
    [
        ("r --host {host} --port {port}", WIRING, ("r", "--host", "127.0.0.1", "--port", "9000")),
        ("r --listen={host}:{port} --metrics {metrics_port}", WIRING,
         ("r", "--listen=127.0.0.1:9000", "--metrics", "9001")),
        ("r --static-backends {decode_urls} --static-models {model}", WIRING,
         ("r", "--static-backends", f"{WIRING.decode[0]},{WIRING.decode[1]}", "--static-models", "qwen")),
        ("r --static-backends {decode_urls} --static-models {decode_models}", WIRING,
         ("r", "--static-backends", ",".join(WIRING.decode), "--static-models", "qwen,qwen")),
        ("r --workers {decode_urls_space} --end", WIRING,
         ("r", "--workers", "http://127.0.0.1:8101", "http://127.0.0.1:8102", "--end")),
        ("r '--workers={decode_urls_space}'", WIRING, ("r", "--workers=http://127.0.0.1:8101 http://127.0.0.1:8102")),
        ("r --prefill {prefill_urls_space} --decode {decode_urls}", WIRING,
         ("r", "--prefill", "http://127.0.0.1:8201", "--decode", "http://127.0.0.1:8101,http://127.0.0.1:8102")),
        ("r --prefill {prefill_urls_space} --p={prefill_urls}", NO_PREFILL, ("r", "--prefill", "--p=")),
        ("r --json '{\"a\": 1}' '{ port }'", WIRING, ("r", "--json", '{"a": 1}', "{ port }")),
        ("/opt/my router/bin/r  --port   {port}", WIRING, ("/opt/my", "router/bin/r", "--port", "9000")),
        ("'/opt/my router/bin/r' --port {port}", WIRING, ("/opt/my router/bin/r", "--port", "9000")),
    ],
)  # fmt: skip
def test_placeholders_are_filled_in_each_argument_and_a_whole_list_placeholder_becomes_arguments(
    template: str, wiring: Wiring, argv: tuple[str, ...]
) -> None:
    peer = parse_peer_command(f"p={template}")
    assert fill(peer.argv, wiring) == argv


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("router --port {port}", "--peer-command 'router --port {port}': expected NAME=TEMPLATE"),
        ("=r {port}", "NAME must be letters, digits and -_."),
        ("../up=r {port}", "--peer-command '../up': NAME must be"),
        (".hidden=r {port}", "NAME must be"),
        ("a:b=r {port}", "NAME must be"),
        ("p=", "--peer-command p: the command is empty"),
        ("p=   ", "the command is empty"),
        ("p=r --name 'unclosed {port}", "--peer-command p: cannot split the command: No closing quotation"),
        ("p=r --port {prot} {hots} {port} {prot}",
         "--peer-command p: unknown placeholder(s) {prot}, {hots}; known: {host}, {port}"),
        ("p=r {python} -m x", "unknown placeholder(s) {python};"),
    ],
)  # fmt: skip
def test_a_bad_peer_command_is_refused_naming_what_is_wrong(value: str, message: str) -> None:
    with pytest.raises(PeerCommandError) as caught:
        parse_peer_command(value)
    assert message in str(caught.value)


def test_a_peer_command_keeps_its_name_template_and_arguments() -> None:
    peer = parse_peer_command("pstack= vllm-router --port {port} --routing-logic roundrobin ")
    assert peer == PeerCommand(
        "pstack", "vllm-router --port {port} --routing-logic roundrobin",
        ("vllm-router", "--port", "{port}", "--routing-logic", "roundrobin"),
    )  # fmt: skip
    assert placeholders(peer.argv) == ["port"]
    target = parse_targets(policies=[], peers=[], commands=["pstack=vllm-router --port {port}"], direct=False)
    assert [(t.kind, t.label) for t in target] == [("command", "pstack")]
    assert target[0].describe() == {
        "kind": "command",
        "policy": None,
        "command": "vllm-router --port {port}",
        "replicas": 1,
    }


@pytest.mark.parametrize(
    ("policies", "peers", "commands", "message"),
    [
        ([], [], ["round-robin=r {port}"], "--peer-command round-robin: the label 'round-robin' is taken"),
        ([], [], ["direct=r {port}"], "the label 'direct' is taken"),
        (["round-robin"], [], ["round-robin=r {port}"], "is taken"),
        ([], ["vllm-router:round_robin"], ["vllm-router-round_robin=r {port}"], "is taken"),
        ([], [], ["a=r {port}", "a=s {port}"], "--peer-command a: the label 'a' is taken"),
        ([], [], ["a=r {nope}"], "unknown placeholder(s) {nope}"),
    ],
)  # fmt: skip
def test_a_peer_command_name_must_not_clash_with_another_label(
    policies: list[str], peers: list[str], commands: list[str], message: str
) -> None:
    with pytest.raises(TargetError) as caught:
        parse_targets(policies=policies, peers=peers, commands=commands, direct=True)
    assert message in str(caught.value)


def test_targets_keep_their_order_and_a_repeated_command_is_one_target() -> None:
    targets = parse_targets(
        policies=["round-robin"], peers=["vllm-router:round_robin"],
        commands=["a=r {port}", "b=s {port}", "a=r  {port}"], direct=True,
    )  # fmt: skip
    assert [t.label for t in targets] == ["round-robin", "vllm-router:round_robin", "a", "b", "direct"]
    assert targets[2] == Target("command", peer=parse_peer_command("a=r {port}"))


def test_the_program_is_found_as_a_path_or_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / "my-router"
    program.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_program(parse_peer_command(f"p={program} --port {{port}}")) is None, "not executable yet"
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    assert find_program(parse_peer_command(f"p={program} --port {{port}}")) == str(program)
    assert find_program(parse_peer_command("p=my-router --port {port}")) == str(program)
    assert find_program(parse_peer_command("p=/nonexistent/router {port}")) is None
