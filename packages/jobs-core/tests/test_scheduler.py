"""The scheduler on the real memory driver and a manual clock.

"Fired" is counted where it is decided: a ``state.fire`` that landed (answered rows rather than
``None``), recorded by a proxy in front of the driver's own scheduler state. Counting job rows
would not do: a repeated fire of one occurrence would dedupe on the derived job id and hide it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from jobs_core import JobRegistry, Scheduler, TaskRegistry, job, next_task_run, task
from jobs_core.driver import LeaderLease, SchedulerState
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobOptionsInvalidError, NotImplementedByDriverError
from jobs_core.job import JobHandle
from jobs_core.task import TaskHandle
from jobs_core.testing import ManualClock
from jobs_core.types import JobFilter, TaskFire

START = datetime(2030, 1, 1, tzinfo=UTC)


class Tick(BaseModel):
    task: str
    at: datetime


async def _noop(input: Any, step: Any, ctx: Any) -> None:
    return None


class Recording:
    """A transparent proxy that counts every call and records each fire that landed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.fired: list[tuple[str, datetime]] = []
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        member = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if self.failing:
                raise ConnectionError("the store is unreachable")
            answer = await member(*args, **kwargs)
            if name == "fire" and answer is not None:
                fire: TaskFire = args[0]
                self.fired.append((fire.task, fire.occurrence))
            return answer

        return call

    def store_calls(self) -> int:
        return sum(self.calls.values())


@pytest.fixture
def tasks() -> TaskRegistry:
    return TaskRegistry()


@pytest.fixture
def tick_job(registry: JobRegistry) -> JobHandle[Any, Any]:
    return job(
        input=Tick,
        idempotency_key=lambda i: f"{i.task}:{i.at.isoformat()}",
        tenant="none",
        name="tick",
        registry=registry,
    )(_noop)


def declare(
    tasks: TaskRegistry,
    tick_job: JobHandle[Any, Any],
    cron: str,
    tz: str = "UTC",
    *,
    name: str = "t",
    catch_up: Any = "skip",
    max_catch_up: int = 10,
) -> TaskHandle:
    return task(
        cron=cron,
        tz=tz,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        enqueue=lambda at: [(tick_job, {"task": name, "at": at})],
        name=name,
        registry=tasks,
    )


def scheduler(
    driver: MemoryDriver,
    clock: ManualClock,
    tasks: Iterable[TaskHandle],
    state: Any,
    leader: Any = None,
    **options: Any,
) -> Scheduler:
    return Scheduler(driver, state=state, leader=leader, tasks=tasks, clock=clock, **options)


async def tick_through(
    schedulers: list[Scheduler], clock: ManualClock, until: datetime, step: str
) -> None:
    while clock.now() < until:
        clock.advance(step)
        for s in schedulers:
            await s.tick_once()


def hourly_from(first: datetime, count: int) -> list[datetime]:
    return [first + timedelta(hours=i) for i in range(count)]


# --- catch-up after an outage (a) ------------------------------------------------------------


async def _outage(
    driver: MemoryDriver,
    clock: ManualClock,
    t: TaskHandle,
) -> tuple[Recording, Scheduler]:
    """Fire 01:00 normally, then leave no scheduler running for three days and restart one."""
    state = Recording(driver.scheduler_state)
    before = scheduler(driver, clock, [t], state)
    await before.tick_once()  # starts the task from now: 00:00
    clock.set(START + timedelta(hours=1))
    assert [f.occurrence for f in await before.tick_once()] == [START + timedelta(hours=1)]
    # Three days and thirty minutes later, a fresh process (nothing cached).
    clock.set(START + timedelta(days=3, hours=1, minutes=30))
    return state, scheduler(driver, clock, [t], state)


async def test_skip_fires_only_the_latest_missed_occurrence_by_bisection(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="skip")
    state, after = await _outage(driver, clock, t)
    missed = 72  # 02:00 on day 1 through 01:00 on day 4

    before = t.schedule.evaluations
    fired = await after.tick_once()
    cost = t.schedule.evaluations - before

    latest = START + timedelta(days=3, hours=1)
    assert [(f.occurrence, f.watermark) for f in fired] == [(latest, latest)]
    assert state.fired[-1] == ("t", latest)
    assert len(state.fired) == 2
    # O(log gap): log2(3 days in seconds) is about 18; walking would cost one per occurrence.
    assert cost <= 25 < missed
    # Nothing more until the next hour.
    clock.advance("29m")
    assert await after.tick_once() == []
    clock.advance("1m")
    assert [f.occurrence for f in await after.tick_once()] == [latest + timedelta(hours=1)]


