"""Log lines a worker can afford: one per record, plain text or JSON, written straight out.

The library logs structured records whose message is an event name (``jobs.attempt.settled``)
and whose ``extra=`` fields say what it concerns; at INFO a worker writes one per job.
:class:`LineHandler` turns each into one line on a stream with no more work than the line needs:

- ``text``: ``20:41:07.123 INFO    jobs.attempt.settled job=shop.checkout outcome=completed``
  (fields that are ``None`` left out), the level and event coloured (ANSI) only when the stream
  is a terminal and ``NO_COLOR`` is unset;
- ``json``: one object per line (``ts`` in UTC ISO 8601, ``level``, ``logger``, ``event``, the
  fields, ``exc`` for a traceback), for a log collector.

When the stream is not a terminal (a pipe to a log collector, a file), INFO and DEBUG lines are
written in batches: at most :data:`FLUSH_INTERVAL` late, or once 64 KiB are waiting, by a flusher
thread; a WARNING or worse is written at once, with every line before it. One write per line
made the reading end of a pipe (a collector, a container runtime) wake per job, which on a busy
machine took more from the worker than rendering the lines. A worker killed with SIGKILL may lose
its last ``FLUSH_INTERVAL`` of INFO lines; ``logging.shutdown`` at a normal exit writes them.

The worker's one line per job goes through :func:`log_event`: when the record would reach only
this module's handler (the ``jobsctl`` setup: no other handler, filter or ``logging.disable`` in
the way), the line is rendered straight from the event's fields, without a ``LogRecord``; about
half of a line's cost was the logging module building the record. Anything else installed (a
test's capture, an application's handler) sees the same record the logging module would build.

Rejected: rendering each record through rich (the CLI did): laying out one styled line per job
cost a pg worker at the CLI's default level 3-5x its throughput at ``warning``. Rich stays for
what people read at a terminal: the demo's narration and the operator commands' tables.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from enum import StrEnum
from itertools import islice
from types import TracebackType
from typing import IO, Any

__all__ = [
    "FLUSH_INTERVAL",
    "LineHandler",
    "LogFormat",
    "LogLevel",
    "configure_logging",
    "log_event",
]

FLUSH_INTERVAL = 0.1
"""Seconds an INFO line may wait before it is written, when the stream is not a terminal."""

_FLUSH_SIZE = 64 * 1024
"""Characters of waiting lines that are written at once, whatever their age."""


class LogLevel(StrEnum):
    """The ``--log-level`` choices."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(StrEnum):
    """The ``--log-format`` choices: readable lines, or JSON objects one a line."""

    TEXT = "text"
    JSON = "json"


# Attributes every LogRecord has; anything else on a record came from ``extra=``, which
# Logger.makeRecord adds after them (a formatter may add ``message`` and ``asctime`` later).
_BASE = logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
_BASE_ATTRIBUTES = len(_BASE)
_RECORD_ATTRIBUTES = frozenset(_BASE) | {"message", "asctime", "taskName"}

_COLORS = {
    logging.DEBUG: "\x1b[2m",
    logging.INFO: "\x1b[32m",
    logging.WARNING: "\x1b[33m",
    logging.ERROR: "\x1b[1;31m",
    logging.CRITICAL: "\x1b[1;37;41m",
}
_PLAIN = frozenset({int, bool, float})
"""Field types written as ``str(value)`` (never spaced, never empty)."""

# json.dumps with options builds an encoder per call; one is built here.
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode

_EVENT_COLOR = "\x1b[1;36m"
_RESET = "\x1b[0m"
_LEVELS = {number: f"{logging.getLevelName(number):<7}" for number in _COLORS}
_COLORED_LEVELS = {number: f"{_COLORS[number]}{name}{_RESET}" for number, name in _LEVELS.items()}
_LOWER_LEVELS = {number: logging.getLevelName(number).lower() for number in _COLORS}

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def _message(record: logging.LogRecord) -> str:
    """Answer the record's message (``getMessage`` without its work for a plain one)."""
    if not record.args and record.msg.__class__ is str:
        return record.msg
    return record.getMessage()


