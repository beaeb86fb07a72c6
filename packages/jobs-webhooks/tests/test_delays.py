"""Retry-After parsing and the throttled delay (pure logic: properties over every input)."""

from __future__ import annotations

import email.utils
import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from jobs_webhooks._delays import THROTTLE_SPREAD, retry_after_seconds, throttle_delay_ms

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


@given(asked=st.integers(0, 10**9), cap=st.integers(1, 10**8), seed=st.integers())
def test_a_throttled_delay_is_never_sooner_than_asked_below_the_cap(
    asked: int, cap: int, seed: int
) -> None:
    delay = throttle_delay_ms(asked, cap, jitter=True, rng=random.Random(seed))
    if asked < cap:
        assert asked <= delay <= min(cap, asked + asked * THROTTLE_SPREAD)
    else:
        assert cap - cap * THROTTLE_SPREAD <= delay <= cap
    assert throttle_delay_ms(asked, cap, jitter=False, rng=random.Random(seed)) == min(asked, cap)
