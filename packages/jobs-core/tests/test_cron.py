"""The cron resolver: DST rules, POSIX day semantics, validation and bisection cost.

Answers are checked against a brute-force reference written here, independent of croniter: it
visits every UTC minute of a window, reads the local wall clock, and decides with a predicate
written by hand for each generated cron whether that minute fires under the documented rule:

* a matching wall time fires when the clock shows it (first pass only for crons that name their
  hours; both passes for crons whose hour field covers every hour);
* the first minute after a spring-forward gap fires when any wall time inside the gap matches.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import pickle
from collections.abc import Callable
from dataclasses import FrozenInstanceError, dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs_core.cron import CronSchedule
from jobs_core.errors import JobDeclarationInvalidError

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
# Lord_Howe shifts by 30 minutes; Antarctica/Troll by two hours (+00 <-> +02).
DST_ZONES = ("America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Antarctica/Troll")
FLAT_ZONES = ("Asia/Tokyo", "UTC")
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- the generated cron family, each with a hand-written predicate -----------------------------


@dataclass(frozen=True)
class Cron:
    expr: str
    matches: Callable[[datetime], bool]
    every_hour: bool
    daily: bool

    def __repr__(self) -> str:
        return f"Cron({self.expr!r})"


MINUTES = st.one_of(st.sampled_from([0, 15, 30, 45, 59]), st.integers(0, 59))
HOURS = st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, 23))


@st.composite
def crons(draw: st.DrawFn) -> Cron:
    kind = draw(st.sampled_from(["daily", "hourly", "every_n", "ranged"]))
    if kind == "daily":
        m, h = draw(MINUTES), draw(HOURS)
        return Cron(f"{m} {h} * * *", lambda w: w.minute == m and w.hour == h, False, True)
    if kind == "hourly":
        m = draw(MINUTES)
        hour_field = draw(st.sampled_from(["*", "0-23", "*/1"]))
        return Cron(f"{m} {hour_field} * * *", lambda w: w.minute == m, True, False)
    if kind == "every_n":
        n = draw(st.sampled_from([1, 2, 3, 5, 7, 10, 15, 20, 30]))
        return Cron(f"*/{n} * * * *", lambda w: w.minute % n == 0, True, False)
    n = draw(st.sampled_from([5, 10, 15, 30]))
    first = draw(st.integers(0, 3))
    last = draw(st.integers(first, 4))
    hours = f"{first}" if first == last else f"{first}-{last}"
    return Cron(
        f"*/{n} {hours} * * *",
        lambda w: w.minute % n == 0 and first <= w.hour <= last,
        False,
        False,
    )


# -- the independent reference --------------------------------------------------------------------


def wall_of(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None, fold=0)


def reference(zone: ZoneInfo, cron: Cron, after: datetime, until: datetime) -> list[datetime]:
    """Every occurrence in (after, until] by visiting each UTC minute (all test zones keep
    whole-minute offsets, so UTC minutes and wall minutes line up)."""
    u = after.replace(second=0, microsecond=0)
    if u <= after:
        u += MINUTE
    previous_wall = wall_of(u - MINUTE, zone)
    found: list[datetime] = []
    while u <= until:
        local = u.astimezone(zone)
        wall = local.replace(tzinfo=None, fold=0)
        second_pass = local.fold == 1
        fires = cron.matches(wall) and (not second_pass or cron.every_hour)
        if wall - previous_wall > MINUTE:  # u is the first instant after a gap
            skipped = previous_wall + MINUTE
            while skipped < wall:
                fires = fires or cron.matches(skipped)
                skipped += MINUTE
        if fires:
            found.append(u)
        previous_wall = wall
        u += MINUTE
    return found


@functools.cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """UTC instants at which the zone's offset changes during ``year`` (to the minute)."""
    zone = ZoneInfo(zone_name)
    t = utc(year, 1, 1)
    offset = t.astimezone(zone).utcoffset()
    found = []
    while t.year == year:
        nxt = t + HOUR
        if nxt.astimezone(zone).utcoffset() != offset:
            minute = t
            while minute.astimezone(zone).utcoffset() == offset:
                minute += MINUTE
            found.append(minute)
            offset = minute.astimezone(zone).utcoffset()
        t = nxt
    return tuple(found)


