"""Scheduler state and the leader lease (where declared): watermarks, fires, pauses, the lease.

A fire's jobs and its watermark are one write, compare-and-set on the watermark the scheduler
read: every refusal and every lost race is checked to have written neither.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core import JobRegistry, Scheduler, job
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.driver import CounterStore, LeaderLease, SchedulerState
from jobs_core.errors import JobsError
from jobs_core.task import TaskRegistry, task
from jobs_core.types import Settle, TaskFire

T0 = datetime(2030, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
T2 = T0 + timedelta(hours=2)


class _Ahead:
    """A clock that runs ``offset`` ahead of another (a scheduler host whose NTP drifted)."""

    def __init__(self, base: Clock, offset: timedelta) -> None:
        self._base = base
        self._offset = offset

    def now(self) -> datetime:
        return self._base.now() + self._offset

    def monotonic(self) -> float:
        return self._base.monotonic()


class _Tick(BaseModel):
    at: datetime


def _state(target: Target) -> SchedulerState:
    store: SchedulerState = target.require("scheduler_state")
    return store


def _lease(target: Target) -> LeaderLease:
    lease: LeaderLease = target.require("leader")
    return lease


async def test_a_first_fire_lands_its_jobs_and_its_watermark_together(target: Target) -> None:
    """With no watermark, a fire expecting none enqueues its jobs and records the fire."""
    state = _state(target)
    reqs = (request("a"), request("b"))
    results = await state.fire(TaskFire("nightly", T1, None, reqs))

    assert results is not None
    assert [(r.id, r.deduped) for r in results] == [(q.id, False) for q in reqs]
    assert state_counts(await target.driver.stats()) == {"ready": 2}
    assert await state.watermarks() == {"nightly": T1}
    [record] = await state.task_fires()
    assert (record.task, record.occurrence, record.watermark) == ("nightly", T1, T1)
    assert record.job_ids == tuple(q.id for q in reqs)
    assert record.fired_at.utcoffset() == timedelta(0)


async def test_a_fire_record_keeps_the_schedule_it_was_made_under(target: Target) -> None:
    """The cron and zone a fire names come back with its record; a fire naming none has none.

    ``jobsctl tasks`` reads them to show a task's schedule without the app's code.
    """
    state = _state(target)
    await state.fire(TaskFire("nightly", T1, None, (), cron="0 3 * * *", tz="Europe/Paris"))
    await state.fire(TaskFire("by-hand", T1, None, ()))

    records = {r.task: r for r in await state.task_fires()}
    assert (records["nightly"].cron, records["nightly"].tz) == ("0 3 * * *", "Europe/Paris")
    assert (records["by-hand"].cron, records["by-hand"].tz) == (None, None)
    await state.fire(TaskFire("nightly", T2, T1, (), cron="*/5 * * * *", tz="UTC"))
    [moved] = [r for r in await state.task_fires() if r.task == "nightly"]
    assert (moved.cron, moved.tz) == ("*/5 * * * *", "UTC")


async def test_a_fire_against_a_moved_watermark_writes_nothing(target: Target) -> None:
    """A fire whose expected watermark is stale answers ``None`` and enqueues nothing."""
    state = _state(target)
    assert await state.fire(TaskFire("t", T1, None, (request("a"),))) is not None

    assert await state.fire(TaskFire("t", T1, None, (request("again"),))) is None
    assert await state.fire(TaskFire("t", T2, T0, (request("stale"),))) is None

    assert state_counts(await target.driver.stats()) == {"ready": 1}
    assert await state.watermarks() == {"t": T1}
    assert [r.occurrence for r in await state.task_fires()] == [T1]


async def test_a_fire_can_leave_the_watermark_past_its_occurrence(target: Target) -> None:
    """``TaskFire.watermark`` moves the watermark beyond the occurrence in the same write."""
    state = _state(target)
    assert await state.advance("t", None, T0)
    assert await state.fire(TaskFire("t", T1, T0, (request("a"),), watermark=T2)) is not None
    assert await state.watermarks() == {"t": T2}
    [record] = await state.task_fires()
    assert (record.occurrence, record.watermark) == (T1, T2)


async def test_a_fire_dedupes_like_an_enqueue(target: Target) -> None:
    """A live key, or an explicit id that names a row, answers that row and inserts nothing."""
    state = _state(target)
    live = request("same")
    await target.driver.enqueue(live)
    results = await state.fire(
        TaskFire("t", T1, None, (request("same"), request("other-key", job_id=live.id)))
    )
    assert results is not None
    assert [(r.id, r.deduped) for r in results] == [(live.id, True), (live.id, True)]
    assert state_counts(await target.driver.stats()) == {"ready": 1}
    assert await state.watermarks() == {"t": T1}


@pytest.mark.parametrize(
    ("fire", "why"),
    [
        (TaskFire("t", T1, None, (), watermark=T0), "a watermark before the occurrence"),
        (TaskFire("t", T1, None, (request("ok"), request(""))), "an empty idempotency key"),
        (TaskFire("t", T1, None, (request("ok"), request("x", payload="a\x00b"))), "NUL"),
    ],
)
async def test_a_refused_fire_writes_neither_jobs_nor_watermark(
    target: Target, fire: TaskFire, why: str
) -> None:
    """A fire the driver refuses raises and leaves no row and no watermark."""
    state = _state(target)
    with pytest.raises(JobsError):
        await state.fire(fire)
    assert state_counts(await target.driver.stats()) == {}, why
    assert await state.watermarks() == {}, why
    assert await state.task_fires() == [], why


async def test_a_watermark_never_moves_backwards(target: Target) -> None:
    """A fire or advance not after the watermark it expects is refused."""
    state = _state(target)
    assert await state.advance("t", None, T1)
    with pytest.raises(JobsError):
        await state.fire(TaskFire("t", T1, T1, (request("a"),)))
    with pytest.raises(JobsError):
        await state.advance("t", T1, T0)
    assert state_counts(await target.driver.stats()) == {}
    assert await state.watermarks() == {"t": T1}


async def test_advance_is_compare_and_set(target: Target) -> None:
    """``advance`` moves a watermark only from the value it expects, and records no fire."""
    state = _state(target)
    assert await state.advance("t", None, T0) is True
    assert await state.advance("t", None, T1) is False
    assert await state.advance("t", T1, T2) is False
    assert await state.advance("t", T0, T1) is True
    assert await state.watermarks() == {"t": T1}
    assert await state.task_fires() == []


async def test_racing_fires_from_two_connections_land_once(target: Target) -> None:
    """Two schedulers firing one occurrence at once: exactly one lands."""
    state = _state(target)
    other = await target.another()
    try:
        other_state: SchedulerState = getattr(other, "scheduler_state")  # noqa: B009
        answers = await asyncio.gather(
            state.fire(TaskFire("t", T1, None, (request("a"),))),
            other_state.fire(TaskFire("t", T1, None, (request("b"),))),
        )
    finally:
        await target.release(other)
    assert sorted(answer is not None for answer in answers) == [False, True]
    assert state_counts(await target.driver.stats()) == {"ready": 1}
    assert await state.watermarks() == {"t": T1}


async def test_pause_and_resume_tasks(target: Target) -> None:
    """Paused tasks are listed sorted; pausing twice or resuming an unpaused task is fine."""
    state = _state(target)
    await state.pause_task("b")
    await state.pause_task("a")
    await state.pause_task("a")
    assert await state.paused_tasks() == ["a", "b"]
    await state.resume_task("a")
    await state.resume_task("never-paused")
    assert await state.paused_tasks() == ["b"]


async def test_the_leader_lease_is_held_renewed_released_and_lapses(target: Target) -> None:
    """One holder at a time; it renews by acquiring; a lapsed lease is free to anyone."""
    lease = _lease(target)
    assert await lease.holder() is None
    assert await lease.acquire("host:1:a", 400) is True
    assert await lease.acquire("host:2:b", 400) is False
    assert await lease.holder() == "host:1:a"
    await target.advance(250)
    assert await lease.acquire("host:1:a", 400) is True  # renewed until 650 ms
    await target.advance(250)
    assert await lease.acquire("host:2:b", 400) is False
    await target.advance(600)
    assert await lease.holder() is None
    assert await lease.acquire("host:2:b", 60_000) is True
    assert await lease.acquire("host:1:a", 60_000) is False
    await lease.release("host:1:a")  # not the holder: nothing happens
    assert await lease.holder() == "host:2:b"
    await lease.release("host:2:b")
    assert await lease.holder() is None


async def test_the_scheduler_schedules_on_the_stores_clock(target: Target) -> None:
    """A scheduler whose host runs 3 minutes ahead fires on the store's time, not ~172 s early.

    It measures its skew against the driver's ``steps.now()`` (the database's ``now()``, Redis
    ``TIME``) at each lease renewal and schedules on its own clock minus that skew.
    """
    state = _state(target)
    registry = JobRegistry()

    @job(
        input=_Tick,
        idempotency_key=lambda t: t.at.isoformat(),
        tenant="none",
        name="conformance.skew",
        registry=registry,
    )
    async def tick(input: _Tick, step: object, ctx: object) -> None:
        """Never run: the test only checks when it is enqueued."""

    tasks = TaskRegistry()
    every_five = task(
        cron="*/5 * * * *",
        tz="UTC",
        enqueue=lambda at: [(tick, _Tick(at=at))],
        name="conformance.skew",
        registry=tasks,
    )
    ahead = timedelta(minutes=3)
    scheduler = Scheduler(
        target.driver,
        state=state,
        tasks=[every_five],
        clock=_Ahead(target.clock or SYSTEM_CLOCK, ahead),
        leader=False,
    )
    assert await scheduler.tick_once() == []
    assert abs(scheduler.clock_skew_ms - ahead.total_seconds() * 1000) < 5_000
    store_now = await target.driver.steps.now()
    started = (await state.watermarks())["conformance.skew"]
    assert abs((started - store_now).total_seconds()) < 5, "a new task starts at the store's now"
    if not target.manual:
        return
    first = every_five.schedule.next_after(started)
    # 10 s before the occurrence on the store's clock: the host clock reads 2 min 50 s past it.
    await target.advance(int((first - store_now).total_seconds() * 1000) - 10_000)
    assert await scheduler.tick_once() == [], "fired early by the host's skew"
    assert state_counts(await target.driver.stats()) == {}
    await target.advance(11_000)
    [fired] = await scheduler.tick_once()
    assert fired.occurrence == first
    assert abs((fired.fired_at - (await target.driver.steps.now())).total_seconds()) < 5
    assert state_counts(await target.driver.stats()) == {"ready": 1}


async def test_the_scheduler_leader_rolls_the_counters_up(target: Target) -> None:
    """The leader folds the driver's counters once a minute; a standby never does.

    Without it minute buckets piled up and a busy job's history was cut at the newest 4,176
    buckets (~2.9 days of minutes).
    """
    state = _state(target)
    counters: CounterStore = target.require("counters")
    lease = _lease(target)
    if not target.manual:
        pytest.skip("NOT APPLICABLE: folding needs a day to pass on the driver's clock")
    driver = target.driver
    await driver.enqueue(request("counted", name="conformance.counted"))
    [held] = await claim(driver)
    assert await driver.ack(held.id, Settle(held.fence, duration_ms=5.0))
    since = (await driver.steps.now()) - timedelta(days=1)
    [minute] = await counters.counters("conformance.counted", since)
    assert (minute.tier, minute.done) == ("1m", 1)
    leader, standby = (
        # A lease that outlives the day that passes below, so the leader stays the leader.
        Scheduler(driver, state=state, leader=lease, tasks=[], clock=target.clock, leader_ttl="3d")
        for _ in range(2)
    )
    await leader.tick_once()
    await standby.tick_once()
    assert leader.is_leader and not standby.is_leader
    await target.advance(25 * 3_600_000)
    await standby.tick_once()
    assert [b.tier for b in await counters.counters("conformance.counted", since)] == ["1m"]
    await leader.tick_once()
    [folded] = await counters.counters("conformance.counted", since)
    assert (folded.tier, folded.done, folded.duration_ms) == ("5m", 1, 5.0)
