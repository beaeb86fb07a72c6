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
from collections.abc import Mapping
from enum import StrEnum
from itertools import islice
from typing import IO, Any

__all__ = ["FLUSH_INTERVAL", "LineHandler", "LogFormat", "LogLevel", "configure_logging"]

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
            line = self.render(record) + "\n"
            if not self.batch:
                self.stream.write(line)
                return
            with self._waiting:
                pending = self._pending
                pending.append(line)
                self._pending_size += len(line)
                urgent = record.levelno >= logging.WARNING or self._pending_size >= _FLUSH_SIZE
                if not urgent:
                    if len(pending) == 1:  # the flusher waits only while nothing is pending
                        self._start_flusher()
                        self._waiting.notify()
                    return
                lines = self._take()
            self.stream.write(lines)
            self.stream.flush()
        except Exception:
            self.handleError(record)

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
        if self.format_name is LogFormat.JSON:
            return self._json(record)
        return self._text(record)

    def _text(self, record: logging.LogRecord) -> str:
        # This runs once per job at the CLI's default level: one pass over the fields ``extra=``
        # added (after the attributes every record has), the common field types inlined.
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._clock = time.strftime("%H:%M:%S", time.localtime(second))
        attributes = record.__dict__
        event = attributes.get("event")
        message = _message(record)
        if event is None:
            head = f"{record.name}: {message}"
        else:
            head = f"{_EVENT_COLOR}{event}{_RESET}" if self.color else str(event)
            if message != event:
                head += f" {message}"
        levels = _COLORED_LEVELS if self.color else _LEVELS
        level = levels.get(record.levelno) or f"{record.levelname:<7}"
        parts = [f"{self._clock}.{int(record.msecs):03d}", level, head]
        for key, value in islice(attributes.items(), _BASE_ATTRIBUTES, None):
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
        if record.exc_info is not None:
            line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return line

    def _json(self, record: logging.LogRecord) -> str:
        extras = islice(record.__dict__.items(), _BASE_ATTRIBUTES, None)
        fields = {k: v for k, v in extras if k not in _RECORD_ATTRIBUTES}
        event = fields.pop("event", None)
        message = _message(record)
        second = int(record.created)
        if second != self._utc_second:
            self._utc_second = second
            self._utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._utc}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event,
        }
        if event is None or message != event:
            entry["message"] = message
        for key, value in fields.items():
            entry.setdefault(key, value)
        if record.exc_info is not None:
            entry["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return _ENCODE(entry)


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