class LineHandler(logging.Handler):
    """Write each record as one line (see the module docstring) to ``stream``.

    Args:
        stream: where the lines go (default: ``sys.stderr`` at the time of each write, so a
            test's capture or a redirect is honoured).
        format: :attr:`LogFormat.TEXT` or :attr:`LogFormat.JSON`.
        level: the least severe level written.
        color: colour the level and event of text lines; default: when ``stream`` is a terminal
            and ``NO_COLOR`` is unset.
        batch: write INFO and DEBUG lines in batches (see the module docstring); default: when
            ``stream`` is not a terminal.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        format: LogFormat = LogFormat.TEXT,
        level: int = logging.NOTSET,
        color: bool | None = None,
        batch: bool | None = None,
    ) -> None:
        super().__init__(level)
        self._stream = stream
        self.format_name = LogFormat(format)
        target = stream if stream is not None else sys.stderr
        terminal = bool(getattr(target, "isatty", lambda: False)())
        self.color = color if color is not None else terminal and "NO_COLOR" not in os.environ
        self.batch = batch if batch is not None else not terminal
        # The "HH:MM:SS" of the last second a line was written in (one strftime a second).
        self._second = -1
        self._clock = ""
        self._utc_second = -1
        self._utc = ""
        self._pending: list[str] = []
        self._pending_size = 0
        self._waiting = threading.Condition(threading.Lock())
        self._flusher: threading.Thread | None = None

    @property
    def stream(self) -> IO[str]:
        """The stream written to."""
        return self._stream if self._stream is not None else sys.stderr

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record``'s line, or queue it for the next batch (see ``batch``)."""
        try:
            self._write(self.render(record) + "\n", record.levelno)
        except Exception:
            self.handleError(record)

    def write_event(self, level: int, logger: str, event: str, fields: Mapping[str, Any]) -> None:
        """Write the line a record of ``event`` with ``extra=fields`` would make, with no record.

        :func:`log_event` calls it once it knows this handler is the only one the record would
        reach; the line is the one :meth:`render` makes of that record.
        """
        now = time.time()
        msecs = int((now - int(now)) * 1000)
        line = self._json_line if self.format_name is LogFormat.JSON else self._text_line
        try:
            self._write(
                line(now, msecs, level, logger, event, event, fields.items(), None) + "\n", level
            )
        except Exception:
            self.handleError(_event_record(level, logger, event, fields))

    def _write(self, line: str, level: int) -> None:
        if not self.batch:
            self.acquire()  # emit holds it already (an RLock); write_event does not
            try:
                self.stream.write(line)
            finally:
                self.release()
            return
        with self._waiting:
            pending = self._pending
            pending.append(line)
            self._pending_size += len(line)
            urgent = level >= logging.WARNING or self._pending_size >= _FLUSH_SIZE
            if not urgent:
                if len(pending) == 1:  # the flusher waits only while nothing is pending
                    self._start_flusher()
                    self._waiting.notify()
                return
            lines = self._take()
        self.stream.write(lines)
        self.stream.flush()

    def _take(self) -> str:
        """Answer the waiting lines as one text and forget them (the caller holds the lock)."""
        lines = "".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        return lines

    def _start_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="jobs-log-flusher", daemon=True
            )
            self._flusher.start()

    def _flush_loop(self) -> None:
        while True:
            with self._waiting:
                while not self._pending:
                    self._waiting.wait()
            time.sleep(FLUSH_INTERVAL)
            self.flush()

    def flush(self) -> None:
        """Write every waiting line now (``logging.shutdown`` calls it at exit)."""
        with self._waiting:
            lines = self._take()
        if lines:
            try:
                self.stream.write(lines)
                self.stream.flush()
            except Exception:  # the stream went away (a closed pipe): nothing left to tell
                return

    def render(self, record: logging.LogRecord) -> str:
        """Answer the line for ``record`` (without its newline)."""
        line = self._json_line if self.format_name is LogFormat.JSON else self._text_line
        attributes = record.__dict__
        return line(
            record.created,
            int(record.msecs),
            record.levelno,
            record.name,
            attributes.get("event"),
            _message(record),
            islice(attributes.items(), _BASE_ATTRIBUTES, None),
            record.exc_info,
        )

    def _text_line(
        self,
        created: float,
        msecs: int,
        level: int,
        logger: str,
        event: object,
        message: str,
        fields: Iterable[tuple[str, Any]],
        exc_info: _ExcInfo | None,
    ) -> str:
        # This runs once per job at the CLI's default level: one pass over the fields ``extra=``
        # added (after the attributes every record has), the common field types inlined.
        second = int(created)
        if second != self._second:
            self._second = second
            self._clock = time.strftime("%H:%M:%S", time.localtime(second))
        if event is None:
            head = f"{logger}: {message}"
        else:
            head = f"{_EVENT_COLOR}{event}{_RESET}" if self.color else str(event)
            if message != event:
                head += f" {message}"
        levels = _COLORED_LEVELS if self.color else _LEVELS
        name = levels.get(level) or f"{logging.getLevelName(level):<7}"
        parts = [f"{self._clock}.{msecs:03d}", name, head]
        for key, value in fields:
            if key == "event" or key in _RECORD_ATTRIBUTES:
                continue
            kind = value.__class__
            if kind is str:
                quiet = value and " " not in value and "\n" not in value and "\t" not in value
                parts.append(f"{key}={value}" if quiet else f"{key}={value!r}")
            elif kind in _PLAIN:
                parts.append(f"{key}={value}")
            elif value is None:  # an unset field (no error on a completed attempt): left out
                continue
            else:
                parts.append(f"{key}={_field_text(value)}")
        line = " ".join(parts)
        if exc_info is not None and exc_info[0] is not None:
            line += "\n" + "".join(traceback.format_exception(*exc_info)).rstrip()
        return line

    def _json_line(
        self,
        created: float,
        msecs: int,
        level: int,
        logger: str,
        event: object,
        message: str,
        fields: Iterable[tuple[str, Any]],
        exc_info: _ExcInfo | None,
    ) -> str:
        second = int(created)
        if second != self._utc_second:
            self._utc_second = second
            self._utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._utc}.{msecs:03d}Z",
            "level": _LOWER_LEVELS.get(level) or logging.getLevelName(level).lower(),
            "logger": logger,
            "event": event,
        }
        if event is None or message != event:
            entry["message"] = message
        for key, value in fields:
            if key != "event" and key not in _RECORD_ATTRIBUTES:
                entry.setdefault(key, value)
        if exc_info is not None and exc_info[0] is not None:
            entry["exc"] = "".join(traceback.format_exception(*exc_info)).rstrip()
        return _ENCODE(entry)


