"""How long a throttled delivery was asked to wait: ``Retry-After`` read both ways.

A receiver that answers 429 or 503 with ``Retry-After`` is called back no sooner than it asked
(:meth:`jobs_core.Retry.after_ms` turns the ask into the delay, jittered later, never sooner).
An HTTP-date is read against the response's own ``Date``: the receiver's clock, not ours, says
when "later" is.
"""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime


def retry_after_seconds(value: str | None, date: str | None, received: datetime) -> float | None:
    """Answer the wait a ``Retry-After`` header asks for, in seconds, or ``None``.

    Args:
        value: the header: delta-seconds (``"120"``) or an HTTP-date.
        date: the response's own ``Date`` header: an HTTP-date is read against it (the sender's
            clock), falling back to ``received`` when it is missing or unreadable.
        received: when the response arrived (aware).

    Returns:
        Seconds to wait (``>= 0``; a date in the past is 0), or ``None`` for a missing or
        unreadable header.
    """
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        return float(int(text[:12]))
    when = _http_date(text)
    if when is None:
        return None
    base = _http_date(date) if date else None
    return max(0.0, (when - (base or received)).total_seconds())


def _http_date(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    # HTTP-dates are GMT; one written without a zone parses as naive.
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