def walk(schedule: CronSchedule, after: datetime, until: datetime) -> list[datetime]:
    answers = []
    cursor = after
    while True:
        cursor = schedule.next_after(cursor)
        if cursor > until:
            return answers
        answers.append(cursor)


def gap_before(instant: datetime, zone: ZoneInfo) -> list[datetime]:
    """The skipped wall minutes just before ``instant`` (empty unless it ends a gap)."""
    wall = wall_of(instant, zone)
    before = wall_of(instant - MINUTE, zone)
    skipped = []
    w = before + MINUTE
    while w < wall:
        skipped.append(w)
        w += MINUTE
    return skipped


def wall_exists(wall: datetime, zone: ZoneInfo) -> bool:
    return wall_of(wall.replace(tzinfo=zone).astimezone(UTC), zone) == wall


def check_walk(zone_name: str, cron: Cron, after: datetime, until: datetime) -> list[datetime]:
    zone = ZoneInfo(zone_name)
    schedule = CronSchedule(cron.expr, zone_name)
    assert schedule.every_hour is cron.every_hour
    answers = walk(schedule, after, until)
    # (a) strictly increasing, aware UTC, after the start
    assert all(a.tzinfo is UTC for a in answers)
    assert all(x < y for x, y in zip([after, *answers], answers, strict=False))
    walls = []
    for answer in answers:
        wall = wall_of(answer, zone)
        walls.append(wall)
        # (c) a skipped wall time is never answered: the answer's wall time exists
        assert wall_exists(wall, zone)
        # (b) it matches, or it is the first instant after a gap holding a matching wall time
        assert cron.matches(wall) or any(cron.matches(w) for w in gap_before(answer, zone))
    # (d) crons that name their hours fire once per wall time, even in the repeated hour;
    # every-hour crons repeat a wall time only when the clock really showed it twice.
    if not cron.every_hour:
        assert len(set(walls)) == len(walls)
    else:
        for wall in {w for w in walls if walls.count(w) > 1}:
            first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
            second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
            assert first != second and walls.count(wall) == 2
    # (e) identical to the brute-force reference
    assert answers == reference(zone, cron, after, until)
    return answers


@st.composite
def dst_windows(draw: st.DrawFn, cron: Cron) -> tuple[str, datetime, datetime]:
    zone_name = draw(st.sampled_from(DST_ZONES))
    year = draw(st.integers(2019, 2030))
    transition = draw(st.sampled_from(transitions(zone_name, year)))
    micro = draw(st.one_of(st.sampled_from([0, 1, 59_999_999]), st.integers(0, 59_999_999)))
    # minutes from the transition, biased to the edges of a one- or two-hour span around it
    near = st.sampled_from([-121, -120, -61, -60, -31, -30, -1, 0, 29, 30, 59, 60, 119, 120])
    if cron.daily:
        start = transition + timedelta(minutes=draw(st.one_of(near, st.integers(-26 * 60, 60))))
        end = start + timedelta(hours=50)
    else:
        start = transition + timedelta(minutes=draw(st.one_of(near, st.integers(-150, 120))))
        end = transition + timedelta(hours=4)
    return zone_name, start + timedelta(microseconds=micro), end


# -- property tests --------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(data=st.data(), cron=crons())
def test_walk_across_dst_transitions_matches_reference(data: st.DataObject, cron: Cron) -> None:
    zone_name, start, end = data.draw(dst_windows(cron))
    check_walk(zone_name, cron, start, end)


@PROPERTY_SETTINGS
@given(
    cron=crons(),
    zone_name=st.sampled_from(FLAT_ZONES),
    start=st.datetimes(datetime(2019, 1, 1), datetime(2030, 12, 31), timezones=st.just(UTC)),
)
def test_walk_in_zones_without_dst_matches_reference(
    cron: Cron, zone_name: str, start: datetime
) -> None:
    answers = check_walk(zone_name, cron, start, start + (50 * HOUR if cron.daily else 3 * HOUR))
    if cron.expr.startswith("*/1 "):
        assert len(answers) == 180


@PROPERTY_SETTINGS
@given(data=st.data(), cron=crons())
def test_latest_and_between_match_reference(data: st.DataObject, cron: Cron) -> None:
    zone_name, start, end = data.draw(dst_windows(cron))
    zone = ZoneInfo(zone_name)
    schedule = CronSchedule(cron.expr, zone_name)
    expected = reference(zone, cron, start, end)
    limit = data.draw(st.integers(0, 400))
    assert schedule.occurrences_between(start, end, limit) == expected[:limit]

    before = schedule.evaluations
    latest = schedule.latest_at_or_before(end, start)
    spent = schedule.evaluations - before
    assert latest == (expected[-1] if expected else None)
    # one evaluation to find the first, then one per halving (a repeated span costs up to 3)
    assert spent <= 3 * (math.log2((end - start).total_seconds()) + 2)