async def test_skip_after_five_years_costs_a_few_dozen_evaluations(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *", catch_up="skip")
    first = scheduler(driver, clock, [t], driver.scheduler_state)
    await first.tick_once()
    clock.set(START + timedelta(days=5 * 365, seconds=30))

    before = t.schedule.evaluations
    [fired] = await scheduler(driver, clock, [t], driver.scheduler_state).tick_once()

    assert fired.occurrence == START + timedelta(days=5 * 365)
    assert t.schedule.evaluations - before <= 40  # 2.6 million minutes were missed


async def test_run_once_fires_the_earliest_missed_and_moves_past_the_rest_in_one_write(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="run-once")
    state, after = await _outage(driver, clock, t)
    fires_before = state.calls["fire"]
    advances_before = state.calls["advance"]

    fired = await after.tick_once()

    earliest = START + timedelta(hours=2)
    latest = START + timedelta(days=3, hours=1)
    assert [(f.occurrence, f.watermark) for f in fired] == [(earliest, latest)]
    # One write: one fire, no separate advance.
    assert state.calls["fire"] - fires_before == 1
    assert state.calls["advance"] == advances_before
    assert await driver.scheduler_state.watermarks() == {"t": latest}
    page = await driver.introspect.list(JobFilter(name="tick"))
    assert sorted(row.input["at"] for row in page.rows) == [
        "2030-01-01T01:00:00Z",
        "2030-01-01T02:00:00Z",
    ]
    # The next fire is the next occurrence after the latest missed one.
    assert await after.tick_once() == []
    clock.set(latest + timedelta(hours=1))
    assert [f.occurrence for f in await after.tick_once()] == [latest + timedelta(hours=1)]


async def test_run_all_fires_each_missed_occurrence_at_most_max_catch_up_per_tick(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="run-all", max_catch_up=10)
    state, after = await _outage(driver, clock, t)

    per_tick = []
    while fired := await after.tick_once():
        per_tick.append(len(fired))
    assert per_tick == [10] * 7 + [2]

    occurrences = [occurrence for _, occurrence in state.fired]
    assert occurrences == hourly_from(START + timedelta(hours=1), 73)
    assert len(set(occurrences)) == len(occurrences)


async def test_run_all_paces_its_backlog_one_tick_apart_when_running(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="run-all", max_catch_up=10)
    _, after = await _outage(driver, clock, t)
    await after.tick_once()
    # Still 62 behind: the next round waits a tick, not zero (the per-tick bound means something).
    assert after._sleep_seconds() == pytest.approx(after.tick_ms / 1000)


# --- a task never fired, and pauses (e) --------------------------------------------------------


async def test_a_task_never_fired_starts_from_now_and_the_start_is_durable(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="run-all")
    clock.set(START + timedelta(minutes=30))
    state = Recording(driver.scheduler_state)
    first = scheduler(driver, clock, [t], state)

    assert await first.tick_once() == []  # 00:00 is before the task was first seen
    assert await driver.scheduler_state.watermarks() == {"t": START + timedelta(minutes=30)}
    # The first scheduler dies before 01:00; another starts at 03:10 and catches up from the
    # durable start, not from its own now.
    clock.set(START + timedelta(hours=3, minutes=10))
    await scheduler(driver, clock, [t], state).tick_once()
    assert [o for _, o in state.fired] == hourly_from(START + timedelta(hours=1), 3)


async def test_a_paused_task_is_skipped_at_due_time_and_caught_up_on_resume(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="skip")
    s = scheduler(driver, clock, [t], driver.scheduler_state, tick="1s", leader_ttl="30s")
    await s.tick_once()
    await driver.scheduler_state.pause_task("t")

    await tick_through([s], clock, START + timedelta(hours=3, minutes=5), "1m")
    assert await driver.scheduler_state.task_fires() == []
    assert await driver.scheduler_state.watermarks() == {"t": START}  # not moved while paused

    await driver.scheduler_state.resume_task("t")
    fired = []
    for _ in range(12):  # within a third of the TTL the pause is looked at again
        clock.advance("1s")
        fired += await s.tick_once()
    # skip: of the three hours the pause missed, the latest fires once.
    assert [f.occurrence for f in fired] == [START + timedelta(hours=3)]


async def test_a_paused_task_is_resumed_under_run_all_with_every_missed_occurrence(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *", catch_up="run-all")
    other = declare(tasks, tick_job, "30 * * * *", name="other")
    state = Recording(driver.scheduler_state)
    s = scheduler(driver, clock, [t, other], state)
    await s.tick_once()
    await driver.scheduler_state.pause_task("t")
    await tick_through([s], clock, START + timedelta(hours=2, minutes=45), "1m")
    # The unpaused task kept firing.
    assert [o for name, o in state.fired] == [
        START + timedelta(minutes=30),
        START + timedelta(hours=1, minutes=30),
        START + timedelta(hours=2, minutes=30),
    ]
    await driver.scheduler_state.resume_task("t")
    await tick_through([s], clock, START + timedelta(hours=2, minutes=57), "1m")
    assert [o for name, o in state.fired if name == "t"] == hourly_from(
        START + timedelta(hours=1), 2
    )


# --- two schedulers racing on one state (b) -----------------------------------------------------


def _race(steps: list[tuple[int, bool, bool, bool]], elected: bool) -> None:
    """Two schedulers tick in a random order over one state; each occurrence fires once."""

    async def scenario() -> None:
        clock = ManualClock(START)
        driver = MemoryDriver(clock=clock)
        registry, tasks = JobRegistry(), TaskRegistry()
        tick_job = job(
            input=Tick,
            idempotency_key=lambda i: f"{i.task}:{i.at.isoformat()}",
            tenant="none",
            name="tick",
            registry=registry,
        )(_noop)
        every5 = declare(tasks, tick_job, "*/5 * * * *", catch_up="run-all", max_catch_up=1000)
        state = Recording(driver.scheduler_state)
        lease = None if elected else False
        a = scheduler(driver, clock, [every5], state, lease, leader_ttl="30s")
        b = scheduler(driver, clock, [every5], state, lease, leader_ttl="30s")
        await a.tick_once()  # the task starts from START
        for seconds, b_first, a_sleeps, b_sleeps in steps:
            clock.advance(timedelta(seconds=seconds))
            order = [(b, b_sleeps), (a, a_sleeps)] if b_first else [(a, a_sleeps), (b, b_sleeps)]
            for s, sleeps in order:
                if not sleeps:
                    await s.tick_once()
        # Both wake up for good: every occurrence so far fires, in a few rounds at most.
        end = clock.now()
        for _ in range(4):
            clock.advance("11s")
            for s in (a, b):
                await s.tick_once()
        fired = [occurrence for _, occurrence in state.fired]
        expected = every5.schedule.occurrences_between(START, end, 100_000)
        assert [o for o in fired if o <= end] == expected
        assert len(set(fired)) == len(fired)
        if elected:
            assert not (a.is_leader and b.is_leader)
        await driver.close()

    asyncio.run(scenario())


RACE_STEPS = st.lists(
    st.tuples(st.integers(1, 900), st.booleans(), st.booleans(), st.booleans()),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=RACE_STEPS)
def test_two_schedulers_with_a_leader_lease_fire_each_occurrence_once(
    steps: list[tuple[int, bool, bool, bool]],
) -> None:
    _race(steps, elected=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=RACE_STEPS)
def test_two_schedulers_without_a_lease_fire_each_occurrence_once_by_cas_alone(
    steps: list[tuple[int, bool, bool, bool]],
) -> None:
    _race(steps, elected=False)


async def test_without_a_lease_both_schedulers_try_and_the_loser_reloads(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *")
    state = Recording(driver.scheduler_state)
    a = scheduler(driver, clock, [t], state, False)
    b = scheduler(driver, clock, [t], state, False)
    await a.tick_once()
    await b.tick_once()  # a started the task first: b reloads next round
    await b.tick_once()
    assert a.is_leader and b.is_leader  # no election: both act

    clock.advance("1m")
    assert len(await a.tick_once()) == 1
    assert await b.tick_once() == []  # its fire lost the compare-and-set
    assert state.calls["fire"] == 2
    clock.advance("1m")
    # b reloaded the watermark: it fires the next occurrence on its own, and a loses.
    assert len(await b.tick_once()) == 1
    assert await a.tick_once() == []
    assert [o for _, o in state.fired] == [START + timedelta(minutes=m) for m in (1, 2)]


async def test_schedulers_in_one_process_are_distinct_holders_and_one_leads(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *")
    trio = [scheduler(driver, clock, [t], driver.scheduler_state) for _ in range(3)]
    for s in trio:
        await s.tick_once()
    ids = [s.holder_id for s in trio]
    assert len(set(ids)) == 3  # same host, same pid: the random part tells them apart
    assert all(len(i.split(":")) == 3 for i in ids)
    assert [s.is_leader for s in trio] == [True, False, False]
    assert await driver.leader.holder() == ids[0]


# --- leader failover (c) ----------------------------------------------------------------------


async def test_a_standby_takes_over_after_the_ttl_when_the_leader_stops_renewing(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *", catch_up="run-all", max_catch_up=100)
    state = Recording(driver.scheduler_state)
    a = scheduler(driver, clock, [t], state, leader_ttl="30s")
    b = scheduler(driver, clock, [t], state, leader_ttl="30s")
    await tick_through([a, b], clock, START + timedelta(minutes=3), "5s")
    assert a.is_leader and not b.is_leader
    assert len(state.fired) == 3

    # a freezes (a GC pause, a stopped container): it neither renews nor fires.
    frozen_at = clock.now()
    took_over_at = None
    while took_over_at is None:
        clock.advance("5s")
        await b.tick_once()
        if b.is_leader:
            took_over_at = clock.now()
    # Not before the lease (renewed at most 30 s ago) lapsed; within TTL plus a renewal period.
    assert frozen_at + timedelta(seconds=20) <= took_over_at <= frozen_at + timedelta(seconds=45)
    assert await driver.leader.holder() == b.holder_id

    await tick_through([b], clock, START + timedelta(minutes=6), "5s")
    # a wakes with its stale cache: it asks the store before firing and steps down.
    clock.advance("5s")
    assert await a.tick_once() == []
    assert not a.is_leader
    await tick_through([a, b], clock, START + timedelta(minutes=8), "5s")

    occurrences = [o for _, o in state.fired]
    assert occurrences == [START + timedelta(minutes=m) for m in range(1, 9)]


async def test_a_leader_whose_renewal_fails_stops_firing_at_once(
    driver: MemoryDriver,
    clock: ManualClock,
    tasks: TaskRegistry,
    tick_job: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A long TTL: the lease a last renewed stays unexpired for minutes after its renewals start
    # failing, and a task due every minute would fire in that window if a kept believing.
    t = declare(tasks, tick_job, "* * * * *", catch_up="run-all", max_catch_up=100)
    state = Recording(driver.scheduler_state)
    lease_a = Recording(driver.leader)
    a = scheduler(driver, clock, [t], state, lease_a, leader_ttl="300s")
    b = scheduler(driver, clock, [t], state, leader_ttl="300s")
    await tick_through([a, b], clock, START + timedelta(minutes=1, seconds=5), "5s")
    assert a.is_leader
    assert state.fired == [("t", START + timedelta(minutes=1))]

    # The renewal round trip starts failing (a pooler rolled the election back, the network
    # dropped): the next renewal demotes a, although the store's lease has not lapsed.
    lease_a.failing = True
    failing_since = clock.now()
    with caplog.at_level(logging.WARNING, logger="jobs.scheduler"):
        while a.is_leader:
            clock.advance("5s")
            assert await a.tick_once() == []
            await b.tick_once()
    assert clock.now() - failing_since <= timedelta(seconds=100)  # one renewal period
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "jobs.scheduler.lease-failed" in events
    assert "jobs.scheduler.leader-lost" in events

    # a keeps running and fires nothing; b takes over once the lease lapses, and catches up.
    while not b.is_leader:
        clock.advance("5s")
        assert await a.tick_once() == []
        await b.tick_once()
    assert await driver.leader.holder() == b.holder_id
    assert [o for _, o in state.fired] == [
        START + timedelta(minutes=m) for m in range(1, clock.now().minute + 1)
    ]
    assert len(state.fired) >= 5


# --- DST (d) ----------------------------------------------------------------------------------


async def _night(
    driver: MemoryDriver,
    clock: ManualClock,
    tasks: list[TaskHandle],
    start: datetime,
    end: datetime,
    step: str,
) -> list[Any]:
    clock.set(start)
    s = scheduler(driver, clock, tasks, driver.scheduler_state)
    await s.tick_once()
    fired = []
    while clock.now() < end:
        clock.advance(step)
        fired += await s.tick_once()
    return fired


async def test_a_wall_time_skipped_by_spring_forward_fires_once_at_the_next_valid_instant(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    # Europe/Paris, Sunday 2030-03-31: 02:00 CET jumps to 03:00 CEST, so 02:30 never happens.
    t = declare(tasks, tick_job, "30 2 * * *", "Europe/Paris")
    fired = await _night(
        driver,
        clock,
        [t],
        datetime(2030, 3, 30, 23, tzinfo=UTC),
        datetime(2030, 4, 1, 1, tzinfo=UTC),
        "1m",
    )
    assert [f.occurrence for f in fired] == [
        datetime(2030, 3, 31, 1, 0, tzinfo=UTC),  # 03:00 CEST, the first instant after the gap
        datetime(2030, 4, 1, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]


async def test_a_wall_time_repeated_by_fall_back_fires_once(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    # Europe/Paris, Sunday 2030-10-27: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    t = declare(tasks, tick_job, "30 2 * * *", "Europe/Paris")
    fired = await _night(
        driver,
        clock,
        [t],
        datetime(2030, 10, 26, 23, tzinfo=UTC),
        datetime(2030, 10, 28, 2, tzinfo=UTC),
        "1m",
    )
    assert [f.occurrence for f in fired] == [
        datetime(2030, 10, 27, 0, 30, tzinfo=UTC),  # the first pass (CEST)
        datetime(2030, 10, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
    ]


async def test_every_five_minutes_keeps_firing_through_the_fall_back_night(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    # FIELD-FAILURES C13: America/Los_Angeles, Sunday 2030-11-03, 00:30 PDT to 02:30 PST in 10 s
    # steps; 01:00-01:59 happens twice.
    five = declare(tasks, tick_job, "*/5 * * * *", "America/Los_Angeles", name="five")
    minute = declare(tasks, tick_job, "* * * * *", "America/Los_Angeles", name="minute")
    fired = await _night(
        driver,
        clock,
        [five, minute],
        datetime(2030, 11, 3, 7, 30, tzinfo=UTC),
        datetime(2030, 11, 3, 10, 30, tzinfo=UTC),
        "10s",
    )
    for handle, period, count in ((five, 5, 36), (minute, 1, 180)):
        runs = [f for f in fired if f.task == handle.name]
        instants = [f.occurrence for f in runs]
        assert len(instants) == count, handle.name
        gaps = {b - a for a, b in pairwise(instants)}
        assert gaps == {timedelta(minutes=period)}, handle.name  # no hour-long hole
        # And each fired within one 10 s step of its instant.
        assert all(timedelta(0) <= f.fired_at - f.occurrence < timedelta(seconds=10) for f in runs)


# --- next_task_run is the scheduler's resolver (f) -------------------------------------------


async def test_next_task_run_answers_what_the_scheduler_fires(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "15 */6 * * 1-5", "Asia/Kolkata")
    fired = await _night(
        driver, clock, [t], START, START + timedelta(days=10), "7m"
    )  # 7 min: rounds land off the occurrences, so the scheduler finds them itself
    predicted = [next_task_run(t, START)]
    while (following := next_task_run(t, predicted[-1])) <= clock.now():
        predicted.append(following)
    assert [f.occurrence for f in fired] == predicted
    assert len(predicted) > 20


# --- idle rounds read no store (g) ------------------------------------------------------------


async def test_idle_rounds_make_no_store_call_but_the_lease_renewal(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "0 * * * *")
    state = Recording(driver.scheduler_state)
    lease = Recording(driver.leader)
    s = scheduler(driver, clock, [t], state, lease, tick="1s", leader_ttl="30s")

    await s.tick_once()
    assert state.calls == {"watermarks": 1, "advance": 1}  # the first round loads the cache

    rounds = 0
    while clock.now() < START + timedelta(minutes=59, seconds=59):
        clock.advance("1s")
        await s.tick_once()
        rounds += 1
    # 3,599 idle rounds: not one scheduler-state call; the lease every third of its TTL.
    assert state.calls == {"watermarks": 1, "advance": 1}
    assert rounds // 10 <= lease.calls["acquire"] <= rounds // 10 + 2
    assert set(lease.calls) == {"acquire"}

    clock.advance("1s")
    assert len(await s.tick_once()) == 1
    # The due round reads the pauses once and fires once: two calls.
    assert state.calls == {"watermarks": 1, "advance": 1, "paused_tasks": 1, "fire": 1}


# --- failures ---------------------------------------------------------------------------------


async def test_a_fire_whose_entries_do_not_validate_writes_nothing_and_is_retried(
    driver: MemoryDriver,
    clock: ManualClock,
    tasks: TaskRegistry,
    tick_job: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = {"on": True}
    t = task(
        cron="* * * * *",
        tz="UTC",
        enqueue=lambda at: [(tick_job, {"task": "t", "at": "bad" if broken["on"] else at})],
        name="t",
        registry=tasks,
    )
    state = Recording(driver.scheduler_state)
    s = scheduler(driver, clock, [t], state, leader_ttl="30s")
    await s.tick_once()
    clock.advance("1m")
    with caplog.at_level(logging.ERROR, logger="jobs.scheduler"):
        assert await s.tick_once() == []
    [failed] = [r for r in caplog.records if getattr(r, "event", None) == "jobs.task.fire-failed"]
    assert getattr(failed, "code", None) == "X_JOB_INPUT_INVALID"
    assert state.calls["fire"] == 0  # validation runs before the store is asked
    assert driver.live_count() == 0
    assert await driver.scheduler_state.watermarks() == {"t": START}

    broken["on"] = False
    clock.advance("5s")
    assert await s.tick_once() == []  # held for a third of the TTL, not retried every round
    clock.advance("5s")
    assert [f.occurrence for f in await s.tick_once()] == [START + timedelta(minutes=1)]


async def test_an_unreachable_store_drops_the_cache_and_the_round_after_reloads(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *")
    state = Recording(driver.scheduler_state)
    s = scheduler(driver, clock, [t], state, False)
    await s.tick_once()
    clock.advance("1m")
    state.failing = True
    with pytest.raises(ConnectionError):
        await s.tick_once()  # reading the pauses failed
    state.failing = False
    assert [f.occurrence for f in await s.tick_once()] == [START + timedelta(minutes=1)]
    assert state.calls["watermarks"] == 2


# --- construction and the run loop --------------------------------------------------------------


def test_options_are_validated(driver: MemoryDriver, tasks: TaskRegistry, tick_job: Any) -> None:
    t = declare(tasks, tick_job, "* * * * *")
    for options, option in (
        ({"tick": "0s"}, "tick"),
        ({"leader_ttl": "soon"}, "leader_ttl"),
        ({"leader_ttl": 2}, "leader_ttl"),
        ({"holder_id": " "}, "holder_id"),
    ):
        with pytest.raises(JobOptionsInvalidError) as caught:
            Scheduler(driver, tasks=[t], **options)
        assert caught.value.meta["option"] == option
    twin = task(
        cron="* * * * *", tz="UTC", enqueue=lambda at: [], name="t", registry=TaskRegistry()
    )
    with pytest.raises(JobOptionsInvalidError, match="two different tasks"):
        Scheduler(driver, tasks=[t, twin])


def test_defaults_take_the_drivers_capabilities_and_every_declared_task(
    driver: MemoryDriver,
) -> None:
    s = Scheduler(driver)
    assert s.state is driver.scheduler_state
    assert s.leader is driver.leader
    assert s.renew_ms == 10_000
    assert Scheduler(driver, leader=False).leader is None


def test_a_driver_without_scheduler_state_is_refused(driver: MemoryDriver) -> None:
    class Bare:
        name = "bare"
        capabilities: frozenset[str] = frozenset()

    with pytest.raises(NotImplementedByDriverError):
        Scheduler(Bare(), tasks=[])  # type: ignore[arg-type]


async def test_run_fires_when_due_and_stop_releases_the_lease(
    driver: MemoryDriver, clock: ManualClock, tasks: TaskRegistry, tick_job: Any
) -> None:
    t = declare(tasks, tick_job, "* * * * *")
    state = Recording(driver.scheduler_state)
    s = scheduler(driver, clock, [t], state, tick="5ms")
    assert isinstance(driver.scheduler_state, SchedulerState)
    assert isinstance(driver.leader, LeaderLease)
    running = asyncio.create_task(s.run())
    try:
        async with asyncio.timeout(5):
            while not s.is_leader:
                await asyncio.sleep(0.005)
            clock.advance("1m")
            while not state.fired:
                await asyncio.sleep(0.005)
    finally:
        await s.stop()
        await running
    assert state.fired == [("t", START + timedelta(minutes=1))]
    assert await driver.leader.holder() is None  # released: a standby need not wait the TTL
