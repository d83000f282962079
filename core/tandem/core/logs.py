"""Structured logging: one JSON object per line, carrying the request id of the current context.

Every process calls `configure_logging` once in its composition root. Code logs with the standard
`logging` module and passes structured fields as `extra={...}`; the request id is taken from
`REQUEST_ID` (a contextvar set per request by the HTTP layer), so it never has to be threaded through.

    {"ts": "2026-11-22T03:12:01.123Z", "level": "info", "logger": "tandem.router",
     "msg": "request done", "request_id": "req-5f2c", "status": 200}
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

import orjson

REQUEST_ID: ContextVar[str | None] = ContextVar("tandem_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra=` and is emitted as a field.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """Formats records as single-line JSON objects with `extra` fields and the request id."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key != "request_id":
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines for terminals: `LEVEL logger [request id] message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        fields = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and k != "request_id"
        )
        rid = f" [{request_id}]" if request_id else ""
        line = f"{record.levelname:<7} {record.name}{rid} {record.getMessage()}"
        line = f"{line} {fields}" if fields else line
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure_logging(level: str = "info", *, json_lines: bool = True, stream: TextIO | None = None) -> None:
    """Route the `tandem` loggers (and uvicorn's) to one handler; call once per process (it also
    turns off the collection of caller, thread and process for every record of the process)."""
    # The logging HOWTO's "Optimization": where each call was made (a walk up the stack per record),
    # the thread and the process are never written by these formatters, so records do not collect
    # them. On a busy gateway the walk alone was about a third of a request line's cost
    # (docs/router-performance.md, "Two more tries").
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    # Access logs duplicate our own per-request lines (which carry the request id).
    logging.getLogger("uvicorn.access").disabled = True