@PROPERTY_SETTINGS
@given(data=st.data(), cron=crons())
def test_next_after_any_zone_representation_of_instant(data: st.DataObject, cron: Cron) -> None:
    zone_name, start, _ = data.draw(dst_windows(cron))
    schedule = CronSchedule(cron.expr, zone_name)
    expected = schedule.next_after(start)
    for other in ("Asia/Kolkata", zone_name, "America/St_Johns"):
        assert schedule.next_after(start.astimezone(ZoneInfo(other))) == expected


@pytest.mark.parametrize("zone_name", DST_ZONES)
@pytest.mark.parametrize("expr", ["* * * * *", "30 2 * * *", "45 1 * * *", "0 * * * *"])
def test_every_transition_2019_2030(zone_name: str, expr: str) -> None:
    predicates = {
        "* * * * *": Cron(expr, lambda w: True, True, False),
        "30 2 * * *": Cron(expr, lambda w: (w.hour, w.minute) == (2, 30), False, True),
        "45 1 * * *": Cron(expr, lambda w: (w.hour, w.minute) == (1, 45), False, True),
        "0 * * * *": Cron(expr, lambda w: w.minute == 0, True, False),
    }
    for year in range(2019, 2031):
        for transition in transitions(zone_name, year):
            check_walk(zone_name, predicates[expr], transition - 3 * HOUR, transition + 3 * HOUR)


# -- DST examples with fixed instants ------------------------------------------------------------


def test_spring_forward_gap_fires_once_at_first_instant_after_gap() -> None:
    nightly = CronSchedule("30 2 * * *", "America/New_York")  # 02:30 does not exist 2021-03-14
    assert nightly.next_after(utc(2021, 3, 14, 5)) == utc(2021, 3, 14, 7)  # 03:00 EDT
    assert nightly.next_after(utc(2021, 3, 14, 7)) == utc(2021, 3, 15, 6, 30)  # 02:30 EDT
    quarterly = CronSchedule("*/15 2 * * *", "America/New_York")  # four skipped wall times
    assert quarterly.occurrences_between(utc(2021, 3, 14), utc(2021, 3, 15, 6, 1), 10) == [
        utc(2021, 3, 14, 7),
        utc(2021, 3, 15, 6),
    ]
    paris = CronSchedule("30 2 * * *", "Europe/Paris")
    assert paris.next_after(utc(2021, 3, 27, 12)) == utc(2021, 3, 28, 1)  # 03:00 CEST


def test_fall_back_named_hour_fires_once_on_first_pass() -> None:
    nightly = CronSchedule("30 1 * * *", "America/New_York")  # 01:30 happens twice 2021-11-07
    assert nightly.occurrences_between(utc(2021, 11, 6, 12), utc(2021, 11, 8, 12), 10) == [
        utc(2021, 11, 7, 5, 30),  # 01:30 EDT (fold=0)
        utc(2021, 11, 8, 6, 30),  # next day, 01:30 EST
    ]
    # asked from inside the second pass, the repeated wall time does not fire again
    assert nightly.next_after(utc(2021, 11, 7, 6, 10)) == utc(2021, 11, 8, 6, 30)
    paris = CronSchedule("30 2 * * *", "Europe/Paris")  # 02:30 happens twice 2021-10-31
    assert paris.occurrences_between(utc(2021, 10, 30, 12), utc(2021, 10, 31, 12), 10) == [
        utc(2021, 10, 31, 0, 30)
    ]


def test_fall_back_every_hour_cron_fires_on_both_passes() -> None:
    on_the_hour = CronSchedule("0 * * * *", "America/New_York")
    # a microsecond into 01:59 EDT (first pass): next is 01:00 EST, the second pass
    assert on_the_hour.next_after(utc(2019, 11, 3, 5, 59, 0, 1)) == utc(2019, 11, 3, 6)
    assert on_the_hour.next_after(utc(2019, 11, 3, 6, 59, 59, 999999)) == utc(2019, 11, 3, 7)
    half_past = CronSchedule("30 * * * *", "America/New_York")
    assert half_past.occurrences_between(utc(2021, 11, 7, 4), utc(2021, 11, 7, 7), 10) == [
        utc(2021, 11, 7, 4, 30),  # 00:30 EDT
        utc(2021, 11, 7, 5, 30),  # 01:30 EDT
        utc(2021, 11, 7, 6, 30),  # 01:30 EST
    ]


