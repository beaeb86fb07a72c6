"""Calendar buckets in a named IANA zone: what a rollup aggregates by.

A bucket is a local calendar unit (an hour, a day, an ISO week, a month) of one zone, as an
interval of instants ``[start, end)``. Its length follows the zone's clock: a day in
``Europe/Paris`` lasts 23 hours on the spring-forward Sunday and 25 on the fall-back one, and the
repeated hour of a fall-back is two hour buckets (two distinct instants that read 02:00). Fixed
widths in UTC were rejected: a "day" of 24 UTC hours splits a Paris day in two across midnight UTC
and counts one DST day's events into its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobs_core.errors import RollupInvalidError

WIDTHS = ("1h", "1d", "1w", "1mo")
"""The bucket widths: an hour, a day, an ISO week (from Monday), a month."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """A calendar bucket: ``Bucket("1d", "Europe/Paris")``.

    Attributes:
        width: ``"1h"``, ``"1d"``, ``"1w"`` (ISO week, from Monday) or ``"1mo"``.
        tz: the IANA zone whose wall clock draws the buckets (``"UTC"`` by default).

    Raises:
        RollupInvalidError: ``X_JOB_ROLLUP_INVALID`` for another width or an unknown zone.
    """

    width: str = "1h"
    tz: str = "UTC"

    def __post_init__(self) -> None:
        problems = []
        if self.width not in WIDTHS:
            problems.append(f"width: one of {', '.join(WIDTHS)}, got {self.width!r}")
        try:
            if not isinstance(self.tz, str) or not self.tz:
                raise ZoneInfoNotFoundError(self.tz)
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(f"tz: an IANA zone name such as 'Europe/Paris', got {self.tz!r}")
        if problems:
            raise RollupInvalidError("Bucket is declared wrong: " + "; ".join(problems))

    @property
    def zone(self) -> ZoneInfo:
        """The zone."""
        return ZoneInfo(self.tz)

    def start_of(self, instant: datetime) -> datetime:
        """Answer the first instant (UTC) of the bucket holding ``instant`` (aware).

        Raises:
            ValueError: ``instant`` is naive.
        """
        if instant.tzinfo is None:
            raise ValueError("instant: must be an aware datetime")
        local = instant.astimezone(self.zone)
        if self.width == "1h":
            # Keeps the fold: the repeated hour of a fall-back is its own bucket.
            return local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
        day = local.date()
        if self.width == "1w":
            day -= timedelta(days=day.weekday())
        elif self.width == "1mo":
            day = day.replace(day=1)
        return self._midnight(day)

    def after(self, start: datetime) -> datetime:
        """Answer the first instant (UTC) of the bucket after the one starting at ``start``."""
        if self.width == "1h":
            return self.start_of(start + timedelta(hours=1))
        day = start.astimezone(self.zone).date()
        if self.width == "1d":
            return self._midnight(day + timedelta(days=1))
        if self.width == "1w":
            return self._midnight(day + timedelta(days=7))
        following = date(day.year + day.month // 12, day.month % 12 + 1, 1)
        return self._midnight(following)

    def span(self, since: datetime, until: datetime) -> list[tuple[datetime, datetime]]:
        """Answer every bucket ``(start, end)`` from the one holding ``since`` to ``until``'s.

        Both instants are aware; the buckets come in order.
        """
        found = []
        start = self.start_of(since)
        last = self.start_of(until)
        while start <= last:
            end = self.after(start)
            found.append((start, end))
            start = end
        return found

    def _midnight(self, day: date) -> datetime:
        # A midnight the zone skips (fold 0) resolves to the day's first instant.
        return datetime.combine(day, time(0), tzinfo=self.zone).astimezone(UTC)
