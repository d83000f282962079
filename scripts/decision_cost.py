#!/usr/bin/env python3
"""What one routing decision costs the gateway, by part, for a long prompt over many endpoints.

In-process and single-threaded, with the gateway's own objects: a `RequestContext` with the process's
`PromptEncoder` (Tandem's tokenizer, or `--tokenizer DIR` for a model's `tokenizer.json`), and the
`tandem` policy's scheduler over N simulated endpoint snapshots whose approximate prefix index already
holds the prompt's system part on one endpoint and other prompts on every endpoint. For each N it
times, as the median of `--repeat` runs (microseconds, `time.perf_counter`):

- `tokenize+hash cold`: a prompt whose text was never seen (every segment tokenized, every block hashed;
  the texts are made before the clock runs);
- `tokenize+hash warm`: the same system prompt with a new question (the gateway's usual case);
- `scoring`: the scheduler's decision once the prompt's keys are known (candidates, filters,
  scorers, picker);
- `decision`: warm tokenize+hash plus scoring, what a request pays.

With `--tokenizer`, the first line says what encodes (`tokenizer backend`: fastokens where it passed
the load-time check, else Hugging Face `tokenizers`, `tandem.core.fast_tokens`); `--hf-too` measures
the same rows with Hugging Face alone in the same run, each endpoint count one after the other.

    .venv/bin/python scripts/decision_cost.py --prompt-tokens 8000 --endpoints 4,16,64
    .venv/bin/python scripts/decision_cost.py --tokenizer .tandem/models/tiny-qwen2 --hf-too --json out.json

No server is started and nothing is sent anywhere. docs/router-performance.md has the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tandem.core.modeltokens import ModelTokenizer, PromptEncoder, TandemTokenizer
from tandem.core.tokenizer_files import load_tokenizer
from tandem.router.pipeline.context import RequestContext
from tandem.router.scheduling import SchedulerDeps, SchedulingState, scheduler_for
from tandem.router.scheduling.tandem import ProfileScheduler
from tandem.router.types import Endpoint, EndpointSnapshot, EngineReading, EngineStats, Route

WORDS = (
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was",
    "for", "on", "are", "as", "with", "his", "they", "at", "be", "this",
)  # fmt: skip


def text(rng: random.Random, words: int) -> str:
    paragraphs = [" ".join(rng.choice(WORDS) for _ in range(40)) for _ in range(max(1, words // 40))]
    return "\n\n".join(paragraphs)


def snapshots(n: int, rng: random.Random) -> list[EndpointSnapshot]:
    out = []
    for i in range(n):
        stats = EngineStats(
            running=rng.randint(0, 20),
            waiting=0,
            kv_usage=rng.random() * 0.6,
            block_size=16,
            num_gpu_blocks=20_000,
        )
        out.append(
            EndpointSnapshot(
                endpoint=Endpoint("decode", f"http://127.0.0.1:{20000 + i}"),
                in_flight=rng.randint(0, 20),
                consecutive_failures=0,
                in_rotation=True,
                engine=EngineReading(stats=stats, scraped_at=0.0, stale=False),
            )
        )
    return out


def context(encoder: PromptEncoder, system: str, question: str) -> RequestContext:
    ctx = RequestContext(request_id="bench", upstream_id="bench", path="/v1/chat/completions", started=0.0)
    ctx.encoder, ctx.route = encoder, Route.CHAT
    ctx.body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    return ctx


def median_us(run: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1e6)
    return statistics.median(samples)


def measure(tokenizer: ModelTokenizer, *, prompt_words: int, endpoints: int, repeat: int) -> dict[str, float]:
    rng = random.Random(endpoints)
    encoder = PromptEncoder(tokenizer)
    state = SchedulingState(clock=time.monotonic)
    scheduler = scheduler_for("tandem", SchedulerDeps(state=state))
    assert isinstance(scheduler, ProfileScheduler)
    snaps = snapshots(endpoints, rng)
    system = text(rng, prompt_words)
    warm = context(encoder, system, "What is the first rule?")
    state.approximate.record(snaps[0].endpoint.url, warm)  # one endpoint holds the system prompt
    for snap in snaps:  # and every endpoint holds other prompts
        state.approximate.record(snap.endpoint.url, context(encoder, text(rng, 400), "x"))
    prompt_tokens = warm.prompt_length()

    cold_repeat = max(3, repeat // 10)
    cold_texts = iter([text(rng, prompt_words) for _ in range(cold_repeat)])  # made before the clock runs

    def cold() -> object:
        ctx = context(encoder, next(cold_texts), "A new question?")
        return ctx.block_keys(16)

    questions = iter([f"Question {i}: what does rule {i} say?" for i in range(10 * repeat + 10)])

    def warm_keys() -> RequestContext:
        ctx = context(encoder, system, next(questions))
        ctx.block_keys(16)
        return ctx

    keyed = warm_keys()
    return {
        "endpoints": endpoints,
        "prompt_tokens": prompt_tokens,
        "tokenize_hash_cold_us": median_us(cold, cold_repeat),
        "tokenize_hash_warm_us": median_us(warm_keys, repeat),
        "scoring_us": median_us(lambda: scheduler.decide("decode", keyed, snaps), repeat),
        "decision_us": median_us(lambda: scheduler.decide("decode", warm_keys(), snaps), repeat),
    }


def words_for(tokenizer: ModelTokenizer, tokens: int) -> int:
    """How many of `text`'s words make about `tokens` tokens with this tokenizer."""
    sample = text(random.Random(0), 4000)
    return round(tokens * 4000 / len(tokenizer.encode(sample)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=8000, help="about this many prompt tokens")
    parser.add_argument("--endpoints", default="4,16,64", help="endpoint counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--tokenizer", type=Path, default=None, help="a directory with tokenizer.json")
    parser.add_argument("--hf-too", action="store_true", help="also measure Hugging Face alone (--tokenizer)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    tokenizers: list[ModelTokenizer] = [TandemTokenizer()]
    if args.tokenizer is not None:
        tokenizers = [load_tokenizer(args.tokenizer)]
        if args.hf_too:
            tokenizers.append(load_tokenizer(args.tokenizer, fast=None))
    words = {id(t): words_for(t, args.prompt_tokens) for t in tokenizers}
    rows = [
        {"backend": t.backend, **measure(t, prompt_words=words[id(t)], endpoints=int(n), repeat=args.repeat)}
        for n in args.endpoints.split(",")
        for t in tokenizers
    ]
    lines = [f"tokenizer: {tokenizers[0].name}"]
    lines += [
        f"tokenizer backend: {t.backend}"
        + (f" (fast one refused: {t.fast_refused})" if t.fast_refused else "")
        for t in tokenizers
    ]
    lines += [
        "| endpoints | backend | prompt tokens | tokenize+hash cold (µs) | tokenize+hash warm (µs) "
        "| scoring (µs) | decision (µs) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['endpoints']} | {r['backend']} | {r['prompt_tokens']} | {r['tokenize_hash_cold_us']:.0f} | "
        f"{r['tokenize_hash_warm_us']:.0f} | {r['scoring_us']:.0f} | {r['decision_us']:.0f} |"
        for r in rows
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps({"tokenizer": tokenizers[0].name, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