def test_lord_howe_half_hour_shift() -> None:
    # 2021-10-03 02:00 LHST (+10:30) jumps to 02:30 LHDT (+11)
    gap = CronSchedule("15 2 * * *", "Australia/Lord_Howe")
    assert gap.next_after(utc(2021, 10, 2, 12)) == utc(2021, 10, 2, 15, 30)  # 02:30 LHDT
    after_gap = CronSchedule("45 2 * * *", "Australia/Lord_Howe")
    assert after_gap.next_after(utc(2021, 10, 2, 12)) == utc(2021, 10, 2, 15, 45)
    # 2021-04-04 02:00 LHDT (+11) falls back to 01:30 LHST (+10:30): 01:30-01:59 repeat
    named = CronSchedule("45 1 * * *", "Australia/Lord_Howe")
    assert named.occurrences_between(utc(2021, 4, 3, 12), utc(2021, 4, 4, 12), 10) == [
        utc(2021, 4, 3, 14, 45)
    ]
    hourly = CronSchedule("45 * * * *", "Australia/Lord_Howe")
    assert hourly.occurrences_between(utc(2021, 4, 3, 14), utc(2021, 4, 3, 16), 10) == [
        utc(2021, 4, 3, 14, 45),  # 01:45 LHDT
        utc(2021, 4, 3, 15, 15),  # 01:45 LHST
    ]
    assert hourly.next_after(utc(2021, 4, 3, 15, 15)) == utc(2021, 4, 3, 16, 15)  # 02:45 LHST


@pytest.mark.parametrize(("expr", "period"), [("* * * * *", MINUTE), ("*/5 * * * *", 5 * MINUTE)])
def test_c13_no_gap_through_the_repeated_hour(expr: str, period: timedelta) -> None:
    la = ZoneInfo("America/Los_Angeles")
    schedule = CronSchedule(expr, "America/Los_Angeles")
    now = datetime(2021, 11, 7, 0, 30, tzinfo=la)  # PDT
    stop = datetime(2021, 11, 7, 2, 30, tzinfo=la)  # PST, three elapsed hours later
    assert stop - now == 2 * HOUR  # aware arithmetic in one zone is wall time...
    assert stop.astimezone(UTC) - now.astimezone(UTC) == 3 * HOUR  # ...elapsed is three hours
    runs: list[datetime] = []
    due = schedule.next_after(now)
    tick = now.astimezone(UTC)
    while tick < stop.astimezone(UTC):  # an injectable clock advanced in 10 s steps
        tick += timedelta(seconds=10)
        while due <= tick:
            runs.append(due)
            due = schedule.next_after(due)
    gaps = {b - a for a, b in itertools.pairwise(runs)}
    assert gaps == {period}
    assert len(runs) == 3 * HOUR // period
    # both passes of 01:xx fired
    assert utc(2021, 11, 7, 8, 10) in runs and utc(2021, 11, 7, 9, 10) in runs


# -- POSIX day-of-month OR day-of-week (C16) ---------------------------------------------------


def test_first_of_month_or_monday() -> None:
    schedule = CronSchedule("0 0 1 * 1", "UTC")
    assert schedule.restricts_both_days
    assert schedule.occurrences_between(utc(2024, 4, 30, 12), utc(2024, 6, 4), 20) == [
        utc(2024, 5, 1),  # Wednesday the 1st
        utc(2024, 5, 6),
        utc(2024, 5, 13),
        utc(2024, 5, 20),
        utc(2024, 5, 27),
        utc(2024, 6, 1),  # Saturday the 1st
        utc(2024, 6, 3),
    ]


def test_first_week_or_friday() -> None:
    schedule = CronSchedule("0 11 1-7 * 5", "UTC")
    assert schedule.restricts_both_days
    days = [d.day for d in schedule.occurrences_between(utc(2024, 5, 1), utc(2024, 6, 1, 12), 30)]
    assert days == [1, 2, 3, 4, 5, 6, 7, 10, 17, 24, 31, 1]


