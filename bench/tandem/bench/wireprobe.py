"""The time to first token a gateway adds at concurrency 1, measured with a client that adds next to
nothing of its own (`tandem bench --overhead-sweep`'s probe).

The sweep's levels are driven by the bench's Python client (httpx, one task per request), and on a
small machine that client's own work lands in the "added" figure: the client, the gateway and the
engine share the cores, and a third busy process makes every wake-up later. On the 2-core machine of
2026-11-27 the sweep gave vllm-router's round robin 0.9 ms of added TTFT p50 at C = 1, and this probe
0.18 ms, in front of the same engine. So each gateway is also measured this way:

- one keep-alive TCP connection to the engine and one to the gateway (`TCP_NODELAY`), blocking
  sockets, HTTP/1.1 written by hand, the response read with a chunked-encoding parser and nothing else;
- requests **alternate** between the two, pair by pair (which goes first alternates too), so the
  engine and the machine are the same for both halves of each pair;
- TTFT is from the request's first byte sent to the end of the first SSE event whose choice carries
  text (`"text"` or `"content"` not empty); the added TTFT is the gateway's p50 − the engine's p50.

Streamed completions of `prompt_tokens` words and `output_tokens` tokens, as the sweep's levels.
"""

from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from tandem.bench.stats import percentile
from tandem.bench.text import words

_TEXT_MARKERS = (b'"text":"', b'"content":"')
_EMPTY = (b'"text":""', b'"content":""')


class ProbeError(Exception):
    """A probe request failed (status, broken connection, bad framing)."""


def carries_text(event: bytes) -> bool:
    """Whether one SSE event's data has a choice with text. Examples: `data: {"choices":[{"text":"a"}]}`
    → True; `"text":""` or `"content":""` only, or `data: [DONE]` → False."""
    for marker, empty in zip(_TEXT_MARKERS, _EMPTY, strict=True):
        start = 0
        while (at := event.find(marker, start)) >= 0:
            if not event.startswith(empty, at):
                return True
            start = at + len(marker)
    return False


@dataclass
class ResponseReader:
    """An HTTP/1.1 response read from a stream of bytes: `feed` until `done`; `first_text` is set once
    an SSE event with text has been read whole."""

    head: bytes = b""
    status: int = 0
    chunked: bool = False
    length: int | None = None
    body_read: int = 0
    done: bool = False
    first_text: bool = False
    _raw: bytearray = field(default_factory=bytearray)
    _events: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        self._raw += data
        if not self.head:
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self.head = bytes(self._raw[:end])
            del self._raw[: end + 4]
            self._parse_head()
        if self.chunked:
            self._chunks()
        else:
            self._plain()

    def _parse_head(self) -> None:
        lines = self.head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ProbeError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key, value = name.strip().lower(), value.strip()
            if key == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif key == b"content-length" and value.isdigit():
                self.length = int(value)

    def _plain(self) -> None:
        self._body(bytes(self._raw))
        self._raw.clear()
        if self.length is not None and self.body_read >= self.length:
            self.done = True

    def _chunks(self) -> None:
        while True:
            end = self._raw.find(b"\r\n")
            if end < 0:
                return
            size_text = bytes(self._raw[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise ProbeError(f"bad chunk size {size_text[:20]!r}") from exc
            if len(self._raw) < end + 2 + size + 2:
                return
            self._body(bytes(self._raw[end + 2 : end + 2 + size]))
            del self._raw[: end + 2 + size + 2]
            if size == 0:
                self.done = True
                return

    def _body(self, data: bytes) -> None:
        self.body_read += len(data)
        if self.first_text or self.status != 200:
            return
        self._events += data.replace(b"\r\n", b"\n")
        while (end := self._events.find(b"\n\n")) >= 0:
            event = bytes(self._events[:end])
            del self._events[: end + 2]
            if carries_text(event):
                self.first_text = True
                self._events.clear()
                return


class _Connection:
    """One keep-alive connection to `url`'s host (http only), one request at a time."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ProbeError(f"the probe speaks plain http: {url}")
        self.host = f"{parts.hostname}:{parts.port or 80}"
        self.path = parts.path.rstrip("/") + "/completions"
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ttft_s(self, body: bytes) -> float:
        """Send one streamed completion; seconds from sending to its first event with text."""
        request = (
            f"POST {self.path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        response = ResponseReader()
        started = time.perf_counter()
        first: float | None = None
        self.sock.sendall(request)
        while not response.done:
            data = self.sock.recv(65536)
            if not data:
                raise ProbeError("the connection closed mid-response")
            response.feed(data)
            if first is None and response.first_text:
                first = time.perf_counter() - started
        if response.status != 200 or first is None:
            raise ProbeError(
                f"status {response.status}, text {'seen' if first is not None else 'never seen'}"
            )
        return first

    def close(self) -> None:
        self.sock.close()


@dataclass(frozen=True)
class ProbeResult:
    """TTFTs in ms, one per pair that succeeded on both sides, and how many pairs failed."""

    direct_ms: tuple[float, ...]
    gateway_ms: tuple[float, ...]
    errors: int

    def row(self, label: str, repeat: int) -> dict[str, object]:
        direct, gateway = percentile(list(self.direct_ms), 50), percentile(list(self.gateway_ms), 50)
        added = None if direct is None or gateway is None else gateway - direct
        return {
            "label": label, "repeat": repeat, "pairs": len(self.direct_ms), "errors": self.errors,
            "direct_ttft_p50_ms": direct, "gateway_ttft_p50_ms": gateway, "added_ttft_p50_ms": added,
        }  # fmt: skip


def probe(
    direct_url: str,
    gateway_url: str,
    *,
    model: str,
    pairs: int,
    prompt_tokens: int,
    output_tokens: int,
    seed: int = 0,
    warmup_pairs: int = 10,
    timeout_s: float = 30.0,
) -> ProbeResult:
    """`pairs` alternating requests to the engine (`direct_url`, its `/v1`) and through the gateway
    (`gateway_url`), after `warmup_pairs` not counted (module docstring)."""
    rng = random.Random(f"tandem-bench:{seed}:wireprobe")
    times: tuple[list[float], list[float]] = ([], [])
    errors = 0
    connections: tuple[_Connection, _Connection] | None = None
    try:
        for i in range(warmup_pairs + pairs):
            body = orjson.dumps({
                "model": model, "prompt": words(rng, prompt_tokens), "max_tokens": output_tokens,
                "stream": True, "ignore_eos": True,
            })  # fmt: skip
            got: dict[int, float] = {}
            try:
                if connections is None:  # the first pair, or after a failure: connect again
                    connections = _connect(direct_url, gateway_url, timeout_s=timeout_s)
                order = (0, 1) if i % 2 == 0 else (1, 0)
                for side in order:
                    got[side] = connections[side].ttft_s(body) * 1000
            except (ProbeError, OSError):
                errors += 1 if i >= warmup_pairs else 0
                _close(connections)
                connections = None
                continue
            if i >= warmup_pairs:
                times[0].append(got[0])
                times[1].append(got[1])
    finally:
        _close(connections)
    return ProbeResult(direct_ms=tuple(times[0]), gateway_ms=tuple(times[1]), errors=errors)


def _connect(direct_url: str, gateway_url: str, *, timeout_s: float) -> tuple[_Connection, _Connection]:
    direct = _Connection(direct_url, timeout_s=timeout_s)
    try:
        return direct, _Connection(gateway_url, timeout_s=timeout_s)
    except OSError:
        direct.close()
        raise


def _close(connections: tuple[_Connection, _Connection] | None) -> None:
    for connection in connections or ():
        connection.close()
