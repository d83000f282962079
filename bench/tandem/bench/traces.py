"""Trace replay: the Azure LLM inference CSV and the Mooncake JSONL formats as workloads (pure but for
reading the file).

**Azure LLM inference traces** (Azure/AzurePublicDataset, 2023 and 2024): CSV with the header
`TIMESTAMP,ContextTokens,GeneratedTokens`, e.g. `2023-11-16 18:15:46.6805900,374,44`. The timestamp
has up to 7 fractional digits; offsets are seconds after the first row. Prompts carry no content in
the trace, so every request gets its own filler text (nothing shared beyond the API's header).

**Mooncake traces** (kvcache-ai/Mooncake, FAST'25): JSONL rows `{"timestamp": ms, "input_length":
N, "output_length": M, "hash_ids": [...]}`, one hash id per 512-token block of the prompt
(`len(hash_ids) == ceil(input_length / 512)`; equal ids mean equal blocks, and ids are chained, so
equal leading ids mean an equal prefix). The replay turns each id into a fixed text block of exactly
`block` tokens (seeded by the id), so two prompts share a prefix exactly where their hash ids share
a prefix; a request's last block is cut to its length (`input_length − (n − 1) × block`; cut blocks
are seeded by id and length, so they are equal when both are).

Parameters shared by both: `file` (a path; `sample`, the default, is the small sample shipped in
`tandem.bench.data`), `speed` (offsets are divided by it: 2 replays twice as fast), `length_scale`
(token counts are multiplied by it, at least 1; for Mooncake the block becomes
round(512 × length_scale) tokens so the sharing structure stays the same), `max_input_tokens`
(longer prompts are cut: Azure to the limit, Mooncake to whole blocks), and `api` (`completions`
by default, so prompt lengths are exact; `chat` adds the template's tokens).

A bad line is a WorkloadError naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from pydantic import Field

from tandem.bench.text import words
from tandem.bench.workloads import Api, BenchRequest, Params, Workload, WorkloadError, make_request

MOONCAKE_BLOCK_TOKENS = 512
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SAMPLES = {"azure": "azure-conv-sample.csv", "mooncake": "mooncake-conversation-sample.jsonl"}


@dataclass(frozen=True)
class TraceRow:
    """One traced request: arrival (s after the first row), lengths, and Mooncake's block ids."""

    offset_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


class TraceParams(Params):
    file: str = Field(default="sample", min_length=1, description="Trace path, or `sample`.")
    speed: float = Field(default=1.0, gt=0, le=1_000_000, description="Time compression factor.")
    length_scale: float = Field(default=1.0, gt=0, le=100, description="Token count multiplier.")
    max_input_tokens: int = Field(default=30_000, ge=1, le=10_000_000)
    tenant: str = Field(default="default", min_length=1)
    api: Api = "completions"
    concurrency: int | None = Field(default=None, ge=1)


class MooncakeParams(TraceParams):
    length_scale: float = Field(default=0.25, gt=0, le=100, description="Token count multiplier.")