def test_first_of_may_or_monday_to_thursday_in_may() -> None:
    schedule = CronSchedule("* * 1 5 1-4", "UTC")
    assert schedule.restricts_both_days
    # Monday 2024-05-20: fires the same day (the reporter of croniter#72 expected AND)
    assert schedule.next_after(utc(2024, 5, 20, 10, 0, 30)) == utc(2024, 5, 20, 10, 1)
    # Thursday night: Friday to Sunday do not match, Monday does
    assert schedule.next_after(utc(2024, 5, 23, 23, 59, 30)) == utc(2024, 5, 27)
    # after May, the month field still restricts: next is 1 May 2025 (a Thursday)
    assert schedule.next_after(utc(2024, 5, 31)) == utc(2025, 5, 1)


def test_single_day_restriction_and_first_friday() -> None:
    assert not CronSchedule("0 0 1 * *", "UTC").restricts_both_days
    assert not CronSchedule("0 0 * * 1", "UTC").restricts_both_days
    # any day field other than a bare * is restricted, even one covering every day
    every_day = CronSchedule("0 0 */1 * 1", "UTC")
    assert every_day.restricts_both_days
    assert every_day.occurrences_between(utc(2024, 5, 1), utc(2024, 5, 4), 5) == [
        utc(2024, 5, 2),
        utc(2024, 5, 3),
        utc(2024, 5, 4),
    ]
    first_friday = CronSchedule("0 11 * * 5#1", "UTC")
    assert first_friday.occurrences_between(utc(2024, 5, 1), utc(2024, 7, 1), 5) == [
        utc(2024, 5, 3, 11),
        utc(2024, 6, 7, 11),
    ]


# -- validation ----------------------------------------------------------------------------------


def test_tz_must_be_a_full_iana_name() -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        CronSchedule("0 3 * * *", "Bogota")
    assert caught.value.code == "X_JOB_DECLARATION_INVALID"
    assert caught.value.message.startswith("tz: 'Bogota'")
    assert "America/Bogota" in caught.value.message
    assert set(caught.value.meta["problems"]) == {"tz"}
    assert CronSchedule("0 3 * * *", "America/Bogota").zone == ZoneInfo("America/Bogota")


@pytest.mark.parametrize(
    "expr",
    ["61 * * * *", "* * * *", "0 3 * * * 30", "0 3 * * * 30 2030", "0 0 30 2 *", "H * * * *", ""],
)
def test_bad_cron_is_refused_naming_cron(expr: str) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        CronSchedule(expr, "UTC")
    assert caught.value.message.startswith("cron: ")
    assert "five fields" in caught.value.message or "never fires" in caught.value.message


@pytest.mark.parametrize(
    ("expr", "item"),
    [
        ("0 3-3 * * *", "3-3"),
        ("1-1/2 * * * *", "1-1"),
        ("0 0 * * mon-mon", "mon-mon"),
        ("0 0 * * 7-0", "7-0"),
        ("0 0 * JAN-jan *", "jan-jan"),
        ("0 9 5-5 * *", "5-5"),
    ],
)
def test_equal_range_is_refused_because_croniter_reads_it_as_the_whole_cycle(
    expr: str, item: str
) -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        CronSchedule(expr, "UTC")
    assert caught.value.message.startswith("cron: ")
    assert f"equal range {item!r}" in caught.value.message
    assert CronSchedule("0 3 * * *", "UTC").next_after(utc(2024, 1, 1)) == utc(2024, 1, 1, 3)
    assert CronSchedule("0 22-2 * * *", "UTC").next_after(utc(2024, 1, 1, 3)) == utc(2024, 1, 1, 22)


def test_every_bad_field_is_listed() -> None:
    with pytest.raises(JobDeclarationInvalidError) as caught:
        CronSchedule("not cron", "Nowhere/Special")
    assert set(caught.value.meta["problems"]) == {"cron", "tz"}
    assert "cron: " in caught.value.message and "tz: " in caught.value.message


def test_aliases_and_names_are_accepted() -> None:
    assert CronSchedule("@daily", "UTC").next_after(utc(2024, 1, 1, 5)) == utc(2024, 1, 2)
    assert CronSchedule("0 9 * jan mon", "UTC").next_after(utc(2024, 1, 2)) == utc(2024, 1, 8, 9)
    leap = CronSchedule("0 0 29 2 *", "UTC")
    assert leap.next_after(utc(2024, 3, 1)) == utc(2028, 2, 29)


