"""Clocks: the runtime never reads the wall clock directly.

Core code takes a :class:`Clock` so that tests can freeze or advance time
(:class:`jobs_core.testing.ManualClock`) and drivers whose store has its own notion of time (the
database's ``now()``) can decide what is due themselves.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of the current instant.

    ``now()`` answers an aware UTC :class:`~datetime.datetime`; ``monotonic()`` answers seconds
    (``float``) for measuring intervals.
    """

    def now(self) -> datetime:
        """Answer the current instant, aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Answer a monotonic reading in seconds."""
        ...


class SystemClock:
    """The real clock: :func:`datetime.now` in UTC and :func:`time.monotonic`."""

    def now(self) -> datetime:
        """Answer the current instant, aware, in UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """Answer :func:`time.monotonic` in seconds."""
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
"""The process-wide real clock."""
