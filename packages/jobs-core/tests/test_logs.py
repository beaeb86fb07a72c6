"""The log lines: batched off a terminal, a warning written at once with the lines before it."""

from __future__ import annotations

import io
import logging
import time

from jobs_core.logs import FLUSH_INTERVAL, LineHandler, LogFormat, configure_logging


def _record(level: int, event: str) -> logging.LogRecord:
    record = logging.LogRecord("jobs.worker", level, __file__, 1, event, None, None)
    record.__dict__["event"] = event
    return record


def test_info_lines_wait_for_the_batch_and_a_warning_writes_them_in_order() -> None:
    out = io.StringIO()
    handler = LineHandler(out, LogFormat.TEXT, color=False, batch=True)
    handler.handle(_record(logging.INFO, "jobs.first"))
    handler.handle(_record(logging.INFO, "jobs.second"))
    written_at_once = out.getvalue()

    handler.handle(_record(logging.WARNING, "jobs.third"))

    assert written_at_once == ""
    events = [line.split()[2] for line in out.getvalue().splitlines()]
    assert events == ["jobs.first", "jobs.second", "jobs.third"]


def test_a_batch_is_written_by_the_flusher_without_another_record() -> None:
    out = io.StringIO()
    handler = LineHandler(out, LogFormat.JSON, batch=True)
    handler.handle(_record(logging.INFO, "jobs.alone"))
    deadline = time.monotonic() + 30  # generous: the flusher waits FLUSH_INTERVAL (0.1 s)
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(FLUSH_INTERVAL / 4)
    assert '"event":"jobs.alone"' in out.getvalue()


def test_configure_logging_replaces_its_handler_and_flushes_the_old_one() -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    first, second = io.StringIO(), io.StringIO()
    try:
        # caller_info=True: leave this test process's logging module collecting as it was.
        configure_logging("info", "text", first, caller_info=True).batch = True
        logging.getLogger("jobs.test").info("jobs.one", extra={"event": "jobs.one"})
        configure_logging("info", "json", second, caller_info=True)
        logging.getLogger("jobs.test").info("jobs.two", extra={"event": "jobs.two"})

        assert "jobs.one" in first.getvalue() and "jobs.two" not in first.getvalue()
        assert [type(h) for h in root.handlers].count(LineHandler) == 1
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)
