"""The memory driver's operator members: requeue, remove, promote, their bulk forms, the worker
registry and the outcome counters, on a manual clock."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

from jobs_core.driver import StepResolution
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    DriverRequestInvalidError,
    JobDuplicateError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
)
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock
from jobs_core.types import (
    BULK_LIMIT,
    MAX_COUNTER_ROWS,
    BulkResult,
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    ErrorInfo,
    JobFilter,
    JobInfo,
    JobState,
    NackOptions,
    Settle,
    StepRecord,
    StepWrite,
    WorkerInfo,
)


def request(
    key: str,
    *,
    name: str = "job",
    queue: str = "default",
    delay_ms: int = 0,
    max_attempts: int = 3,
) -> EnqueueRequest:
    return EnqueueRequest(
        name=name,
        queue=queue,
        input={"key": key},
        idempotency_key=key,
        tenant_id="t1",
        max_attempts=max_attempts,
        id=new_id(),
        run_id=new_id(),
        delay_ms=delay_ms,
    )


async def claim_one(driver: MemoryDriver, queue: str = "default", vt: int = 30_000) -> ClaimedJob:
    [job] = await driver.claim(ClaimRequest([queue], 1, vt, "w1"))
    return job


async def get(driver: MemoryDriver, job_id: UUID) -> JobInfo:
    found = await driver.introspect.get(job_id)
    assert found is not None
    return found


async def enqueue(driver: MemoryDriver, key: str, **options: Any) -> UUID:
    return (await driver.enqueue(request(key, **options))).id


async def dead_with_steps(driver: MemoryDriver, key: str, steps: tuple[str, ...]) -> ClaimedJob:
    """Queue a row, run it through ``steps`` (completed), then dead-letter it."""
    job_id = await enqueue(driver, key)
    job = await claim_one(driver)
    assert job.id == job_id
    for name in steps:
        record = StepRecord(name=name, status="completed", output={"step": name})
        assert await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    error = ErrorInfo("boom", code="X_BOOM")
    assert await driver.nack(job.id, NackOptions(job.fence, error=error, dead_letter=True))
    return job


# --- requeue ---------------------------------------------------------------------------------


async def test_requeue_from_step_drops_it_and_every_later_step(driver: MemoryDriver) -> None:
    job = await dead_with_steps(driver, "k", ("a", "b", "c"))
    before = await get(driver, job.id)
    assert before.state is JobState.DEAD and before.attempt == 1

    requeued = await driver.introspect.requeue(job.id, from_step="b")

    assert requeued.state is JobState.READY
    assert requeued.attempt == 0
    assert [s.name for s in requeued.steps] == ["a"]
    assert requeued.last_error == "boom"  # kept for the record
    assert await driver.steps.load(job.run_id) == list(requeued.steps)
    # It runs again as the same run, under a new claim; the old claim no longer fences anything.
    again = await claim_one(driver)
    assert (again.id, again.run_id, again.attempt) == (job.id, job.run_id, 1)
    assert again.claim == job.claim + 1
    assert not await driver.ack(job.id, Settle(job.fence))
    assert await driver.ack(job.id, Settle(again.fence, result="ok"))
    assert (await get(driver, job.id)).state is JobState.DONE


async def test_requeue_without_from_step_keeps_every_step_and_clears_the_result(
    driver: MemoryDriver,
) -> None:
    await enqueue(driver, "k")
    job = await claim_one(driver)
    record = StepRecord(name="a", status="completed", output=1)
    await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    await driver.ack(job.id, Settle(job.fence, result={"total": 3}))
    assert (await get(driver, job.id)).result == {"total": 3}

    requeued = await driver.introspect.requeue(job.id)

    assert [s.name for s in requeued.steps] == ["a"]
    assert requeued.result is None
    stats = {s.queue: s for s in await driver.stats()}["default"]
    assert (stats.ready, stats.done) == (1, 0)


async def test_requeue_refusals(driver: MemoryDriver) -> None:
    with pytest.raises(JobNotFoundError):
        await driver.introspect.requeue(new_id())
    live = await enqueue(driver, "live", queue="other")
    with pytest.raises(JobNotRequeueableError) as refused:
        await driver.introspect.requeue(live)
    assert refused.value.code == "X_JOB_NOT_REQUEUEABLE"

    dead = await dead_with_steps(driver, "k", ("a",))
    holder = await enqueue(driver, "k")  # the key is free once the row died
    with pytest.raises(JobDuplicateError) as duplicate:
        await driver.introspect.requeue(dead.id)
    assert duplicate.value.meta["holder"] == str(holder)
    assert (await get(driver, dead.id)).state is JobState.DEAD

    await driver.introspect.cancel(holder, "make room")
    with pytest.raises(DriverRequestInvalidError):
        await driver.introspect.requeue(dead.id, from_step="nope")
    unchanged = await get(driver, dead.id)
    assert unchanged.state is JobState.DEAD and [s.name for s in unchanged.steps] == ["a"]


# --- remove ----------------------------------------------------------------------------------


async def test_remove_deletes_row_steps_and_frees_the_key(driver: MemoryDriver) -> None:
    dead = await dead_with_steps(driver, "dead", ("a",))
    waiting = await enqueue(driver, "waiting")

    await driver.introspect.remove(dead.id)
    await driver.introspect.remove(waiting)

    assert await driver.introspect.get(dead.id) is None
    assert await driver.steps.load(dead.run_id) == []
    assert (await driver.introspect.list(JobFilter())).rows == ()
    [stats] = await driver.stats()
    assert (stats.ready, stats.dead) == (0, 0)
    # The removed ready row is never handed out, and its key is free.
    assert await driver.claim(ClaimRequest(["default"], 5, 1000, "w1")) == []
    assert await enqueue(driver, "waiting") != waiting
    with pytest.raises(JobNotFoundError):
        await driver.introspect.remove(dead.id)


async def test_a_running_row_is_not_removable(driver: MemoryDriver) -> None:
    job_id = await enqueue(driver, "k")
    await claim_one(driver)
    with pytest.raises(JobNotRemovableError) as refused:
        await driver.introspect.remove(job_id)
    assert refused.value.code == "X_JOB_NOT_REMOVABLE"
    assert (await get(driver, job_id)).state is JobState.RUNNING


# --- promote ---------------------------------------------------------------------------------


async def test_promote_makes_a_delayed_row_due_now(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    job_id = await enqueue(driver, "k", delay_ms=3_600_000)
    assert await driver.claim(ClaimRequest(["default"], 1, 1000, "w1")) == []

    promoted = await driver.introspect.promote(job_id)

    assert promoted.state is JobState.READY and promoted.run_at == clock.now()
    assert (await claim_one(driver)).id == job_id
    with pytest.raises(JobNotPromotableError):
        await driver.introspect.promote(job_id)  # running
    with pytest.raises(JobNotFoundError):
        await driver.introspect.promote(new_id())


async def test_promote_wakes_a_suspended_run_and_refuses_due_rows(driver: MemoryDriver) -> None:
    parked = await enqueue(driver, "parked")
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, delay_ms=86_400_000, park=True))
    ready = await enqueue(driver, "ready")

    promoted = await driver.introspect.promote(parked)

    assert promoted.state is JobState.SUSPENDED
    assert (await claim_one(driver)).id == parked
    with pytest.raises(JobNotPromotableError) as refused:
        await driver.introspect.promote(ready)
    assert refused.value.code == "X_JOB_NOT_PROMOTABLE"


# --- bulk ------------------------------------------------------------------------------------


async def bury(driver: MemoryDriver, count: int, *, queue: str = "default") -> list[UUID]:
    """Queue ``count`` rows and dead-letter them all; answer their ids, oldest first."""
    ids = [
        r.id
        for r in await driver.enqueue_many(
            [request(f"{queue}-{i}", queue=queue) for i in range(count)]
        )
    ]
    claimed = await driver.claim(ClaimRequest([queue], count, 60_000, "w1"))
    for job in claimed:
        await driver.nack(job.id, NackOptions(job.fence, dead_letter=True))
    return ids


async def test_requeue_many_pages_through_1000_at_a_time_newest_first(
    driver: MemoryDriver,
) -> None:
    ids = await bury(driver, BULK_LIMIT + 205)
    dead = JobFilter(state=JobState.DEAD)

    first = await driver.introspect.requeue_many(dead)

    assert first == BulkResult(affected=BULK_LIMIT, remaining=205)
    states = [(await get(driver, job_id)).state for job_id in ids]
    assert set(states[205:]) == {JobState.READY}  # the newest 1,000
    assert set(states[:205]) == {JobState.DEAD}
    assert await driver.introspect.requeue_many(dead) == BulkResult(affected=205, remaining=0)
    assert await driver.introspect.requeue_many(dead) == BulkResult(affected=0, remaining=0)


async def test_requeue_many_leaves_rows_whose_key_a_live_row_holds(driver: MemoryDriver) -> None:
    held = await dead_with_steps(driver, "held", ())
    holder = await enqueue(driver, "held", queue="other")
    twin_a = await dead_with_steps(driver, "twin", ())
    twin_b = await dead_with_steps(driver, "twin", ())
    free = await dead_with_steps(driver, "free", ())

    result = await driver.introspect.requeue_many(JobFilter())

    # One of the twins takes the key and the other stays; "call until zero" ends at once.
    assert result == BulkResult(affected=2, remaining=0)
    assert (await get(driver, held.id)).state is JobState.DEAD
    assert (await get(driver, holder)).state is JobState.READY
    assert (await get(driver, free.id)).state is JobState.READY
    twins = {(await get(driver, twin.id)).state for twin in (twin_a, twin_b)}
    assert twins == {JobState.READY, JobState.DEAD}


async def test_remove_many_keeps_running_rows_and_honours_the_filter(
    driver: MemoryDriver,
) -> None:
    await bury(driver, 3, queue="mail")
    kept = await bury(driver, 2, queue="billing")
    running = await enqueue(driver, "run", queue="mail")
    await claim_one(driver, "mail")
    await enqueue(driver, "waiting", queue="mail")

    result = await driver.introspect.remove_many(JobFilter(queue="mail"))

    assert result == BulkResult(affected=4, remaining=0)
    page = await driver.introspect.list(JobFilter())
    assert {row.id for row in page.rows} == {running, *kept}
    by_queue = {s.queue: s for s in await driver.stats()}
    assert (by_queue["mail"].dead, by_queue["mail"].ready, by_queue["mail"].running) == (0, 0, 1)
    assert by_queue["billing"].dead == 2


async def test_promote_many_takes_only_rows_waiting_on_run_at(driver: MemoryDriver) -> None:
    later = [await enqueue(driver, f"later-{i}", delay_ms=60_000) for i in range(3)]
    due = await enqueue(driver, "due")

    assert await driver.introspect.promote_many(JobFilter()) == BulkResult(3, 0)

    claimed = await driver.claim(ClaimRequest(["default"], 10, 1000, "w1"))
    assert {job.id for job in claimed} == {*later, due}


# --- workers ---------------------------------------------------------------------------------


def worker_info(worker_id: str, in_flight: int = 0) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        host="host-a",
        build="1.2.3",
        started_at=datetime(2029, 12, 31, tzinfo=UTC),
        queues=("default", "mail"),
        slots=8,
        in_flight=tuple(new_id() for _ in range(in_flight)),
    )


async def test_worker_rows_expire_one_ttl_after_their_last_beat(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    registry = driver.workers
    await registry.beat(worker_info("b", in_flight=150), ttl_ms=30_000)
    await registry.beat(worker_info("a"), ttl_ms=30_000)

    listed = await registry.list()
    assert [w.id for w in listed] == ["a", "b"]
    assert len(listed[1].in_flight) == 100
    assert listed[0].last_heartbeat == clock.now()

    clock.advance("20s")
    await registry.beat(worker_info("a"), ttl_ms=30_000)
    clock.advance("15s")  # b's last beat was 35 s ago, a's 15 s ago
    assert [w.id for w in await registry.list()] == ["a"]
    await registry.remove("a")
    assert await registry.list() == []
    with pytest.raises(DriverRequestInvalidError):
        await registry.beat(worker_info("c"), ttl_ms=0)


# --- counters --------------------------------------------------------------------------------

START = datetime(2030, 1, 1, tzinfo=UTC)


async def test_settles_count_into_the_current_minute(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    await driver.enqueue(request("done", name="send"))
    job = await claim_one(driver)
    await driver.ack(job.id, Settle(job.fence, duration_ms=120.5))
    await driver.enqueue(request("retry-then-dead", name="send", max_attempts=2))
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, error=ErrorInfo("x")))
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, error=ErrorInfo("x"), dead_letter=True))
    clock.advance("1m")
    await driver.enqueue(request("failed", name="send"))
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, fail=True))
    # Neither a park, a hand-back nor a cancel is an outcome.
    await driver.enqueue(request("parked", name="send"))
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, park=True, delay_ms=5))
    clock.advance("10ms")
    job = await claim_one(driver)
    await driver.nack(job.id, NackOptions(job.fence, count_attempt=False))
    await driver.introspect.cancel(job.id, "stop")
    # A lease that lapses on the final attempt buries the row dead.
    await driver.enqueue(request("lapsed", name="other", max_attempts=1))
    await claim_one(driver, vt=1_000)
    clock.advance("2s")
    assert await driver.claim(ClaimRequest(["default"], 1, 1_000, "w2")) == []

    buckets = await driver.counters.counters("send", START)

    assert [(b.tier, b.bucket, b.done, b.retried, b.failed, b.dead) for b in buckets] == [
        ("1m", START, 1, 1, 0, 1),
        ("1m", START + timedelta(minutes=1), 0, 0, 1, 0),
    ]
    assert buckets[0].duration_ms == 120.5
    totals = await driver.counters.totals(START)
    assert sorted(totals) == ["other", "send"]
    assert (totals["send"].done, totals["send"].failed, totals["send"].dead) == (1, 1, 1)
    assert totals["other"].dead == 1
    later = await driver.counters.totals(START + timedelta(minutes=1))
    assert (later["send"].done, later["send"].failed) == (0, 1)


async def test_rollup_folds_tiers_and_keeps_totals(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    # One retried attempt per minute for the first 10 minutes.
    await driver.enqueue(request("k", name="tick", max_attempts=100))
    for _ in range(10):
        job = await claim_one(driver)
        await driver.nack(job.id, NackOptions(job.fence))
        clock.advance("1m")
    assert len(await driver.counters.counters("tick", START)) == 10

    clock.set(START + timedelta(hours=24, minutes=9))
    assert await driver.counters.rollup() == 5  # only the first whole 5-minute group aged
    clock.set(START + timedelta(hours=24, minutes=10))
    assert await driver.counters.rollup() == 5
    folded = await driver.counters.counters("tick", START)
    assert [(b.tier, b.bucket, b.retried) for b in folded] == [
        ("5m", START, 5),
        ("5m", START + timedelta(minutes=5), 5),
    ]

    clock.set(START + timedelta(days=7, hours=1))
    assert await driver.counters.rollup() == 2
    [hour] = await driver.counters.counters("tick", START)
    assert (hour.tier, hour.bucket, hour.retried) == ("1h", START, 10)
    assert (await driver.counters.totals(START))["tick"].retried == 10

    clock.set(START + timedelta(days=30, hours=1))
    assert await driver.counters.rollup() == 1
    assert await driver.counters.counters("tick", START) == []
    assert await driver.counters.totals(START) == {}


async def test_a_month_of_settles_stays_within_the_row_bound(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    # Every bucket a month can keep is filled: a retry each hour for 23 days, each 5 minutes for
    # the next 6, each minute for the last 2; rollup runs every 6 hours.
    await driver.enqueue(request("k", name="busy", max_attempts=1_000_000))
    steps = [("1h", 23 * 24), ("5m", 6 * 24 * 12), ("1m", 2 * 24 * 60)]
    settles = 0
    most = 0
    for every, count in steps:
        for _ in range(count):
            job = await claim_one(driver)
            await driver.nack(job.id, NackOptions(job.fence))
            settles += 1
            clock.advance(every)
            now = clock.now()
            if now.minute == 0 and now.hour % 6 == 0:
                await driver.counters.rollup()
                if every == "1m":
                    most = max(most, len(await driver.counters.counters("busy", START)))
    buckets = await driver.counters.counters("busy", START)
    assert 3_700 < most <= MAX_COUNTER_ROWS
    assert {b.tier for b in buckets} == {"1m", "5m", "1h"}
    # The run spans 31 days: the first day's 24 hourly settles aged out, nothing else did.
    assert sum(b.retried for b in buckets) == settles - 24
    ordered = sorted(buckets, key=lambda b: b.bucket)
    for earlier, later in itertools.pairwise(ordered):
        width = {"1m": 60, "5m": 300, "1h": 3600}[earlier.tier]
        assert earlier.bucket + timedelta(seconds=width) <= later.bucket  # tiers never overlap


async def test_step_resolution_still_reads_through_requeued_runs(driver: MemoryDriver) -> None:
    # A once step left started survives a requeue without from_step and can then be resolved.
    await enqueue(driver, "k")
    job = await claim_one(driver)
    record = StepRecord(name="charge", status="started", once=True)
    await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    await driver.nack(job.id, NackOptions(job.fence, dead_letter=True))
    await driver.introspect.requeue(job.id)
    await driver.introspect.resolve_step(job.id, "charge", StepResolution(ran=True, output=7))
    [step] = await driver.steps.load(job.run_id)
    assert (step.status, step.output) == ("completed", 7)
