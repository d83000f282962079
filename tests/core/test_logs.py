"""The process's log lines: one JSON object each, with the request id and the `extra` fields."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import orjson
import pytest

from tandem.core.logs import REQUEST_ID, configure_logging


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """`configure_logging` changes process-wide settings: put them back for the other tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    flags = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    uvicorn = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate)
        for name in ("uvicorn", "uvicorn.error")
    }
    access = logging.getLogger("uvicorn.access").disabled
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags
    for name, (kept, propagate) in uvicorn.items():
        logging.getLogger(name).handlers = kept
        logging.getLogger(name).propagate = propagate
    logging.getLogger("uvicorn.access").disabled = access


@pytest.mark.usefixtures("restored_logging")
def test_a_request_line_is_one_json_object_with_the_request_id_and_its_fields() -> None:
    out = io.StringIO()
    configure_logging("info", stream=out)
    token = REQUEST_ID.set("req-1")
    try:
        logging.getLogger("tandem.router").info("request", extra={"status": 200, "route": "/v1/completions"})
    finally:
        REQUEST_ID.reset(token)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    entry = orjson.loads(lines[0])
    assert entry["level"] == "info" and entry["logger"] == "tandem.router" and entry["msg"] == "request"
    assert entry["request_id"] == "req-1"
    assert entry["status"] == 200 and entry["route"] == "/v1/completions"
    # Standard record attributes are not fields: only the extras are.
    assert set(entry) == {"ts", "level", "logger", "msg", "request_id", "status", "route"}


@pytest.mark.usefixtures("restored_logging")
def test_records_do_not_walk_the_stack_for_their_caller_once_configured() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    configure_logging("info", stream=io.StringIO())
    logging.getLogger().addHandler(Keep())
    logging.getLogger("tandem.router").info("request")
    (record,) = records
    # No caller frame, thread or process looked up: the formatters write none of them.
    assert (record.funcName, record.lineno) == ("(unknown function)", 0)
    assert record.thread is None and record.process is None and record.processName is None
