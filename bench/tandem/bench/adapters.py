"""The multi-adapter workload and the adapter folder the simulated engines resolve it from (pure, but
for `write_adapter_folder`).

`multi-adapter`: `adapters` LoRA adapters `a000` … `a199` whose popularity is Zipf (adapter i gets
the share (i + 1)^-s / Σ, `zipf_s`), Poisson arrivals at `rate` req/s for `duration` s, each
request's `model` the adapter's name (the driver sends it), its prompt `prompt_tokens` of distinct
text and `output_tokens` out; plus a **hot-adapter burst**: `burst_rate` req/s more, all for
`burst_adapter` (default the least popular one, so the burst is a surprise), from `burst_start` for
`burst_len` s. Each request's `group` is its adapter's name, `tenant` is `bench` (one tenant: the
benchmark measures placement, not fairness).

Example: adapters 200, zipf_s 1.1 → a000 gets 17% of the background traffic, a001 8%, a009 1.4%,
a199 0.05%; with rate 8, duration 60 and a burst of 16 req/s over [20, 30) → about 480 background
requests and 160 for the burst adapter.

`write_adapter_folder` writes what vLLM's filesystem resolver (and the simulator's) loads:
`<dir>/<name>/adapter_config.json` with `r`, `lora_alpha`, `target_modules`, `peft_type: LORA` and
`base_model_name_or_path` = the engines' `--model`; no weights (the simulator reads none).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field

from tandem.bench.generators import zipf_shares
from tandem.bench.text import words
from tandem.bench.workloads import BenchRequest, Params, Workload, poisson_until

#: The tenant every multi-adapter request carries.
TENANT = "bench"


class MultiAdapterParams(Params):
    adapters: int = Field(default=200, ge=1, le=10_000, description="Adapters a000, a001, ...")
    zipf_s: float = Field(default=1.1, ge=0, le=10, description="Zipf exponent of popularity; 0: equal.")
    rate: float = Field(default=8.0, gt=0, le=100_000, description="Background req/s over all adapters.")
    duration: float = Field(default=60.0, gt=0, le=86_400)
    prompt_tokens: int = Field(default=256, ge=1, le=1_000_000)
    output_tokens: int = Field(default=32, ge=1, le=1_000_000)
    burst_adapter: int | None = Field(
        default=None, ge=0, description="Index of the burst's adapter; default the last (least popular)."
    )
    burst_rate: float = Field(
        default=0.0, ge=0, le=100_000, description="Extra req/s for the burst; 0: none."
    )
    burst_start: float = Field(default=20.0, ge=0, le=86_400)
    burst_len: float = Field(default=10.0, ge=0, le=86_400)
    concurrency: int | None = Field(default=None, ge=1)


def adapter_name(index: int, count: int) -> str:
    """`a000` … for 200 adapters (zero-padded to the widest index, at least 3 digits)."""
    return f"a{index:0{max(3, len(str(count - 1)))}d}"


def adapter_names(count: int) -> tuple[str, ...]:
    """Every adapter's name, most popular first: `adapter_names(3)` → `('a000', 'a001', 'a002')`."""
    return tuple(adapter_name(i, count) for i in range(count))


def burst_index(params: MultiAdapterParams) -> int:
    """The burst adapter's index: `burst_adapter`, clamped to the catalog, else the last one."""
    last = params.adapters - 1
    return last if params.burst_adapter is None else min(params.burst_adapter, last)


def burst_window(params: MultiAdapterParams) -> tuple[float, float] | None:
    """[start, end) of the burst in seconds, or None without one."""
    if params.burst_rate <= 0 or params.burst_len <= 0:
        return None
    return (params.burst_start, params.burst_start + params.burst_len)


def multi_adapter(params: MultiAdapterParams, *, seed: int) -> Workload:
    """The workload (module docstring); deterministic in `seed`."""
    names = adapter_names(params.adapters)
    shares = zipf_shares(params.adapters, params.zipf_s)
    arrivals = random.Random(f"tandem-bench:{seed}:multi-adapter:arrivals")
    choice = random.Random(f"tandem-bench:{seed}:multi-adapter:choice")
    text = random.Random(f"tandem-bench:{seed}:multi-adapter:text")
    timed: list[tuple[float, str]] = [
        (offset, choice.choices(names, weights=shares)[0])
        for offset in poisson_until(arrivals, rate=params.rate, duration_s=params.duration)
    ]
    window = burst_window(params)
    if window is not None:
        start, end = window
        hot = names[burst_index(params)]
        burst = random.Random(f"tandem-bench:{seed}:multi-adapter:burst")
        length = min(end, params.duration) - start
        if length > 0:
            timed += [
                (start + t, hot) for t in poisson_until(burst, rate=params.burst_rate, duration_s=length)
            ]
    timed.sort(key=lambda pair: pair[0])
    requests = tuple(
        BenchRequest(
            offset,
            TENANT,
            params.output_tokens,
            prompt=words(text, params.prompt_tokens),
            group=name,
            model=name,
        )
        for offset, name in timed
    )
    return Workload("multi-adapter", requests, params.model_dump(), params.concurrency)


def adapter_config(*, base_model: str, rank: int) -> dict[str, object]:
    """A PEFT `adapter_config.json` the resolver accepts (the fields vLLM and the simulator read)."""
    return {
        "peft_type": "LORA",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "task_type": "CAUSAL_LM",
    }


def write_adapter_folder(directory: Path, names: Sequence[str], *, base_model: str, rank: int = 8) -> Path:
    """Write `<directory>/<name>/adapter_config.json` for every name (config only, no weights) and
    return `directory`; existing configs are overwritten."""
    config = json.dumps(adapter_config(base_model=base_model, rank=rank), indent=2) + "\n"
    for name in names:
        folder = directory / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_text(config, encoding="utf-8")
    return directory
