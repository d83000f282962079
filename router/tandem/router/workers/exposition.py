"""Merging the Prometheus text of several gateway workers into one page (pure: text in, text out).

`label_worker(text, worker=i)` adds `worker="i"` to every sample line; `merge(texts)` then groups
the samples of each metric family together under one `# HELP`/`# TYPE` header, as the text format
requires (a family's samples may not be split by another family's). Queries that want the gateway as
a whole sum over the label: `sum without (worker) (rate(tandem_router_requests_total[1m]))`.

Example: `a_total{route="x"} 1.0` from worker 1 becomes `a_total{worker="1",route="x"} 1.0`;
`up 1.0` becomes `up{worker="1"} 1.0`.
"""

from __future__ import annotations

from collections.abc import Sequence


def label_worker(text: bytes, *, worker: int) -> bytes:
    """`text` with `worker="<worker>"` added to every sample (module docstring)."""
    label = f'worker="{worker}"'.encode()
    out: list[bytes] = []
    for line in text.split(b"\n"):
        if not line or line.startswith(b"#"):
            out.append(line)
            continue
        brace, space = line.find(b"{"), line.find(b" ")
        if 0 <= brace < space or (brace >= 0 and space < 0):
            out.append(line[: brace + 1] + label + b"," + line[brace + 1 :])
        elif space > 0:
            out.append(line[:space] + b"{" + label + b"}" + line[space:])
        else:
            out.append(line)
    return b"\n".join(out)


def merge(texts: Sequence[bytes]) -> bytes:
    """One page with every family once, its samples from every text (module docstring)."""
    headers: dict[bytes, list[bytes]] = {}
    samples: dict[bytes, list[bytes]] = {}
    for text in texts:
        family: bytes | None = None
        for line in text.split(b"\n"):
            if not line:
                continue
            if line.startswith((b"# HELP ", b"# TYPE ")):
                name = family = line.split(b" ", 3)[2]
                if name not in headers:
                    headers[name] = []
                    samples[name] = []
                if line not in headers[name]:
                    headers[name].append(line)
                continue
            if line.startswith(b"#") or family is None:
                continue
            samples[family].append(line)
    out: list[bytes] = []
    for name, lines in headers.items():
        out += lines
        out += samples[name]
    return b"\n".join(out) + b"\n"
