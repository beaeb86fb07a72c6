"""The cron resolver: when a task's cron expression fires, in a real IANA time zone.

:class:`CronSchedule` pairs a 5-field cron expression with an IANA zone and answers occurrences as
aware UTC :class:`~datetime.datetime` values. The scheduler (``10-core.md`` §6) uses it for
``next_task_run``, for catch-up after downtime and for describing a task; it reads no clock and
holds no state other than an evaluation counter.

What an occurrence is
---------------------
croniter matches *wall-clock* times (it is given naive local times, so it does plain calendar
arithmetic and never sees an offset). This module maps each matching wall time to real instants:

* **Ordinary wall time** (exists exactly once): fires at that instant.
* **Skipped wall time** (spring-forward gap, e.g. 02:30 in America/New_York on 2021-03-14): fires
  **once, at the first instant after the gap** (03:00 EDT = 07:00 UTC). Several matching wall
  times inside one gap, and a match on the first wall time after it, collapse into that one
  firing; a skipped wall time is never answered.
* **Repeated wall time** (fall-back, e.g. 01:30 in America/New_York on 2021-11-07):

  - when the **hour field covers all 24 hours** (``*``, ``*/1``, ``0-23``; see
    :attr:`CronSchedule.every_hour`) the cron fires on **both passes**, because each pass is a
    distinct minute of real time. ``* * * * *`` keeps firing every elapsed minute and
    ``30 * * * *`` every elapsed hour through the night DST ends (FIELD-FAILURES C13: a
    heartbeat must not stop for an hour);
  - otherwise (a cron that names its hours, e.g. ``30 1 * * *`` or ``*/5 1-3 * * *``) each
    repeated wall time fires **once, on the first pass** (``fold=0``, the earlier instant). A
    nightly job meant for "01:30" does not run twice.

  Rejected alternative: one rule for every cron ("each wall time fires once"). It is simpler but
  leaves an every-minute job silent for the whole repeated hour, which is the C13 failure.
  Rejected too: dropping skipped wall times for every-hour crons (Vixie cron's choice). The spec
  states one gap rule for all crons, and in zones with a 30-minute shift (Australia/Lord_Howe)
  dropping ``0 * * * *`` at 02:00 leaves a 90-minute hole, whereas firing at the gap's end does
  not.

Day-of-month and day-of-week
----------------------------
When both are restricted (neither is ``*``), POSIX OR semantics apply, as croniter does by
default: ``0 0 1 * 1`` fires on the 1st of every month **and** on every Monday (FIELD-FAILURES
C16). :attr:`CronSchedule.restricts_both_days` says when that applies so a declaration can warn.
A day field is unrestricted only when written ``*`` (or ``?``); any other form counts as
restricted, even one that covers every day: ``0 0 */1 * 1`` fires every day. There is no AND mode;
"the first Friday" is written ``0 11 * * 5#1``.

Accepted expressions
--------------------
Exactly five fields (minute hour day-of-month month day-of-week), plus what croniter accepts inside
them (names such as ``mon``/``jan``, ``L``, ``W``, ``#``) and its ``@daily``-style aliases. A sixth
(seconds) or seventh (year) field is refused: occurrences are whole minutes, which is also the
granularity the scheduler keys its (schedule, instant) uniqueness on, and croniter puts seconds
*last* by default, which readers of other cron dialects misread. ``H`` (hashed) fields are refused
because they need a per-task seed this module does not take. An expression that can never fire
(``0 0 30 2 *``) is refused too. So is an equal range such as ``3-3`` or ``mon-mon``: croniter
7 deliberately reads it as the *whole* cycle (``0 3-3 * * *`` fires every hour), where other cron
dialects read it as the one value; the message asks for the value alone (``3``).

Catch-up
--------
:meth:`CronSchedule.latest_at_or_before` finds the latest occurrence of a window by bisection on
time, one :meth:`~CronSchedule.next_after` per halving, so a five-year outage of a minutely task
costs about 30 croniter evaluations, not 2.6 million (:attr:`CronSchedule.evaluations` counts
them).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from jobs_core.errors import JobDeclarationInvalidError

__all__ = ["CronSchedule"]

_ONE_SECOND = timedelta(seconds=1)
_CRON_FIELDS = 5
_VALIDATION_START = datetime(2000, 1, 1)
"""Where construction looks for a first occurrence (naive wall time; croniter searches 50 years)."""
_ALL_HOURS = frozenset(str(h) for h in range(24))


class _Counter:
    """A thread-safe running total of croniter evaluations."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, amount: int = 1) -> None:
        with self._lock:
            self.value += amount


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A cron expression evaluated in an IANA time zone; answers occurrences in UTC.

    Immutable and validated at construction. Equality and hashing use ``expr`` and ``tz`` only.
    Safe to share between threads.

    Args:
        expr: a 5-field cron expression (minute hour day-of-month month day-of-week), e.g.
            ``"0 3 * * *"``; croniter's names, ``L``/``W``/``#`` and ``@daily``-style aliases are
            accepted. Seconds and year fields are refused (see the module docstring).
        tz: an IANA zone name that :class:`zoneinfo.ZoneInfo` loads, e.g. ``"Europe/Paris"``.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` when ``expr`` or ``tz`` is bad;
            the message names every bad field (``cron``, ``tz``) with its fix, and ``meta``
            carries ``problems`` as ``{field: message}``.

    Example:
        >>> nightly = CronSchedule("30 2 * * *", "America/New_York")
        >>> nightly.next_after(datetime(2021, 3, 14, 5, 0, tzinfo=UTC)).isoformat()
        '2021-03-14T07:00:00+00:00'
    """

    expr: str
    tz: str
    _zone: ZoneInfo = field(init=False, repr=False, compare=False, hash=False)
    _croniter: croniter[datetime] = field(init=False, repr=False, compare=False, hash=False)
    _lock: threading.Lock = field(init=False, repr=False, compare=False, hash=False)
    _counter: _Counter = field(init=False, repr=False, compare=False, hash=False)
    _every_hour: bool = field(init=False, repr=False, compare=False, hash=False)
    _both_days: bool = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        """Validate ``expr`` and ``tz`` together, then cache the parsed forms."""
        problems: dict[str, str] = {}
        zone = _load_zone(self.tz, problems)
        parsed = _parse_cron(self.expr, problems)
        if problems:
            raise JobDeclarationInvalidError(
                "; ".join(f"{name}: {text}" for name, text in problems.items()),
                problems=problems,
                cron=self.expr if isinstance(self.expr, str) else repr(self.expr),
                tz=self.tz if isinstance(self.tz, str) else repr(self.tz),
            )
        assert zone is not None and parsed is not None  # problems is empty
        hours, days, weekdays = parsed.expanded[1], parsed.expanded[2], parsed.expanded[4]
        set_ = object.__setattr__
        set_(self, "_zone", zone)
        set_(self, "_croniter", parsed)
        set_(self, "_lock", threading.Lock())
        set_(self, "_counter", _Counter())
        set_(self, "_every_hour", hours[0] == "*" or {str(h) for h in hours} >= _ALL_HOURS)
        set_(self, "_both_days", days[0] != "*" and weekdays[0] != "*")

    def __reduce__(self) -> tuple[type[CronSchedule], tuple[str, str]]:
        """Pickle and copy as ``(expr, tz)``: the parsed forms and the lock are rebuilt."""
        return (CronSchedule, (self.expr, self.tz))

    # -- public properties ------------------------------------------------------------------

    @property
    def zone(self) -> ZoneInfo:
        """The loaded :class:`~zoneinfo.ZoneInfo` for :attr:`tz`."""
        return self._zone

    @property
    def restricts_both_days(self) -> bool:
        """Whether day-of-month and day-of-week are both restricted.

        When ``True``, POSIX OR semantics apply: a day matching *either* field fires
        (``0 0 1 * 1`` fires on the 1st and on every Monday). A task declaration should warn.
        A day field is unrestricted only when written ``*`` (or ``?``).
        """
        return self._both_days

    @property
    def every_hour(self) -> bool:
        """Whether the hour field covers all 24 hours (``*``, ``*/1``, ``0-23``).

        Such crons fire on both passes of a repeated (fall-back) wall time, so they never fall
        silent for the repeated hour; crons that name their hours fire there once, on the first
        pass. See the module docstring.
        """
        return self._every_hour

    @property
    def evaluations(self) -> int:
        """How many croniter evaluations this schedule has made since construction (``int``).

        Counts calls to croniter's ``get_next`` (the validation at construction excluded). Tests
        use the difference across a call to show that bisection costs O(log gap).
        """
        return self._counter.value

    # -- queries ------------------------------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime:
        """Answer the first occurrence strictly after ``instant``.

        Args:
            instant: an aware :class:`~datetime.datetime` in any zone.

        Returns:
            The occurrence as an aware UTC ``datetime`` (``tzinfo=UTC``), later than ``instant``.
            Wall times are evaluated in :attr:`tz` with the DST rules of the module docstring.

        Raises:
            ValueError: ``instant`` is naive (the message names ``instant``); or no occurrence
                exists before the end of the ``datetime`` range (croniter's error, a subclass).
        """
        return self._next(_as_utc(instant, "instant"))

    def occurrences_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Answer the occurrences in ``(after, until]``, earliest first, at most ``limit`` of them.

        Used for ``run-all`` catch-up (a bounded walk) and ``run-once`` (``limit=1``). Costs one
        :meth:`next_after` per occurrence returned, plus one.

        Args:
            after: aware lower bound, excluded.
            until: aware upper bound, included.
            limit: the most occurrences to answer (``int`` >= 0).

        Returns:
            Aware UTC ``datetime`` values, strictly increasing; empty when ``until <= after``.

        Raises:
            ValueError: ``after`` or ``until`` is naive, or ``limit`` is negative or not an
                ``int`` (the message names the argument).
        """
        start = _as_utc(after, "after")
        end = _as_utc(until, "until")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        found: list[datetime] = []
        cursor = start
        while len(found) < limit and cursor < end:
            cursor = self._next(cursor)
            if cursor > end:
                break
            found.append(cursor)
        return found

    def latest_at_or_before(self, instant: datetime, not_before: datetime) -> datetime | None:
        """Answer the latest occurrence in ``(not_before, instant]``, or ``None`` if there is none.

        This is ``skip`` catch-up after an outage: only the latest missed occurrence fires. It is
        found by bisection on time, never by walking: each step asks :meth:`next_after` once at
        the midpoint of the interval still in doubt, so the cost is about
        ``log2(gap in seconds)`` evaluations (≈ 28 for five years) whatever the cron's frequency.

        Args:
            instant: aware upper bound, included (usually "now").
            not_before: aware lower bound, excluded (usually the task's watermark).

        Returns:
            An aware UTC ``datetime``, or ``None`` when no occurrence lies in the window (also
            when ``instant <= not_before``).

        Raises:
            ValueError: either argument is naive (the message names it).
        """
        hi = _as_utc(instant, "instant")
        lo = _as_utc(not_before, "not_before")
        if hi <= lo:
            return None
        best = self._next(lo)
        if best > hi:
            return None
        # Invariant: ``best`` is an occurrence <= hi, and no occurrence lies in (hi, instant],
        # so the answer is in [best, hi]. Occurrences are whole seconds, at least one second
        # apart, so once the interval is shorter than a second ``best`` is the answer.
        while hi - best >= _ONE_SECOND:
            mid = best + (hi - best) / 2
            candidate = self._next(mid)
            if candidate <= hi:
                best = candidate
            else:
                hi = mid
        return best

    # -- resolution ---------------------------------------------------------------------------

    def _next(self, instant: datetime) -> datetime:
        """Answer the occurrence strictly after ``instant`` (aware UTC); see :meth:`next_after`."""
        local = instant.astimezone(self._zone)
        # Occurrences, offsets and transitions are whole seconds, so flooring the wall time to
        # the second changes no answer and keeps the span arithmetic below exact.
        wall = local.replace(tzinfo=None, fold=0, microsecond=0)
        if not self._is_repeated(wall):
            return self._resolve(self._next_wall(wall))
        fold_start, fold_end = self._repeated_span(wall)
        candidate = self._next_wall(wall)
        if local.fold == 0:
            # First pass: a later match in the first pass comes before every second-pass instant.
            if candidate < fold_end:
                return self._to_utc(candidate, fold=0)
            if self._every_hour:
                # The second pass re-reads [fold_start, fold_end); its earliest match is next.
                again = self._next_wall(fold_start - _ONE_SECOND)
                if again < fold_end:
                    return self._to_utc(again, fold=1)
            return self._resolve(candidate)
        # Second pass: the first-pass instants of these wall times are already behind us.
        if candidate < fold_end:
            if self._every_hour:
                return self._to_utc(candidate, fold=1)
            candidate = self._next_wall(fold_end - _ONE_SECOND)
        return self._resolve(candidate)

    def _next_wall(self, wall: datetime) -> datetime:
        """Answer croniter's next matching naive wall time strictly after ``wall``.

        ``wall`` is naive and a whole second (croniter's float timestamps are then exact).
        """
        self._counter.add()
        with self._lock:
            return self._croniter.get_next(datetime, start_time=wall)

    def _resolve(self, wall: datetime) -> datetime:
        """Map a matching naive wall time that is not in a repeated span being handled to UTC."""
        first = self._to_utc(wall, fold=0)
        if first.astimezone(self._zone).replace(tzinfo=None) == wall:
            return first  # exists; for a repeated wall time this is the first pass
        # Skipped: fire at the first instant after the gap.
        other = self._to_utc(wall, fold=1)
        return _transition(self._zone, min(first, other), max(first, other))

    def _to_utc(self, wall: datetime, *, fold: int) -> datetime:
        return wall.replace(tzinfo=self._zone, fold=fold).astimezone(UTC)

    def _is_repeated(self, wall: datetime) -> bool:
        """Whether the naive ``wall`` time exists twice (a fall-back span)."""
        first = wall.replace(tzinfo=self._zone, fold=0)
        second = wall.replace(tzinfo=self._zone, fold=1)
        if first.utcoffset() == second.utcoffset():
            return False
        # The offsets also differ inside a gap; a repeated time survives the round trip.
        return first.astimezone(UTC).astimezone(self._zone).replace(tzinfo=None) == wall

    def _repeated_span(self, wall: datetime) -> tuple[datetime, datetime]:
        """Answer the naive wall-time span ``[start, end)`` that repeats and contains ``wall``."""
        first = self._to_utc(wall, fold=0)
        second = self._to_utc(wall, fold=1)
        at = _transition(self._zone, first, second)
        before = first.astimezone(self._zone).utcoffset()
        after = second.astimezone(self._zone).utcoffset()
        assert before is not None and after is not None  # aware in a ZoneInfo
        naive = at.replace(tzinfo=None)
        return naive + after, naive + before


def _transition(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """Answer the first instant in ``(lo, hi]`` whose UTC offset in ``zone`` is ``hi``'s.

    ``lo`` and ``hi`` are aware UTC whole seconds with one offset change between them; tzdata
    transitions fall on whole seconds, so bisection over seconds is exact (about 12 steps for an
    hour, no croniter evaluation).
    """
    target = hi.astimezone(zone).utcoffset()
    while hi - lo > _ONE_SECOND:
        mid = lo + timedelta(seconds=(hi - lo) // _ONE_SECOND // 2)
        if mid.astimezone(zone).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return hi


def _as_utc(value: datetime, name: str) -> datetime:
    """Answer ``value`` converted to UTC, refusing naive datetimes with a ``ValueError``."""
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be an aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{name} must be an aware datetime (e.g. datetime.now(UTC)), got naive {value!r}"
        )
    return value.astimezone(UTC)


def _load_zone(tz: object, problems: dict[str, str]) -> ZoneInfo | None:
    fix = (
        "use a full IANA name such as 'America/Bogota' or 'Europe/Paris' "
        "(and install tzdata where the system has no zone database)"
    )
    if not isinstance(tz, str) or not tz.strip():
        problems["tz"] = f"{tz!r} is not an IANA time zone name; {fix}"
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        problems["tz"] = f"{tz!r} is not an IANA time zone zoneinfo can load ({exc}); {fix}"
        return None


def _parse_cron(expr: object, problems: dict[str, str]) -> croniter[datetime] | None:
    fix = (
        "write five fields 'minute hour day-of-month month day-of-week', e.g. '0 3 * * *' "
        "(no seconds or year field)"
    )
    if not isinstance(expr, str) or not expr.strip():
        problems["cron"] = f"{expr!r} is not a cron expression; {fix}"
        return None
    equal = _equal_range(expr)
    if equal is not None:
        problems["cron"] = (
            f"{expr!r} uses the equal range {equal!r}, which croniter reads as the whole cycle, "
            f"not one value; write the value alone ({equal.split('-')[0]!r})"
        )
        return None
    try:
        parsed = croniter(expr, _VALIDATION_START, ret_type=datetime)
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        problems["cron"] = f"{expr!r} does not parse ({exc}); {fix}"
        return None
    if len(parsed.expanded) != _CRON_FIELDS:
        problems["cron"] = f"{expr!r} has {len(parsed.expanded)} fields, not 5; {fix}"
        return None
    try:
        parsed.get_next(datetime)
    except CroniterBadDateError:
        problems["cron"] = (
            f"{expr!r} never fires (no matching date, e.g. the 30th of February); "
            "name days that exist in the months chosen"
        )
        return None
    return parsed


_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_DAY_NAMES = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
_RANGE = re.compile(r"^([0-9a-z]+)-([0-9a-z]+)$")


def _equal_range(expr: str) -> str | None:
    """Answer the first range item whose two bounds name one value (``3-3``), or ``None``."""
    fields = expr.lower().split()
    if len(fields) != _CRON_FIELDS:
        return None  # an alias, or a field-count problem croniter reports
    for index, text in enumerate(fields):
        for item in text.split(","):
            match = _RANGE.match(item.split("/")[0].split("#")[0])
            if match is None:
                continue
            low, high = (_field_value(index, bound) for bound in match.groups())
            if low is not None and low == high:
                return match.group(0)
    return None


def _field_value(index: int, token: str) -> int | None:
    """Answer a field token's number (names and day-of-week 7 normalised), or ``None``."""
    names = _MONTH_NAMES if index == 3 else _DAY_NAMES if index == 4 else {}
    if token in names:
        return names[token]
    if not token.isdigit():
        return None
    value = int(token)
    return 0 if index == 4 and value == 7 else value
