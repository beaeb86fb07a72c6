"""The log lines: batched off a terminal, a warning written at once with the lines before it."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from jobs_core.logs import FLUSH_INTERVAL, LineHandler, LogFormat, configure_logging, log_event


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


FIELDS = {"job": "shop.checkout", "job_id": "0190", "attempt": 2, "outcome": "failed", "code": None}


def _installed(stream: io.StringIO, format: str) -> tuple[LineHandler, list[logging.Handler], int]:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    for handler in before:
        root.removeHandler(handler)
    handler = configure_logging("info", format, stream, caller_info=True)
    handler.batch = False
    return handler, before, level


def _restore(before: list[logging.Handler], level: int) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in before:
        root.addHandler(handler)
    root.setLevel(level)


def _without_clock(line: str, format: str) -> object:
    if format == "json":
        entry = json.loads(line)
        entry.pop("ts")
        return entry
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("format", ["text", "json"])
def test_log_event_writes_the_line_the_logging_module_would(format: str) -> None:
    out = io.StringIO()
    handler, before, level = _installed(out, format)
    try:
        log_event(logging.getLogger("jobs.worker"), logging.INFO, "jobs.attempt.settled", FIELDS)
        fast = out.getvalue()
        record = logging.LogRecord(
            "jobs.worker", logging.INFO, "", 0, "jobs.attempt.settled", (), None
        )
        record.__dict__.update(FIELDS, event="jobs.attempt.settled")
        slow = handler.render(record) + "\n"
    finally:
        _restore(before, level)
    assert fast.count("\n") == 1
    assert _without_clock(fast, format) == _without_clock(slow, format)


def test_log_event_hands_the_record_to_any_other_handler(caplog: pytest.LogCaptureFixture) -> None:
    out = io.StringIO()
    root = logging.getLogger()
    handler = LineHandler(out, LogFormat.TEXT, color=False, batch=False)
    root.addHandler(handler)  # beside caplog's own handler: the record must reach both
    try:
        with caplog.at_level(logging.INFO):
            log_event(
                logging.getLogger("jobs.worker"), logging.INFO, "jobs.attempt.settled", FIELDS
            )
    finally:
        root.removeHandler(handler)
    [record] = [r for r in caplog.records if r.getMessage() == "jobs.attempt.settled"]
    assert record.__dict__["event"] == "jobs.attempt.settled"
    assert record.__dict__["outcome"] == "failed"
    assert "outcome=failed" in out.getvalue()


def test_log_event_honours_a_filter_and_the_level() -> None:
    out = io.StringIO()
    _, before, level = _installed(out, "text")
    logger = logging.getLogger("jobs.worker")
    refuse = logging.Filter("nothing.here")
    logger.addFilter(refuse)
    try:
        log_event(logger, logging.INFO, "jobs.filtered", FIELDS)
        logger.removeFilter(refuse)
        log_event(logger, logging.DEBUG, "jobs.too.low", FIELDS)
        log_event(logger, logging.INFO, "jobs.written", FIELDS)
    finally:
        logger.removeFilter(refuse)
        _restore(before, level)
    events = [line.split()[2] for line in out.getvalue().splitlines()]
    assert events == ["jobs.written"]