def _int(value: object, *, where: str, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise WorkloadError(f"{where}: {field}: expected an integer, got {value!r}") from None
    if value < minimum:
        raise WorkloadError(f"{where}: {field}: must be >= {minimum}, got {value}")
    return value


def _timestamp(value: str, *, where: str) -> float:
    """`2023-11-16 18:15:46.6805900` → seconds (as UTC; fractions beyond microseconds are dropped)."""
    head, dot, fraction = value.strip().partition(".")
    text, layout = (f"{head}.{fraction[:6]}", "%Y-%m-%d %H:%M:%S.%f") if dot else (head, "%Y-%m-%d %H:%M:%S")
    try:
        return datetime.strptime(text, layout).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise WorkloadError(
            f"{where}: TIMESTAMP: expected YYYY-MM-DD HH:MM:SS[.fffffff], got {value!r}"
        ) from None


def parse_azure(text: str, *, name: str) -> list[TraceRow]:
    """Parse an Azure LLM inference CSV (module docstring); rows come out sorted by arrival."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != AZURE_HEADER:
        raise WorkloadError(f"{name}:1: expected the header {','.join(AZURE_HEADER)}, got {header}")
    stamped: list[tuple[float, int, int]] = []
    for number, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        where = f"{name}:{number}"
        if len(row) != len(AZURE_HEADER):
            raise WorkloadError(f"{where}: expected 3 columns, got {len(row)}")
        stamped.append((
            _timestamp(row[0], where=where),
            _int(row[1], where=where, field="ContextTokens", minimum=1),
            _int(row[2], where=where, field="GeneratedTokens", minimum=1),
        ))  # fmt: skip
    if not stamped:
        raise WorkloadError(f"{name}: no requests")
    stamped.sort(key=lambda r: r[0])
    first = stamped[0][0]
    return [TraceRow(t - first, i, o) for t, i, o in stamped]


def _mooncake_row(line: str, *, where: str) -> TraceRow:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: invalid JSON: {exc.msg}") from None
    if not isinstance(item, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in item:
            raise WorkloadError(f"{where}: {key}: missing")
    stamp = item["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
        raise WorkloadError(f"{where}: timestamp: expected milliseconds >= 0, got {stamp!r}")
    length = _int(item["input_length"], where=where, field="input_length", minimum=1)
    output = _int(item["output_length"], where=where, field="output_length", minimum=0)
    ids = item["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise WorkloadError(f"{where}: hash_ids: expected a list of integers")
    blocks = math.ceil(length / MOONCAKE_BLOCK_TOKENS)
    if len(ids) != blocks:
        raise WorkloadError(
            f"{where}: hash_ids: {len(ids)} ids for input_length {length} "
            f"(expected ceil({length}/512) = {blocks})"
        )
    return TraceRow(float(stamp) / 1000, length, max(1, output), tuple(ids))


def parse_mooncake(text: str, *, name: str) -> list[TraceRow]:
    """Parse a Mooncake trace (module docstring); rows come out sorted by arrival, the first at 0."""
    rows = [
        _mooncake_row(line, where=f"{name}:{number}")
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not rows:
        raise WorkloadError(f"{name}: no requests")
    rows.sort(key=lambda r: r.offset_s)
    first = rows[0].offset_s
    return [TraceRow(r.offset_s - first, r.input_tokens, r.output_tokens, r.hash_ids) for r in rows]


def read_trace(file: str, *, kind: str) -> tuple[str, str]:
    """(name, text) of a trace file, or of the shipped sample when `file` is `sample`."""
    if file == "sample":
        sample = SAMPLES[kind]
        return sample, resources.files("tandem.bench.data").joinpath(sample).read_text(encoding="utf-8")
    path = Path(file)
    try:
        return path.name, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{file}: cannot read: {exc}") from None


def _scaled(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def azure_workload(params: TraceParams, *, seed: int, text: str | None = None, name: str = "") -> Workload:
    """Replay an Azure CSV (from `text`, or `params.file`): distinct filler prompts of the traced lengths."""
    if text is None:
        name, text = read_trace(params.file, kind="azure")
    rows = parse_azure(text, name=name)
    rng = random.Random(f"tandem-bench:{seed}:azure:text")
    requests = tuple(
        make_request(
            api=params.api, system=None, offset_s=r.offset_s / params.speed, tenant=params.tenant,
            user=words(rng, min(params.max_input_tokens, _scaled(r.input_tokens, params.length_scale))),
            max_tokens=_scaled(r.output_tokens, params.length_scale), group="azure",
        )
        for r in rows
    )  # fmt: skip
    return Workload("azure-trace", requests, {**params.model_dump(), "trace": name}, params.concurrency)


class _Blocks:
    """Text blocks of exactly `size` tokens per Mooncake hash id, memoised (the same id → the same text)."""

    def __init__(self, *, seed: int, size: int) -> None:
        self.seed, self.size = seed, size
        self.memo: dict[tuple[int, int], str] = {}

    def text(self, hash_id: int, tokens: int) -> str:
        key = (hash_id, tokens)
        if key not in self.memo:
            rng = random.Random(f"tandem-bench:{self.seed}:mooncake:block:{hash_id}:{tokens}")
            self.memo[key] = words(rng, tokens)
        return self.memo[key]


def mooncake_prompt(row: TraceRow, blocks: _Blocks, *, max_input_tokens: int) -> tuple[str, int]:
    """The prompt of one row and its token count: whole blocks, the last one cut to the length."""
    size = blocks.size
    length = max(1, round(row.input_tokens * size / MOONCAKE_BLOCK_TOKENS))
    if length > max_input_tokens:
        length = max(size, max_input_tokens // size * size)
    parts: list[str] = []
    left = length
    for hash_id in row.hash_ids:
        if left <= 0:
            break
        take = min(size, left)
        parts.append(blocks.text(hash_id, take))
        left -= take
    if left > 0:  # a cut length longer than its ids cover (cannot happen for parsed rows)
        parts.append(blocks.text(-1, left))
    return "".join(parts), length


def mooncake_workload(params: TraceParams, *, seed: int, text: str | None = None, name: str = "") -> Workload:
    """Replay a Mooncake JSONL (from `text`, or `params.file`) with prefixes shared as the hash ids say."""
    if text is None:
        name, text = read_trace(params.file, kind="mooncake")
    rows = parse_mooncake(text, name=name)
    blocks = _Blocks(seed=seed, size=_scaled(MOONCAKE_BLOCK_TOKENS, params.length_scale))
    requests: list[BenchRequest] = []
    for r in rows:
        prompt, _ = mooncake_prompt(r, blocks, max_input_tokens=params.max_input_tokens)
        requests.append(
            make_request(
                api=params.api, system=None, user=prompt, offset_s=r.offset_s / params.speed,
                tenant=params.tenant, max_tokens=_scaled(r.output_tokens, params.length_scale),
                group=f"b{r.hash_ids[0]}" if r.hash_ids else "mooncake",
            )
        )  # fmt: skip
    dumped = {**params.model_dump(), "trace": name, "block_tokens": blocks.size}
    return Workload("mooncake-trace", tuple(requests), dumped, params.concurrency)
