"""Retry-After parsing (pure logic)."""

from __future__ import annotations

import email.utils
from datetime import UTC, datetime, timedelta

from jobs_webhooks._delays import retry_after_seconds

NOW = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)


def http_date(at: datetime) -> str:
    return email.utils.format_datetime(at, usegmt=True)


def test_delta_seconds_and_dates() -> None:
    assert retry_after_seconds("120", None, NOW) == 120
    assert retry_after_seconds(" 7 ", None, NOW) == 7
    for bad in (None, "", "-1", "1.5", "soon", "٣"):
        assert retry_after_seconds(bad, None, NOW) is None
    # A date is read against the response's Date (the sender's clock), not ours.
    theirs = NOW - timedelta(hours=1)
    later = http_date(theirs + timedelta(seconds=30))
    assert retry_after_seconds(later, http_date(theirs), NOW) == 30
    # Without a usable Date it is read against when the answer came; the past is "now".
    assert retry_after_seconds(http_date(NOW + timedelta(seconds=9)), None, NOW) == 9
    assert retry_after_seconds(http_date(NOW + timedelta(seconds=9)), "junk", NOW) == 9
    assert retry_after_seconds(http_date(NOW - timedelta(days=1)), None, NOW) == 0