def _event_record(
    level: int, logger: str, event: str, fields: Mapping[str, Any]
) -> logging.LogRecord:
    """Answer the record the logging module would make of ``event`` (for a handler's error)."""
    record = logging.LogRecord(logger, level, "", 0, event, None, None)
    record.__dict__.update(fields)
    record.__dict__["event"] = event
    return record


def _sole_line_handler(logger: logging.Logger, level: int) -> LineHandler | None:
    """Answer the :class:`LineHandler` that alone would write ``logger``'s record at ``level``.

    ``None`` when anything else could see or stop the record: a filter on ``logger``, a
    handler on it or on a parent before the root, a parent that does not propagate, another
    handler on the root (pytest's ``caplog``, an application's own), or the handler's level.
    A parent logger's filters never apply to a propagated record, so they are not asked.
    """
    if logger.filters or logger.disabled:
        return None
    node: logging.Logger | None = logger
    while node is not None:
        handlers = node.handlers
        if node.parent is None:
            if len(handlers) != 1:
                return None
            handler = handlers[0]
            if handler.__class__ is not LineHandler or handler.filters or handler.level > level:
                return None
            return handler
        if handlers or not node.propagate:
            return None
        node = node.parent
    return None


def log_event(logger: logging.Logger, level: int, event: str, fields: Mapping[str, Any]) -> None:
    """Log ``event`` (the message and the ``event`` field) with ``fields`` as ``extra=``.

    The same as ``logger.log(level, event, extra={"event": event, **fields})``, but when only
    this module's handler would see the record the line is written without building one (see
    the module docstring). ``fields`` must not name a ``LogRecord`` attribute.

    Args:
        logger: the logger the record belongs to (its name is the line's logger).
        level: a ``logging`` level number.
        event: the event name, e.g. ``"jobs.attempt.settled"``.
        fields: the line's fields, in the order written; ``None`` values are left out of text
            lines.
    """
    if not logger.isEnabledFor(level):
        return
    handler = _sole_line_handler(logger, level)
    if handler is None:
        logger.log(level, event, extra={"event": event, **fields})
        return
    handler.write_event(level, logger.name, event, fields)


_SPACE = re.compile(r"\s").search


def _field_text(value: object) -> str:
    """Answer a field's text: ``key=value``, quoted when empty or spaced, JSON for a mapping."""
    if value.__class__ is str:
        text: str = value
    elif isinstance(value, Mapping):
        return json.dumps(value, separators=(",", ":"), default=str)
    elif isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(item) for item in value)
    else:
        text = str(value)
    return repr(text) if not text or _SPACE(text) else text


def configure_logging(
    level: LogLevel | str = LogLevel.INFO,
    format: LogFormat | str = LogFormat.TEXT,
    stream: IO[str] | None = None,
    *,
    caller_info: bool = False,
) -> LineHandler:
    """Send every log record at ``level`` or above through one :class:`LineHandler`.

    Replaces a handler an earlier call installed, so calling it twice does not print twice.
    ``jobsctl`` calls it for ``--log-level`` and ``--log-format``; a process that runs
    :class:`~jobs_core.worker.Worker` itself may call it too.

    Args:
        level: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``.
        format: ``"text"`` or ``"json"``.
        stream: where the lines go (default: stderr).
        caller_info: keep the logging module collecting, for every record, what no line here
            shows: the caller's file, line and function (a walk up the stack), the thread and
            the process. ``False`` (the default) turns that off process-wide, as the logging
            HOWTO's "Optimization" section describes; pass ``True`` when another handler of
            the process prints ``%(lineno)d`` or ``%(threadName)s``.

    Returns:
        The installed handler.

    Raises:
        ValueError: an unknown level or format.
    """
    if not caller_info:
        # Measured on a memory-driver drain: the stack walk alone cost more per record than
        # rendering the line.
        logging._srcfile = None
        logging.logThreads = False
        logging.logProcesses = False
        logging.logMultiprocessing = False
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, LineHandler):
            handler.flush()
            root.removeHandler(handler)
    numeric = logging.getLevelNamesMapping()[LogLevel(level).value.upper()]
    handler = LineHandler(stream, LogFormat(format), numeric)
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler
