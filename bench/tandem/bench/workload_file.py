"""The workload file format (JSONL): one request per line, so any workload can be fed to `tandem bench`.

Each non-blank line is a JSON object:

    {"offset_s": 0.25, "tenant": "team-a", "max_tokens": 64,
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
    {"offset_s": 0.40, "tenant": "team-b", "max_tokens": 16, "prompt": "Once upon a time"}

- `offset_s` (number >= 0, required): arrival, seconds after the run starts;
- `max_tokens` (integer >= 1, required): the exact output length (sent with `ignore_eos`);
- exactly one of `prompt` (string → `/v1/completions`) and `messages` (list of `{role, content}`
  → `/v1/chat/completions`);
- `tenant` (string, default `default`): sent in the tenant header;
- `group` (string, optional): a label carried into the per-request records.

Lines may come in any order; requests are sorted by offset. Unknown keys are errors (a typo should
not silently change a benchmark). `dump_jsonl(load(...))` round-trips.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tandem.bench.workloads import BenchRequest, Workload, WorkloadError


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    offset_s: float = Field(ge=0, allow_inf_nan=False)
    max_tokens: int = Field(ge=1, le=1_000_000)
    tenant: str = Field(default="default", min_length=1)
    prompt: str | None = Field(default=None, min_length=1)
    messages: list[_Message] | None = Field(default=None, min_length=1)
    group: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> _Line:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages is required")
        return self


def parse_jsonl(text: str, *, name: str) -> Workload:
    """Parse a workload file's text; raises WorkloadError naming the line and the field."""
    requests: list[BenchRequest] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = _Line.model_validate_json(line)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            raise WorkloadError(f"{name}:{number}: {where + ': ' if where else ''}{message}") from None
        requests.append(
            BenchRequest(
                offset_s=item.offset_s,
                tenant=item.tenant,
                max_tokens=item.max_tokens,
                prompt=item.prompt,
                messages=None
                if item.messages is None
                else tuple({"role": m.role, "content": m.content} for m in item.messages),
                group=item.group,
            )
        )
    if not requests:
        raise WorkloadError(f"{name}: no requests")
    requests.sort(key=lambda r: r.offset_s)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Workload(f"file:{name}", tuple(requests), {"file": name, "sha256": digest})


def load(path: Path) -> Workload:
    """Read and parse a workload file; an unreadable file is a WorkloadError too."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None
    return parse_jsonl(text, name=path.name)


def dump_jsonl(workload: Workload) -> str:
    """The workload in the file format, one line per request in arrival order."""
    lines = []
    for r in workload.requests:
        item: dict[str, object] = {"offset_s": r.offset_s, "tenant": r.tenant, "max_tokens": r.max_tokens}
        if r.prompt is not None:
            item["prompt"] = r.prompt
        else:
            item["messages"] = [dict(m) for m in r.messages or ()]
        if r.group is not None:
            item["group"] = r.group
        lines.append(json.dumps(item, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)
