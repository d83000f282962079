"""Synthetic traces in the Azure and Mooncake formats with the published traces' statistics (pure).

The samples shipped in `tandem.bench.data` are made by `write_samples` (`python -m
tandem.bench.tracegen DIR`); a test checks that they are exactly what these generators give, so
they can be regenerated and audited. No real trace is shipped or downloaded.

Statistics used (computed over the whole public files; lengths are fitted as log-normals, i.e.
ln(length) ~ Normal(mu, sd), clipped to the file's min and max; inter-arrival gaps as a gamma
renewal process with the file's mean gap and coefficient of variation (CV)):

- Azure 2023 conv (`AzureLLMInferenceTrace_conv.csv`): 19,366 rows over 3,502 s, 5.53 req/s, gap
  CV 1.09; context tokens p50 1,020, mean 1,155 (mu 6.633, sd 0.985, 2..14,050); generated tokens
  p50 129, mean 211 (mu 5.019, sd 0.859, 7..1,000).
- Azure 2023 code (`AzureLLMInferenceTrace_code.csv`): 8,819 rows over 3,436 s, 2.57 req/s, gap CV
  13.2 (bursts); context p50 1,469, mean 2,048 (mu 6.999, sd 1.360, 3..7,437); generated p50 13,
  mean 28 (mu 2.788, sd 0.847, 6..1,899).
- Mooncake FAST'25 `conversation_trace.jsonl`: 12,031 rows over 3,537 s, 3.40 req/s, gap CV 3.03;
  input p50 6,909, mean 12,035 (mu 8.737, sd 1.199, 891..126,195); output p50 350, mean 343
  (mu 5.336, sd 1.358, 1..2,000).

Mooncake's conversation trace also has: every request starts with hash id 0 (a shared system
prompt block), timestamps on a 3 s grid, 38.7% of requests repeat 2 or more leading blocks of an
earlier request (a conversation continuing), and 36.6% of all blocks are an already-seen leading
prefix (the ideal prefix reuse; the paper reports a 40% cache ratio). The generator reproduces this
with continuations: with probability `p_continue`, a request extends one of the 32 most recent
prompts by a turn (`TURN` tokens; it keeps that prompt's whole blocks and their ids), else it is a
fresh prompt [0, new ids...] with a length drawn from the input distribution.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path


@dataclass(frozen=True)
class LogNormal:
    mu: float
    sd: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return min(self.high, max(self.low, round(math.exp(rng.gauss(self.mu, self.sd)))))


@dataclass(frozen=True)
class TraceStats:
    rate: float
    gap_cv: float
    inputs: LogNormal
    outputs: LogNormal


AZURE_CONV = TraceStats(5.53, 1.09, LogNormal(6.633, 0.985, 2, 14_050), LogNormal(5.019, 0.859, 7, 1_000))
AZURE_CODE = TraceStats(2.57, 13.2, LogNormal(6.999, 1.360, 3, 7_437), LogNormal(2.788, 0.847, 6, 1_899))
MOONCAKE_CONVERSATION = TraceStats(
    3.40, 3.03, LogNormal(8.737, 1.199, 891, 126_195), LogNormal(5.336, 1.358, 1, 2_000)
)
#: Tokens a continuing conversation adds to the prompt it extends (a user turn and the last answer).
TURN = LogNormal(6.5, 1.0, 16, 20_000)
AZURE_EPOCH = datetime(2023, 11, 16, 18, 15, 46, tzinfo=UTC)


def gaps(rng: random.Random, stats: TraceStats, count: int) -> list[float]:
    """`count` gamma-distributed gaps with mean 1/rate and the given CV (shape 1/CV², Poisson at CV 1)."""
    shape = 1 / stats.gap_cv**2
    scale = 1 / stats.rate / shape
    return [rng.gammavariate(shape, scale) for _ in range(count)]


def azure_csv(stats: TraceStats, *, rows: int, seed: int) -> str:
    """An Azure-format CSV of `rows` requests with `stats` (module docstring)."""
    rng = random.Random(f"tandem-tracegen:{seed}:azure")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    now = 0.0
    for i, gap in enumerate(gaps(rng, stats, rows)):
        now += gap if i else 0.0
        stamp = (AZURE_EPOCH + timedelta(seconds=now)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        lines.append(f"{stamp},{stats.inputs.draw(rng)},{stats.outputs.draw(rng)}")
    return "\n".join(lines) + "\n"


@dataclass
class _Prompt:
    length: int
    ids: list[int]


def mooncake_jsonl(
    stats: TraceStats, *, rows: int, seed: int, p_continue: float = 0.35, grid_ms: int = 3000
) -> str:
    """A Mooncake-format JSONL of `rows` requests with `stats` (module docstring)."""
    rng = random.Random(f"tandem-tracegen:{seed}:mooncake")
    next_id = 1
    recent: list[_Prompt] = []
    lines: list[str] = []
    now = 0.0
    for i, gap in enumerate(gaps(rng, stats, rows)):
        now += gap if i else 0.0
        length = stats.inputs.draw(rng)
        kept = [0]
        if recent and rng.random() < p_continue:
            base = rng.choice(recent[-32:])
            length = min(stats.inputs.high, base.length + TURN.draw(rng))
            kept = base.ids[: max(1, base.length // 512)]
        blocks = math.ceil(length / 512)
        ids = kept + list(range(next_id, next_id + blocks - len(kept)))
        next_id += blocks - len(kept)
        recent.append(_Prompt(length, ids))
        stamp = round(now * 1000 / grid_ms) * grid_ms
        row = {"timestamp": stamp, "input_length": length, "output_length": stats.outputs.draw(rng),
               "hash_ids": ids}  # fmt: skip
        lines.append(json.dumps(row))
    return "\n".join(lines) + "\n"


SAMPLE_FILES: dict[str, Callable[[], str]] = {
    "azure-conv-sample.csv": lambda: azure_csv(AZURE_CONV, rows=600, seed=0),
    "azure-code-sample.csv": lambda: azure_csv(AZURE_CODE, rows=600, seed=0),
    "mooncake-conversation-sample.jsonl": lambda: mooncake_jsonl(MOONCAKE_CONVERSATION, rows=300, seed=0),
}


def write_samples(directory: Path) -> list[Path]:
    """Write every shipped sample into `directory`; returns the paths."""
    written = []
    for name, make in SAMPLE_FILES.items():
        path = directory / name
        path.write_text(make(), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_samples(Path(sys.argv[1])):
        sys.stderr.write(f"wrote {written_path}\n")
