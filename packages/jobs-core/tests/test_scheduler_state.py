"""The memory driver's scheduler state and leader lease, on a manual clock.

A fire's rows and its watermark are one write: every refusal is checked to have written neither,
and racing fires (threads, each on its own event loop) are checked to land exactly once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from jobs_core.driver import LeaderLease, SchedulerState, capability
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock
from jobs_core.types import EnqueueRequest, JobFilter, TaskFire, TaskFireRecord

START = datetime(2030, 1, 1, tzinfo=UTC)
T1 = START + timedelta(hours=1)
T2 = START + timedelta(hours=2)


@pytest.fixture
async def mem() -> AsyncIterator[MemoryDriver]:
    driver = MemoryDriver(clock=ManualClock(START))
    yield driver
    await driver.close()


def req(key: str, *, queue: str = "default", input: object = None) -> EnqueueRequest:
    return EnqueueRequest(
        name="digest",
        queue=queue,
        input={"key": key} if input is None else input,
        idempotency_key=key,
        tenant_id=None,
        max_attempts=3,
        id=new_id(),
        run_id=new_id(),
    )


async def rows(mem: MemoryDriver) -> list[str]:
    page = await mem.introspect.list(JobFilter(limit=200))
    return sorted(row.idempotency_key for row in page.rows)


async def test_capabilities_are_declared_and_satisfy_the_protocols(mem: MemoryDriver) -> None:
    assert {"scheduler_state", "leader"} <= mem.capabilities
    assert isinstance(capability(mem, "scheduler_state"), SchedulerState)
    assert isinstance(capability(mem, "leader"), LeaderLease)
    assert {"scheduler_state", "leader"} <= set(mem.describe()["capabilities"])


async def test_first_fire_expects_no_watermark_then_lands_rows_and_watermark(
    mem: MemoryDriver,
) -> None:
    state = mem.scheduler_state
    results = await state.fire(TaskFire("nightly", T1, None, (req("a"), req("b"))))

    assert results is not None
    assert [r.deduped for r in results] == [False, False]
    assert await rows(mem) == ["a", "b"]
    assert await state.watermarks() == {"nightly": T1}
    [record] = await state.task_fires()
    assert record == TaskFireRecord(
        task="nightly",
        occurrence=T1,
        watermark=T1,
        fired_at=START,
        job_ids=tuple(r.id for r in results),
    )
    # The rows are real, due rows a worker can claim.
    stats = {s.queue: s for s in await mem.stats()}
    assert stats["default"].ready == 2


async def test_a_stale_expected_watermark_writes_nothing(mem: MemoryDriver) -> None:
    state = mem.scheduler_state
    assert await state.fire(TaskFire("nightly", T1, None, (req("a"),))) is not None

    # A second scheduler that still believes the task never fired.
    assert await state.fire(TaskFire("nightly", T1, None, (req("dup"),))) is None
    # One that read an older watermark than the stored one.
    assert await state.fire(TaskFire("nightly", T2, START, (req("dup2"),))) is None

    assert await rows(mem) == ["a"]
    assert await state.watermarks() == {"nightly": T1}
    [record] = await state.task_fires()
    assert record.occurrence == T1


async def test_fire_moves_the_watermark_past_the_occurrence_in_the_same_write(
    mem: MemoryDriver,
) -> None:
    state = mem.scheduler_state
    await state.advance("hourly", None, START)
    results = await state.fire(TaskFire("hourly", T1, START, (req("a"),), watermark=T2))

    assert results is not None
    assert await state.watermarks() == {"hourly": T2}
    [record] = await state.task_fires()
    assert (record.occurrence, record.watermark) == (T1, T2)
    # The occurrence between them cannot be fired any more: it is behind the watermark.
    with pytest.raises(DriverRequestInvalidError):
        await state.fire(TaskFire("hourly", T1 + timedelta(minutes=30), T2, (req("b"),)))


async def test_fire_dedupes_like_enqueue_and_explicit_ids_meet_their_row(
    mem: MemoryDriver,
) -> None:
    state = mem.scheduler_state
    first = req("same")
    live = await mem.enqueue(first)

    again = EnqueueRequest(**{**_fields(req("same")), "id": first.id})
    results = await state.fire(TaskFire("t", T1, None, (req("same"), again)))

    assert results is not None
    assert [(r.id, r.deduped) for r in results] == [(live.id, True), (live.id, True)]
    assert await rows(mem) == ["same"]
    assert await state.watermarks() == {"t": T1}


def _fields(r: EnqueueRequest) -> dict[str, object]:
    return {name: getattr(r, name) for name in r.__dataclass_fields__}


@pytest.mark.parametrize(
    ("fire", "why"),
    [
        (TaskFire("", T1, None, ()), "empty task"),
        (TaskFire("t", datetime(2030, 1, 1, 1), None, ()), "naive occurrence"),
        (TaskFire("t", T1, None, (), watermark=START), "watermark before occurrence"),
        (TaskFire("t", T1, None, (req("ok"), req(""))), "empty idempotency key"),
        (TaskFire("t", T1, None, (req("ok"), req("x", input={"bad": "\x00"}))), "NUL input"),
        (TaskFire("t", T1, None, (req("ok"), req("y", input={1, 2}))), "not JSON"),
    ],
)
async def test_refused_fires_write_neither_rows_nor_watermark(
    mem: MemoryDriver, fire: TaskFire, why: str
) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await mem.scheduler_state.fire(fire)
    assert await rows(mem) == [], why
    assert await mem.scheduler_state.watermarks() == {}, why
    assert await mem.scheduler_state.task_fires() == [], why


async def test_a_fire_not_after_its_expected_watermark_is_refused(mem: MemoryDriver) -> None:
    state = mem.scheduler_state
    await state.advance("t", None, T1)
    for occurrence in (T1, START):
        with pytest.raises(DriverRequestInvalidError, match="never moves backwards"):
            await state.fire(TaskFire("t", occurrence, T1, (req("a"),)))
    assert await rows(mem) == []
    assert await state.watermarks() == {"t": T1}


async def test_advance_is_compare_and_set_and_never_backwards(mem: MemoryDriver) -> None:
    state = mem.scheduler_state
    assert await state.advance("t", None, START) is True
    assert await state.advance("t", None, T1) is False  # someone set it already
    assert await state.advance("t", T1, T2) is False  # not what is stored
    assert await state.advance("t", START, T1) is True
    with pytest.raises(DriverRequestInvalidError):
        await state.advance("t", T1, T1)
    with pytest.raises(DriverRequestInvalidError):
        await state.advance("t", T1, datetime(2031, 1, 1))  # naive
    assert await state.watermarks() == {"t": T1}
    # Advancing is not firing.
    assert await state.task_fires() == []


async def test_pause_and_resume_tasks(mem: MemoryDriver) -> None:
    state = mem.scheduler_state
    await state.pause_task("b")
    await state.pause_task("a")
    await state.pause_task("a")
    assert await state.paused_tasks() == ["a", "b"]
    await state.resume_task("a")
    await state.resume_task("never-paused")
    assert await state.paused_tasks() == ["b"]
    with pytest.raises(DriverRequestInvalidError):
        await state.pause_task("")


async def test_a_fire_wakes_workers_of_its_queues(mem: MemoryDriver) -> None:
    heard: list[str] = []
    unsubscribe = await mem.wake.subscribe(heard.append)
    try:
        await mem.scheduler_state.fire(TaskFire("t", T1, None, (req("a", queue="mail"),)))
        await asyncio.sleep(0)
    finally:
        await unsubscribe()
    assert heard == ["mail"]


def test_racing_fires_from_threads_land_exactly_once() -> None:
    mem = MemoryDriver(clock=ManualClock(START))
    barrier = threading.Barrier(8)
    answers: list[bool] = []
    lock = threading.Lock()

    def contender(index: int) -> None:
        async def go() -> None:
            barrier.wait()
            got = await mem.scheduler_state.fire(TaskFire("t", T1, None, (req(f"k{index}"),)))
            with lock:
                answers.append(got is not None)

        asyncio.run(go())

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(answers) == [False] * 7 + [True]
    assert len(asyncio.run(rows(mem))) == 1


async def test_closed_driver_refuses_scheduler_calls(mem: MemoryDriver) -> None:
    await mem.close()
    with pytest.raises(DriverUnavailableError):
        await mem.scheduler_state.watermarks()
    with pytest.raises(DriverUnavailableError):
        await mem.scheduler_state.fire(TaskFire("t", T1, None, ()))
    with pytest.raises(DriverUnavailableError):
        await mem.leader.acquire("a", 1000)


# --- the leader lease -------------------------------------------------------------------------


async def test_leader_lease_is_held_renewed_and_lapses_on_the_driver_clock() -> None:
    clock = ManualClock(START)
    mem = MemoryDriver(clock=clock)
    lease = mem.leader

    assert await lease.holder() is None
    assert await lease.acquire("host:1:aaa", 30_000) is True
    assert await lease.acquire("host:2:bbb", 30_000) is False
    assert await lease.holder() == "host:1:aaa"

    clock.advance("20s")
    assert await lease.acquire("host:1:aaa", 30_000) is True  # renewal: until 50 s
    clock.advance("29s")
    assert await lease.acquire("host:2:bbb", 30_000) is False
    assert await lease.holder() == "host:1:aaa"

    clock.advance("1s")  # exactly at expiry: lapsed
    assert await lease.holder() is None
    assert await lease.acquire("host:2:bbb", 30_000) is True
    assert await lease.holder() == "host:2:bbb"
    # The old holder cannot renew a lease it lost.
    assert await lease.acquire("host:1:aaa", 30_000) is False


async def test_release_frees_only_the_holders_own_lease(mem: MemoryDriver) -> None:
    lease = mem.leader
    assert await lease.acquire("a", 30_000)
    await lease.release("b")
    assert await lease.holder() == "a"
    await lease.release("a")
    assert await lease.holder() is None
    assert await lease.acquire("b", 30_000)


async def test_leader_lease_refuses_bad_arguments(mem: MemoryDriver) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await mem.leader.acquire("", 1000)
    with pytest.raises(DriverRequestInvalidError):
        await mem.leader.acquire("a", 0)
    assert await mem.leader.holder() is None