@pytest.mark.parametrize("name", ["instant", "after", "until", "not_before"])
def test_naive_instants_are_refused_by_name(name: str) -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    naive, aware = datetime(2024, 1, 1), utc(2024, 1, 1)
    calls = {
        "instant": lambda: schedule.next_after(naive),
        "after": lambda: schedule.occurrences_between(naive, aware, 1),
        "until": lambda: schedule.occurrences_between(aware, naive, 1),
        "not_before": lambda: schedule.latest_at_or_before(aware, naive),
    }
    with pytest.raises(ValueError, match=f"^{name} must be an aware datetime"):
        calls[name]()


def test_limit_and_empty_windows() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    with pytest.raises(ValueError, match="limit"):
        schedule.occurrences_between(utc(2024, 1, 1), utc(2024, 1, 2), -1)
    assert schedule.occurrences_between(utc(2024, 1, 1), utc(2024, 1, 2), 0) == []
    assert schedule.occurrences_between(utc(2024, 1, 2), utc(2024, 1, 1), 5) == []
    assert schedule.latest_at_or_before(utc(2024, 1, 1), utc(2024, 1, 1)) is None
    assert schedule.latest_at_or_before(utc(2024, 1, 1, 0, 0, 30), utc(2024, 1, 1)) is None
    nightly = CronSchedule("0 3 * * *", "UTC")
    assert nightly.latest_at_or_before(utc(2024, 1, 1, 2), utc(2023, 12, 31, 3)) is None
    assert nightly.latest_at_or_before(utc(2024, 1, 1, 3), utc(2023, 12, 31, 3)) == utc(
        2024, 1, 1, 3
    )


def test_schedule_is_frozen_and_compares_by_expression_and_zone() -> None:
    a = CronSchedule("0 3 * * *", "Europe/Paris")
    b = CronSchedule("0 3 * * *", "Europe/Paris")
    a.next_after(utc(2024, 1, 1))
    assert a == b and hash(a) == hash(b) and a.evaluations != b.evaluations
    assert a != CronSchedule("0 3 * * *", "Europe/Berlin")
    with pytest.raises(FrozenInstanceError):
        a.expr = "0 4 * * *"  # type: ignore[misc]
    assert repr(a) == "CronSchedule(expr='0 3 * * *', tz='Europe/Paris')"
    for clone in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), copy.copy(a)):
        assert clone == a and clone.next_after(utc(2024, 7, 1)) == utc(2024, 7, 1, 1)


# -- bisection cost ---------------------------------------------------------------------------


def test_three_day_outage_of_hourly_task_bisects() -> None:
    schedule = CronSchedule("0 * * * *", "Europe/Paris")
    down, now = utc(2024, 3, 29, 22, 10), utc(2024, 4, 1, 22, 10)  # spans the DST change
    missed = schedule.occurrences_between(down, now, 1000)
    assert len(missed) == 72

    before = schedule.evaluations
    latest = schedule.latest_at_or_before(now, down)
    spent = schedule.evaluations - before
    assert latest == missed[-1] == utc(2024, 4, 1, 22)
    assert spent <= math.ceil(math.log2((now - down).total_seconds())) + 2  # 20
    assert spent < len(missed)


def test_five_year_outage_of_minutely_task_bisects() -> None:
    schedule = CronSchedule("* * * * *", "America/New_York")  # crosses ten DST changes
    down = utc(2020, 2, 3, 4, 5, 6)
    now = down + timedelta(days=5 * 365, seconds=4321, microseconds=987)
    before = schedule.evaluations
    latest = schedule.latest_at_or_before(now, down)
    spent = schedule.evaluations - before
    # every real minute fires (whole-hour offsets), so the latest is "now" floored to the minute
    assert latest == now.replace(second=0, microsecond=0)
    assert latest is not None and schedule.next_after(latest) > now
    assert spent < 64
    assert spent <= math.ceil(math.log2((now - down).total_seconds())) + 2


def test_walking_costs_one_evaluation_per_occurrence() -> None:
    schedule = CronSchedule("*/5 * * * *", "UTC")
    before = schedule.evaluations
    found = schedule.occurrences_between(utc(2024, 1, 1), utc(2024, 1, 1, 1), 100)
    assert len(found) == 12
    assert schedule.evaluations - before == 12
