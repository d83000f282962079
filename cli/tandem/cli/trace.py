"""`tandem trace REQUEST_ID`: one request's trace as a waterfall in the terminal.

Reads the spans that `tandem up --trace` (or any `tracing.endpoint: file://DIR`) has the gateway and
the simulated engines write, one JSON line per span (`tandem.core.tracing.FileSpanExporter`), finds
the gateway's server span whose `tandem.request_id` is REQUEST_ID, and prints every span of its trace
as a tree on one time axis:

    trace 4bf92f3577b34da6a3ce929d0e0e4736 · request r-1 · 41.2 ms · 7 spans
      0.0   41.2 ms  [████████████████████████████████████████]  text_completion qwen  demo-router
      0.3    0.4 ms  [▏                                       ]    tandem.admission
      ...

Columns: start (ms after the trace's first span), duration, the bar, the span's name indented by its
depth, its service, and `ERROR: ...` for a span with an error status. Exit codes: 0 printed; 1 no
trace of that request (one line on stderr says where it looked); 2 bad arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from tandem.cli.documents import load_one
from tandem.cli.exits import fail

DEFAULT_ROOT = Path(".tandem")
TRACES = "traces"
BAR = 40


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span in `directory`'s `*.jsonl` files (lines that are not JSON objects are skipped: a
    file may end in a line being written)."""
    spans = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                span = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(span, dict) and "trace_id" in span:
                spans.append(span)
    return spans


def request_trace(spans: Iterable[Mapping[str, Any]], request_id: str) -> list[Mapping[str, Any]]:
    """The spans of the trace whose gateway span has `tandem.request_id` = `request_id` ([] if none)."""
    spans = list(spans)
    ids = {s["trace_id"] for s in spans if (s.get("attributes") or {}).get("tandem.request_id") == request_id}
    return [s for s in spans if s["trace_id"] in ids]


def waterfall(spans: Sequence[Mapping[str, Any]], request_id: str) -> list[str]:
    """The lines of the module docstring's picture (pure); spans are ordered as a tree, children by
    start time, and spans whose parent is not in the trace (the client's) are roots."""
    start = min(s["start_ns"] for s in spans)
    end = max(s["end_ns"] for s in spans)
    total = max(end - start, 1)
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    for span in spans:
        parent = span.get("parent_id") if span.get("parent_id") in ids else None
        children.setdefault(parent, []).append(span)
    trace_ids = sorted({s["trace_id"] for s in spans})
    took = (end - start) / 1e6
    lines = [f"trace {', '.join(trace_ids)} · request {request_id} · {took:.1f} ms · {len(spans)} spans"]

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s["start_ns"]):
            lines.append(_line(span, depth, start=start, total=total))
            walk(span["span_id"], depth + 1)

    walk(None, 0)
    return lines


def _line(span: Mapping[str, Any], depth: int, *, start: int, total: int) -> str:
    offset = (span["start_ns"] - start) / 1e6
    duration = (span["end_ns"] - span["start_ns"]) / 1e6
    first = int((span["start_ns"] - start) / total * BAR)
    width = max(1, round((span["end_ns"] - span["start_ns"]) / total * BAR))
    bar = (" " * first + "█" * width).ljust(BAR)[:BAR]
    error = f"  ERROR: {span.get('status_message') or 'error'}" if span.get("status") == "error" else ""
    name = "  " * depth + str(span["name"])
    return f"{offset:8.1f} {duration:8.1f} ms  [{bar}]  {name}  {span.get('service') or ''}{error}".rstrip()


def _trace_dir(path: Path | None, state_dir: Path | None, directory: Path | None) -> Path:
    if directory is not None:
        return directory
    if state_dir is not None:
        return state_dir / TRACES
    if path is not None:
        isvc = load_one(path)
        tracing = isvc.spec.tracing
        if tracing is not None and tracing.endpoint.startswith("file://"):
            return Path(tracing.endpoint.removeprefix("file://"))
        return DEFAULT_ROOT / isvc.metadata.name / TRACES
    found = sorted(DEFAULT_ROOT.glob(f"*/{TRACES}"))
    if len(found) == 1:
        return found[0]
    where = ", ".join(str(p) for p in found) or f"no {DEFAULT_ROOT}/*/{TRACES}"
    fail(f"give --state-dir, -f FILE or --dir to say which traces to read ({where})", code=2)


@click.command()
@click.argument("request_id")
@click.option("-f", "--file", "path", type=click.Path(path_type=Path, dir_okay=False),
              help="The InferenceService `tandem up -f` runs (traces in .tandem/<name>/traces).")  # fmt: skip
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="The --state-dir given to `tandem up` (traces in its traces/ folder).")  # fmt: skip
@click.option("--dir", "directory", type=click.Path(path_type=Path, file_okay=False),
              help="A folder of span files (a tracing.endpoint file://DIR).")  # fmt: skip
def trace(request_id: str, path: Path | None, state_dir: Path | None, directory: Path | None) -> None:
    """Print one request's trace (gateway stages, prefill and decode engines) as a waterfall."""
    folder = _trace_dir(path, state_dir, directory)
    if not folder.is_dir():
        fail(f"no traces in {folder} (run `tandem up --trace`, or set tracing.endpoint: file://DIR)")
    spans = request_trace(read_spans(folder), request_id)
    if not spans:
        fail(
            f"no trace of request {request_id!r} in {folder} (not sampled, not finished yet, or spans "
            "still in the exporters' buffers: they are written every half second)"
        )
    for line in waterfall(spans, request_id):
        click.echo(line)
