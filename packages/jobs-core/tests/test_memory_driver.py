"""The memory driver: every member of the protocol and its capabilities, on a manual clock."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from jobs_conformance.target import claim
from jobs_conformance.target import request as conformance_request
from jobs_core.driver import (
    CAPABILITIES,
    BackfillLedger,
    ChildJobs,
    CounterStore,
    EventBus,
    EventQuery,
    Introspector,
    JobDriver,
    LeaseRequest,
    LeaseStore,
    OutboxStore,
    PublishRequest,
    RateStore,
    RetentionStore,
    StepResolution,
    StepStore,
    WakeSource,
    WorkerRegistry,
    open_driver,
)
from jobs_core.drivers.memory import MemoryDriver, open_memory_driver
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobNotCancellableError,
    JobNotFoundError,
    JobPageInvalidError,
    StepNotResolvableError,
)
from jobs_core.ids import new_id
from jobs_core.types import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    BuriedJob,
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    ErrorInfo,
    Fence,
    JobFilter,
    JobInfo,
    JobState,
    NackOptions,
    Settle,
    StepRecord,
    StepWrite,
)

START = datetime(2030, 1, 1, tzinfo=UTC)


class TickClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self._now = START
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        self._now += timedelta(milliseconds=ms)
        self._mono += ms / 1000


@pytest.fixture
def tclock() -> TickClock:
    return TickClock()


@pytest.fixture
async def mem(tclock: TickClock) -> AsyncIterator[MemoryDriver]:
    driver = MemoryDriver(tclock)
    yield driver
    await driver.close()


def request(key: str = "k", *, name: str = "job", **options: Any) -> EnqueueRequest:
    """The conformance suite's request builder, stamped with this suite's trace and actor."""
    built = conformance_request(key, name=name, **options)
    return replace(built, traceparent="00-trace-span-01", enqueued_by="user-1")


async def info(driver: MemoryDriver, job_id: UUID) -> JobInfo:
    found = await driver.introspect.get(job_id)
    assert found is not None
    return found


# --- shape -----------------------------------------------------------------------------------


async def test_protocols_capabilities_and_describe(mem: MemoryDriver) -> None:
    assert isinstance(mem, JobDriver)
    assert isinstance(mem.steps, StepStore)
    assert isinstance(mem.introspect, Introspector)
    assert isinstance(mem.leases, LeaseStore)
    assert isinstance(mem.events, EventBus)
    assert isinstance(mem.wake, WakeSource)
    assert isinstance(mem.workers, WorkerRegistry)
    assert isinstance(mem.counters, CounterStore)
    assert mem.events.wakes_waiters is True
    assert mem.name == "memory"
    carried = {
        "introspect",
        "leases",
        "events",
        "wake",
        "workers",
        "counters",
        "scheduler_state",
        "leader",
        "outbox",
        "backfills",
        "retention",
        "priority",
        "debounce",
        "children",
        "rate",
    }
    assert isinstance(mem.outbox, OutboxStore)
    assert isinstance(mem.backfills, BackfillLedger)
    assert isinstance(mem.retention, RetentionStore)
    assert isinstance(mem.children, ChildJobs)
    assert isinstance(mem.rate, RateStore)
    assert mem.capabilities == carried
    assert set(CAPABILITIES) == carried, "the memory driver carries every capability"
    described = mem.describe()
    assert described == {
        "name": "memory",
        "capabilities": sorted(carried),
        "not_applicable": sorted(set(CAPABILITIES) - carried),
    }


def test_open_memory_driver() -> None:
    assert isinstance(open_driver("memory://"), MemoryDriver)
    clock = TickClock()
    driver = open_memory_driver("memory://", clock=clock)
    assert isinstance(driver, MemoryDriver)
    assert open_memory_driver("memory://") is not driver
    for url in ("memory://host", "memory://x/y", "redis://", "memory://?a=1"):
        with pytest.raises(DriverRequestInvalidError):
            open_memory_driver(url)
    with pytest.raises(DriverRequestInvalidError):
        open_memory_driver("memory://", pool_size=3)
    with pytest.raises(DriverRequestInvalidError):
        open_memory_driver("memory://", clock="now")


# --- enqueue ---------------------------------------------------------------------------------


async def test_dedupe_per_name_tenant_and_key(mem: MemoryDriver) -> None:
    first = await mem.enqueue(request("k"))
    again = await mem.enqueue(request("k"))
    assert not first.deduped
    assert again == EnqueueResult(first.id, first.run_id, deduped=True)
    other_tenant = await mem.enqueue(request("k", tenant="t2"))
    other_name = await mem.enqueue(request("k", name="other"))
    assert not other_tenant.deduped and not other_name.deduped
    assert len({first.id, other_tenant.id, other_name.id}) == 3
    # No tenant and the empty tenant are one key space.
    no_tenant = await mem.enqueue(request("k", tenant=None))
    assert (await mem.enqueue(request("k", tenant=""))).id == no_tenant.id
    assert mem.live_count() == 4


async def test_running_and_retrying_rows_hold_their_key(mem: MemoryDriver) -> None:
    first = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    assert (await mem.enqueue(request("k"))).id == first.id
    await mem.nack(job.id, NackOptions(job.fence, delay_ms=60_000))
    assert (await info(mem, first.id)).state is JobState.DELAYED
    assert (await mem.enqueue(request("k"))).id == first.id


async def test_finished_row_does_not_block_its_key(mem: MemoryDriver) -> None:
    first = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    assert await mem.ack(job.id, Settle(job.fence))
    second = await mem.enqueue(request("k"))
    assert not second.deduped and second.id != first.id


async def test_explicit_id_meets_its_row_live_and_finished(mem: MemoryDriver) -> None:
    job_id = new_id()
    first = await mem.enqueue(request("k", job_id=job_id))
    # Another key, same id: the id wins and nothing is inserted.
    met = await mem.enqueue(request("other", job_id=job_id))
    assert met == EnqueueResult(job_id, first.run_id, deduped=True)
    [job] = await claim(mem)
    await mem.ack(job.id, Settle(job.fence))
    after_finish = await mem.enqueue(request("k", job_id=job_id))
    assert after_finish == EnqueueResult(job_id, first.run_id, deduped=True)
    assert mem.live_count() == 0


async def test_enqueue_honours_ids_and_attribution(mem: MemoryDriver) -> None:
    run_id = new_id()
    result = await mem.enqueue(request("k", run_id=run_id, max_attempts=7))
    assert result.run_id == run_id
    [job] = await claim(mem)
    assert (job.run_id, job.max_attempts, job.attempt, job.claim) == (run_id, 7, 1, 1)
    assert (job.tenant_id, job.idempotency_key, job.input) == ("t1", "k", {"key": "k"})
    assert (job.traceparent, job.enqueued_by, job.created_at) == (
        "00-trace-span-01",
        "user-1",
        START,
    )


async def test_enqueue_many_keeps_order_and_dedupes_inside_the_batch(mem: MemoryDriver) -> None:
    live = await mem.enqueue(request("held"))
    results = await mem.enqueue_many(
        [request("a"), request("b"), request("a"), request("held"), request("c")]
    )
    assert [r.deduped for r in results] == [False, False, True, True, False]
    assert results[2].id == results[0].id
    assert results[3].id == live.id
    claimed = await claim(mem, limit=10)
    assert [j.idempotency_key for j in claimed] == ["held", "a", "b", "c"]


async def test_enqueue_many_refuses_the_whole_batch(mem: MemoryDriver) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await mem.enqueue_many([request("a"), request("b", payload={"bad": {1, 2}})])
    assert mem.live_count() == 0
    assert await mem.stats() == []


@pytest.mark.parametrize(
    "bad",
    [
        {"set": {1}},
        {"nan": float("nan")},
        {"nul": "a\u0000b"},
        {"a\u0000": 1},
        object(),
    ],
)
async def test_input_that_no_driver_can_store_is_refused(mem: MemoryDriver, bad: Any) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await mem.enqueue(request("k", payload=bad))


async def test_escaped_backslash_before_u0000_is_not_a_nul(mem: MemoryDriver) -> None:
    text = "\\u0000 is how JSON spells NUL"
    await mem.enqueue(request("k", payload={"doc": text}))
    [job] = await claim(mem)
    assert job.input == {"doc": text}


@pytest.mark.parametrize(
    "change",
    [
        {"idempotency_key": ""},
        {"name": ""},
        {"queue": ""},
        {"max_attempts": 0},
        {"run_at": datetime(2030, 1, 1)},  # naive
        {"delay_ms": 10**18},
    ],
)
async def test_malformed_enqueue_is_refused(mem: MemoryDriver, change: dict[str, Any]) -> None:
    base = request("k")
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    with pytest.raises(DriverRequestInvalidError):
        await mem.enqueue(EnqueueRequest(**(fields | change)))


async def test_stored_input_is_isolated_from_the_caller(mem: MemoryDriver) -> None:
    payload = {"items": [1, 2]}
    result = await mem.enqueue(request("k", payload=payload))
    payload["items"].append(3)
    [job] = await claim(mem)
    assert job.input == {"items": [1, 2]}
    job.input["items"].clear()
    assert (await info(mem, result.id)).input == {"items": [1, 2]}


async def test_delayed_and_ready(mem: MemoryDriver, tclock: TickClock) -> None:
    later = await mem.enqueue(request("later", delay_ms=5_000))
    at = await mem.enqueue(request("at", run_at=START + timedelta(seconds=10)))
    past = await mem.enqueue(request("past", run_at=datetime(1960, 1, 1, tzinfo=UTC)))
    assert (await info(mem, later.id)).state is JobState.DELAYED
    assert (await info(mem, at.id)).run_at == START + timedelta(seconds=10)
    past_info = await info(mem, past.id)
    # A past run_at is due now and stored as now, never older than rows already waiting.
    assert (past_info.state, past_info.run_at) == (JobState.READY, START)
    assert [j.id for j in await claim(mem)] == [past.id]
    tclock.advance(5_000)
    assert [j.id for j in await claim(mem)] == [later.id]
    tclock.advance(4_999)
    assert await claim(mem) == []
    tclock.advance(1)
    assert [j.id for j in await claim(mem)] == [at.id]


async def test_run_at_in_another_zone_is_stored_in_utc(mem: MemoryDriver) -> None:
    local = datetime(2030, 1, 1, 3, 0, tzinfo=timezone(timedelta(hours=2)))
    result = await mem.enqueue(request("k", run_at=local))
    stored = (await info(mem, result.id)).run_at
    assert stored == local and stored.tzinfo is UTC


# --- claim -----------------------------------------------------------------------------------


async def test_claim_order_limit_and_ordinal(mem: MemoryDriver, tclock: TickClock) -> None:
    c = await mem.enqueue(request("c", delay_ms=300))
    a = await mem.enqueue(request("a", delay_ms=100))
    b = await mem.enqueue(request("b", delay_ms=100))
    tclock.advance(300)
    first = await claim(mem, limit=2)
    assert [j.id for j in first] == [a.id, b.id]
    assert [j.claim for j in first] == [1, 1]
    [rest] = await claim(mem, limit=2)
    assert rest.id == c.id
    assert await claim(mem) == []


async def test_claim_filters_and_merges_queues(mem: MemoryDriver, tclock: TickClock) -> None:
    x1 = await mem.enqueue(request("x1", queue="x"))
    tclock.advance(1)
    y1 = await mem.enqueue(request("y1", queue="y"))
    tclock.advance(1)
    x2 = await mem.enqueue(request("x2", queue="x"))
    await mem.enqueue(request("z1", queue="z"))
    assert await claim(mem, "nope") == []
    claimed = await claim(mem, "y", "x", "x", limit=10)
    assert [j.id for j in claimed] == [x1.id, y1.id, x2.id]
    assert {j.queue for j in await claim(mem, "z")} == {"z"}


async def test_paused_queue_yields_nothing_until_resumed(mem: MemoryDriver) -> None:
    await mem.enqueue(request("a"))
    await mem.enqueue(request("b", queue="other"))
    await mem.introspect.pause_queue("default")
    assert await mem.introspect.paused_queues() == ["default"]
    assert [j.queue for j in await claim(mem, "default", "other")] == ["other"]
    assert await claim(mem) == []
    # Enqueues still land while paused.
    assert not (await mem.enqueue(request("c"))).deduped
    await mem.introspect.resume_queue("default")
    assert await mem.introspect.paused_queues() == []
    assert len(await claim(mem)) == 2


@pytest.mark.parametrize(
    "req",
    [
        ClaimRequest(queues=[], limit=1, visibility_timeout_ms=1_000, worker_id="w"),
        ClaimRequest(queues=["default"], limit=0, visibility_timeout_ms=1_000, worker_id="w"),
    ],
)
async def test_claim_refuses_empty_queues_and_limit(mem: MemoryDriver, req: ClaimRequest) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await mem.claim(req)


async def test_lapsed_lease_is_reclaimed_with_the_attempt_counted(
    mem: MemoryDriver, tclock: TickClock
) -> None:
    result = await mem.enqueue(request("k", max_attempts=3))
    [first] = await claim(mem, vt=1_000, worker="w1")
    assert first.attempt == 1
    tclock.advance(999)
    assert await claim(mem, worker="w2") == []
    tclock.advance(1)
    [second] = await claim(mem, vt=1_000, worker="w2")
    assert (second.id, second.attempt, second.claim, second.worker_id) == (result.id, 2, 2, "w2")
    # The stale claim can settle nothing.
    assert not await mem.ack(first.id, Settle(first.fence))
    assert not await mem.nack(first.id, NackOptions(first.fence))
    assert not await mem.heartbeat(first.id, first.fence, 1_000)
    assert await mem.ack(second.id, Settle(second.fence, result={"ok": True}))
    done = await info(mem, result.id)
    assert (done.state, done.attempt, done.claim, done.result) == (
        JobState.DONE,
        2,
        2,
        {"ok": True},
    )


async def test_lapsed_running_row_keeps_its_run_at_place(
    mem: MemoryDriver, tclock: TickClock
) -> None:
    old = await mem.enqueue(request("old"))
    [job] = await claim(mem, vt=1_000)
    tclock.advance(500)
    newer = await mem.enqueue(request("newer"))
    tclock.advance(500)
    assert [j.id for j in await claim(mem, limit=2, worker="w2")] == [old.id, newer.id]
    assert job.id == old.id


@pytest.mark.parametrize(("dropped", "state"), [(False, JobState.DEAD), (True, JobState.FAILED)])
async def test_final_attempt_lapse_is_buried(
    mem: MemoryDriver, tclock: TickClock, dropped: bool, state: JobState
) -> None:
    result = await mem.enqueue(request("k", name="crasher", max_attempts=2))
    other = await mem.enqueue(request("fine", name="fine", max_attempts=2))
    await claim(mem, vt=1_000, limit=1)
    tclock.advance(1_000)
    [again] = await claim(mem, vt=1_000, limit=1)
    assert (again.id, again.attempt) == (result.id, 2)
    tclock.advance(1_000)
    told: list[BuriedJob] = []
    handed = await claim(
        mem,
        vt=1_000,
        drop_exhausted=frozenset({"crasher"}) if dropped else frozenset(),
        on_exhausted=told.append,
    )
    assert [j.id for j in handed] == [other.id]
    assert told == [BuriedJob(result.id, "crasher", "default", state)]
    buried = await info(mem, result.id)
    assert (buried.state, buried.attempt, buried.last_error) == (
        state,
        2,
        LEASE_LAPSED_FINAL_ATTEMPT,
    )
    # The buried row freed its key.
    assert not (await mem.enqueue(request("k", name="crasher"))).deduped


async def test_heartbeat_extends_the_lease(mem: MemoryDriver, tclock: TickClock) -> None:
    await mem.enqueue(request("k"))
    [job] = await claim(mem, vt=1_000)
    tclock.advance(800)
    assert await mem.heartbeat(job.id, job.fence, 1_000)
    tclock.advance(800)
    assert await claim(mem, worker="w2") == []
    tclock.advance(200)
    [again] = await claim(mem, worker="w2")
    assert again.id == job.id and again.attempt == 2


async def test_heartbeat_after_lapse_before_reclaim_keeps_the_row(
    mem: MemoryDriver, tclock: TickClock
) -> None:
    await mem.enqueue(request("k"))
    [job] = await claim(mem, vt=1_000)
    tclock.advance(1_500)
    # The lapse was seen by a claim of another queue's rows: nothing was taken from ours.
    assert await claim(mem, "other") == []
    assert await mem.heartbeat(job.id, job.fence, 1_000)
    assert await claim(mem, worker="w2") == []
    assert await mem.ack(job.id, Settle(job.fence))


async def test_settles_are_fenced_on_worker_and_claim(mem: MemoryDriver) -> None:
    await mem.enqueue(request("k"))
    [job] = await claim(mem)
    for fence in (Fence("intruder", job.claim), Fence(job.worker_id, job.claim + 1)):
        assert not await mem.ack(job.id, Settle(fence))
        assert not await mem.nack(job.id, NackOptions(fence, dead_letter=True))
        assert not await mem.heartbeat(job.id, fence, 1_000)
        assert not await mem.introspect.record_progress(job.id, fence, {"done": 1})
    assert not await mem.ack(new_id(), Settle(job.fence))
    assert (await info(mem, job.id)).state is JobState.RUNNING
    assert await mem.ack(job.id, Settle(job.fence))
    assert not await mem.ack(job.id, Settle(job.fence))


@pytest.mark.parametrize(
    ("flags", "state", "counted"),
    [
        ({"dead_letter": True, "fail": True, "park": True, "delay_ms": 5}, JobState.DEAD, 1),
        ({"fail": True, "park": True, "delay_ms": 5}, JobState.FAILED, 1),
        ({"park": True, "delay_ms": 5}, JobState.SUSPENDED, 0),
        ({"park": True}, JobState.SUSPENDED, 0),
        ({"delay_ms": 5}, JobState.DELAYED, 1),
        ({}, JobState.READY, 1),
        ({"count_attempt": False}, JobState.READY, 0),
        ({"dead_letter": True, "count_attempt": False}, JobState.DEAD, 0),
    ],
)
async def test_nack_state_and_attempt_counting(
    mem: MemoryDriver, flags: dict[str, Any], state: JobState, counted: int
) -> None:
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    assert await mem.nack(job.id, NackOptions(job.fence, **flags))
    row = await info(mem, result.id)
    assert (row.state, row.attempt) == (state, counted)
    if state in (JobState.DEAD, JobState.FAILED):
        assert not (await mem.enqueue(request("k"))).deduped
    else:
        assert (await mem.enqueue(request("k"))).id == result.id


async def test_uncounted_nack_does_not_advance_the_attempt(mem: MemoryDriver) -> None:
    await mem.enqueue(request("k"))
    [first] = await claim(mem)
    await mem.nack(first.id, NackOptions(first.fence, count_attempt=False))
    [second] = await claim(mem)
    assert (second.attempt, second.claim) == (1, 2)
    await mem.nack(second.id, NackOptions(second.fence))
    [third] = await claim(mem)
    assert (third.attempt, third.claim) == (2, 3)


async def test_nack_delay_and_error_are_stored(mem: MemoryDriver, tclock: TickClock) -> None:
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    error = ErrorInfo("boom", code="X_APP", stack="Traceback ...")
    await mem.nack(job.id, NackOptions(job.fence, error=error, delay_ms=2_000))
    row = await info(mem, result.id)
    assert (row.last_error, row.last_error_code, row.last_error_stack) == (
        "boom",
        "X_APP",
        "Traceback ...",
    )
    assert row.run_at == START + timedelta(seconds=2)
    tclock.advance(1_999)
    assert await claim(mem) == []
    tclock.advance(1)
    [again] = await claim(mem)
    assert again.attempt == 2


async def test_suspended_row_is_claimed_when_due(mem: MemoryDriver, tclock: TickClock) -> None:
    await mem.enqueue(request("k"))
    [job] = await claim(mem)
    await mem.nack(job.id, NackOptions(job.fence, park=True, delay_ms=60_000))
    tclock.advance(59_999)
    assert await claim(mem) == []
    tclock.advance(1)
    [again] = await claim(mem)
    assert (again.attempt, again.claim) == (1, 2)


# --- stats, demand, helpers ------------------------------------------------------------------


async def test_stats_and_demand_after_a_scripted_sequence(
    mem: MemoryDriver, tclock: TickClock
) -> None:
    await mem.enqueue_many([request(f"r{i}") for i in range(3)])  # a: 3 ready at START
    await mem.enqueue(request("later", delay_ms=10_000))  # a: delayed
    await mem.enqueue(request("b1", queue="b"))
    tclock.advance(1_000)
    running = await claim(mem, limit=2, vt=5_000)  # a: 2 running, 1 ready
    [b1] = await claim(mem, "b")
    await mem.ack(b1.id, Settle(b1.fence))  # b: 1 done
    await mem.enqueue(request("b2", queue="b"))
    [b2] = await claim(mem, "b")
    await mem.nack(b2.id, NackOptions(b2.fence, park=True, delay_ms=1_000))  # b: suspended
    await mem.enqueue(request("b3", queue="b"))
    [b3] = await claim(mem, "b")
    await mem.nack(b3.id, NackOptions(b3.fence, dead_letter=True))  # b: dead
    cancelled = await mem.enqueue(request("b4", queue="b"))
    await mem.introspect.cancel(cancelled.id, "not needed")  # b: cancelled
    await mem.enqueue(request("c1", queue="c"))
    await mem.introspect.pause_queue("c")
    tclock.advance(500)

    stats = {s.queue: s for s in await mem.stats()}
    assert list(stats) == ["b", "c", "default"]
    a = stats["default"]
    assert (a.ready, a.delayed, a.running, a.suspended, a.done) == (1, 1, 2, 0, 0)
    assert a.oldest_ready_ms == 1_500
    b = stats["b"]
    assert (b.ready, b.running, b.suspended, b.done, b.dead, b.cancelled) == (0, 0, 1, 1, 1, 1)
    assert b.oldest_ready_ms == 0
    assert (stats["c"].ready, stats["c"].oldest_ready_ms) == (1, 500)
    assert await mem.demand() == {"b": 0, "c": 0, "default": 3}

    tclock.advance(10_000)  # leases lapse, the delayed row and the suspended one are due
    stats = {s.queue: s for s in await mem.stats()}
    assert (stats["default"].ready, stats["default"].delayed, stats["default"].running) == (2, 0, 2)
    assert await mem.demand() == {"b": 1, "c": 0, "default": 4}
    await mem.introspect.resume_queue("c")
    assert (await mem.demand())["c"] == 1
    assert len(running) == 2 and mem.live_count() == 6


async def test_next_due_at_and_live_count(mem: MemoryDriver, tclock: TickClock) -> None:
    assert mem.next_due_at() is None
    await mem.enqueue(request("a", delay_ms=5_000))
    await mem.enqueue(request("b", delay_ms=9_000, queue="paused"))
    await mem.introspect.pause_queue("paused")
    assert mem.next_due_at() == START + timedelta(seconds=5)
    tclock.advance(5_000)
    await claim(mem, vt=2_000)
    assert mem.next_due_at() == START + timedelta(seconds=7)
    assert mem.live_count() == 2


# --- steps -----------------------------------------------------------------------------------


async def test_step_writes_are_fenced_and_numbered(mem: MemoryDriver, tclock: TickClock) -> None:
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem, vt=1_000)

    def write(record: StepRecord, fence: Fence | None = job.fence) -> StepWrite:
        return StepWrite(job.id if fence else None, fence, job.run_id, record)

    assert await mem.steps.write(write(StepRecord("a", "completed", output={"n": 1})))
    assert await mem.steps.write(write(StepRecord("b", "failed", attempts=1, error="x")))
    assert await mem.steps.write(write(StepRecord("b", "completed", output=[2], seq=99)))
    assert await mem.steps.write(write(StepRecord("c", "completed", output="three")))
    steps = await mem.steps.load(job.run_id)
    assert [(s.name, s.seq, s.status, s.output) for s in steps] == [
        ("a", 0, "completed", {"n": 1}),
        ("b", 1, "completed", [2]),
        ("c", 2, "completed", "three"),
    ]
    steps[0].output["n"] = 42
    assert (await mem.steps.load(job.run_id))[0].output == {"n": 1}
    # The claim is lost: nothing more lands.
    tclock.advance(1_000)
    [again] = await claim(mem, worker="w2")
    assert not await mem.steps.write(write(StepRecord("d", "completed")))
    assert await mem.steps.write(write(StepRecord("d", "completed"), again.fence))
    # A fence over another run does not hold.
    assert not await mem.steps.write(
        StepWrite(job.id, again.fence, new_id(), StepRecord("e", "completed"))
    )
    assert [s.name for s in (await info(mem, result.id)).steps] == ["a", "b", "c", "d"]
    assert await mem.steps.load(new_id()) == []
    assert await mem.steps.now() == tclock.now()


async def test_unfenced_and_half_fenced_step_writes(mem: MemoryDriver) -> None:
    run_id = new_id()
    assert await mem.steps.write(StepWrite(None, None, run_id, StepRecord("inline", "completed")))
    with pytest.raises(DriverRequestInvalidError):
        await mem.steps.write(StepWrite(new_id(), None, run_id, StepRecord("x", "completed")))
    with pytest.raises(DriverRequestInvalidError):
        await mem.steps.write(StepWrite(None, Fence("w", 1), run_id, StepRecord("x", "completed")))
    with pytest.raises(DriverRequestInvalidError):
        await mem.steps.write(
            StepWrite(None, None, run_id, StepRecord("x", "completed", output={1, 2}))
        )


# --- introspection ---------------------------------------------------------------------------


async def test_listing_pages_both_ways_without_repeats_or_misses(
    mem: MemoryDriver, tclock: TickClock
) -> None:
    ids: list[UUID] = []
    for i in range(450):
        ids.append((await mem.enqueue(request(f"k{i}"))).id)
        if i % 7 == 0:  # several rows share one created_at: the id breaks ties
            tclock.advance(1)
    newest_first = ids[::-1]

    pages = []
    page = await mem.introspect.list(JobFilter(limit=200))
    pages.append(page)
    while page.next is not None:
        page = await mem.introspect.list(JobFilter(limit=200, after=page.next))
        pages.append(page)
    assert [len(p.rows) for p in pages] == [200, 200, 50]
    assert [r.id for p in pages for r in p.rows] == newest_first
    assert pages[0].prev is None and pages[1].prev is not None and pages[2].next is None
    assert all(r.steps == () for p in pages for r in p.rows)

    backwards = []
    page = pages[-1]
    while page.prev is not None:
        page = await mem.introspect.list(JobFilter(limit=200, before=page.prev))
        backwards.append(page)
    assert [len(p.rows) for p in backwards] == [200, 200]
    assert [r.id for p in reversed(backwards) for r in p.rows] == newest_first[:400]
    assert backwards[-1].prev is None and backwards[-1].next is not None


async def test_listing_filters(mem: MemoryDriver, tclock: TickClock) -> None:
    a = await mem.enqueue(request("a", name="n1", queue="q1", tenant="t1"))
    tclock.advance(10)
    b = await mem.enqueue(request("b", name="n2", queue="q1", tenant="t2"))
    tclock.advance(10)
    c = await mem.enqueue(request("c", name="n1", queue="q2", tenant="t1", delay_ms=1_000))

    async def ids(**kw: Any) -> list[UUID]:
        return [r.id for r in (await mem.introspect.list(JobFilter(**kw))).rows]

    assert await ids() == [c.id, b.id, a.id]
    assert await ids(queue="q1") == [b.id, a.id]
    assert await ids(name="n1") == [c.id, a.id]
    assert await ids(state=JobState.DELAYED) == [c.id]
    assert await ids(tenant_id="t2") == [b.id]
    assert await ids(id_prefix=str(b.id)[:30].upper()) == [b.id]
    assert await ids(created_from=START + timedelta(milliseconds=10)) == [c.id, b.id]
    assert await ids(created_to=START + timedelta(milliseconds=10)) == [a.id]
    assert await ids(queue="q1", limit=1) == [b.id]
    filtered = await mem.introspect.list(JobFilter(name="n1", limit=1))
    assert filtered.next is not None
    assert [
        r.id for r in (await mem.introspect.list(JobFilter(name="n1", after=filtered.next))).rows
    ] == [a.id]


@pytest.mark.parametrize(
    "flt",
    [
        JobFilter(limit=201),
        JobFilter(limit=0),
        JobFilter(after="not-a-cursor"),
        JobFilter(before="bWVtMXwxfDI="),  # base64 of "mem1|1|2": right tag, wrong shape
        JobFilter(after="b2Zmc2V0OjEwMA"),  # another driver's cursor ("offset:100")
        JobFilter(after="bWVtMXwxfDI", before="bWVtMXwxfDI"),
    ],
)
async def test_listing_refuses_bad_limits_and_foreign_cursors(
    mem: MemoryDriver, flt: JobFilter
) -> None:
    await mem.enqueue(request("k"))
    with pytest.raises(JobPageInvalidError):
        await mem.introspect.list(flt)


async def test_get_shows_the_whole_row(mem: MemoryDriver) -> None:
    assert await mem.introspect.get(new_id()) is None
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    assert await mem.introspect.record_progress(job.id, job.fence, {"done": 3, "total": 10})
    await mem.steps.write(StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed")))
    row = await info(mem, result.id)
    assert (row.state, row.claimed_by, row.claim, row.attempt) == (JobState.RUNNING, "w1", 1, 0)
    assert row.progress == {"done": 3, "total": 10}
    assert [s.name for s in row.steps] == ["s"]
    assert (row.created_at, row.updated_at, row.run_at) == (START, START, START)


async def test_cancel_rules(mem: MemoryDriver) -> None:
    with pytest.raises(JobNotFoundError):
        await mem.introspect.cancel(new_id(), "why")
    queued = await mem.enqueue(request("queued"))
    running = await mem.enqueue(request("running", queue="q2"))
    [job] = await claim(mem, "q2")

    cancelled = await mem.introspect.cancel(queued.id, "operator said so")
    assert (cancelled.state, cancelled.last_error, cancelled.last_error_code) == (
        JobState.CANCELLED,
        "operator said so",
        "X_JOB_CANCELLED",
    )
    assert await claim(mem) == []
    assert not (await mem.enqueue(request("queued"))).deduped

    await mem.introspect.cancel(running.id, "stop")
    assert not await mem.heartbeat(job.id, job.fence, 1_000)
    assert not await mem.ack(job.id, Settle(job.fence))
    assert not await mem.steps.write(
        StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed"))
    )
    with pytest.raises(JobNotCancellableError):
        await mem.introspect.cancel(running.id, "again")


async def test_resolve_step_rules(mem: MemoryDriver) -> None:
    with pytest.raises(JobNotFoundError):
        await mem.introspect.resolve_step(new_id(), "s", StepResolution(ran=True))
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem)

    async def put(record: StepRecord) -> None:
        assert await mem.steps.write(StepWrite(job.id, job.fence, job.run_id, record))

    await put(StepRecord("first", "completed", output=1))
    await put(StepRecord("charge", "started", once=True))
    await put(StepRecord("plain", "started"))
    await put(StepRecord("refund", "started", once=True))
    await put(StepRecord("later", "completed", output=2))
    for step in ("missing", "first", "plain"):
        with pytest.raises(StepNotResolvableError):
            await mem.introspect.resolve_step(result.id, step, StepResolution(ran=True))

    await mem.introspect.resolve_step(
        result.id, "charge", StepResolution(ran=True, output={"id": 9})
    )
    await mem.introspect.resolve_step(result.id, "refund", StepResolution(ran=False))
    steps = {s.name: s for s in await mem.steps.load(job.run_id)}
    assert (steps["charge"].status, steps["charge"].output) == ("completed", {"id": 9})
    assert steps["charge"].completed_at == START
    assert "refund" not in steps
    assert [(s.name, s.seq) for s in await mem.steps.load(job.run_id)] == [
        ("first", 0),
        ("charge", 1),
        ("plain", 2),
        ("later", 4),
    ]
    with pytest.raises(StepNotResolvableError):
        await mem.introspect.resolve_step(result.id, "charge", StepResolution(ran=True))
    # The deleted step runs again later and never collides with a kept one.
    await put(StepRecord("refund", "completed"))
    assert [(s.name, s.seq) for s in await mem.steps.load(job.run_id)][-1] == ("refund", 5)


async def test_record_progress_is_fenced(mem: MemoryDriver) -> None:
    result = await mem.enqueue(request("k"))
    [job] = await claim(mem)
    assert await mem.introspect.record_progress(job.id, job.fence, 0.5)
    await mem.ack(job.id, Settle(job.fence))
    assert not await mem.introspect.record_progress(job.id, job.fence, 1.0)
    assert (await info(mem, result.id)).progress == 0.5


# --- leases ----------------------------------------------------------------------------------


async def test_lease_slots_holders_and_expiry(mem: MemoryDriver, tclock: TickClock) -> None:
    leases = mem.leases

    def req(holder: str, ttl_ms: int = 1_000) -> LeaseRequest:
        return LeaseRequest("job:send", limit=2, holder=holder, ttl_ms=ttl_ms)

    assert await leases.acquire(req("r1"))
    tclock.advance(100)
    assert await leases.acquire(req("r2"))
    assert not await leases.acquire(req("r3"))
    assert await leases.holders("job:send") == ["r1", "r2"]
    # A holder's own slot is renewed, keeping its place.
    tclock.advance(500)
    assert await leases.acquire(req("r1"))
    assert await leases.holders("job:send") == ["r1", "r2"]
    tclock.advance(500)  # r2 expired, r1 renewed at +600 still holds
    assert await leases.holders("job:send") == ["r1"]
    assert not await leases.renew(req("r2"))
    assert await leases.acquire(req("r3"))
    assert await leases.holders("job:send") == ["r1", "r3"]
    assert await leases.renew(req("r3", ttl_ms=5_000))
    await leases.release("job:send", "r1")
    await leases.release("job:send", "nobody")
    assert await leases.holders("job:send") == ["r3"]
    tclock.advance(4_999)
    assert await leases.holders("job:send") == ["r3"]
    tclock.advance(1)
    assert await leases.holders("job:send") == []
    assert await leases.holders("job:unknown") == []
    assert await leases.acquire(req("solo"))
    await leases.release("job:send", "solo")
    assert await leases.holders("job:send") == []
    assert not await leases.renew(req("solo"))
    with pytest.raises(DriverRequestInvalidError):
        await leases.acquire(LeaseRequest("k", limit=0, holder="h", ttl_ms=1_000))


# --- events ----------------------------------------------------------------------------------


async def test_events_publish_find_match_and_expiry(mem: MemoryDriver, tclock: TickClock) -> None:
    bus = mem.events
    first = await bus.publish(PublishRequest("paid", {"order": 1, "ok": True}, None, 10_000))
    assert (first.published_at, first.expires_at) == (START, START + timedelta(seconds=10))
    tclock.advance(100)
    second = await bus.publish(PublishRequest("paid", {"order": 2}, "corr-2", 60_000))
    await bus.publish(PublishRequest("shipped", {"order": 1}, None, 60_000))

    async def find(**kw: Any) -> UUID | None:
        found = await bus.find(EventQuery("paid", **({"since": START} | kw)))
        return None if found is None else found.id

    assert await find() == first.id
    assert await find(match={"order": 2}) == second.id
    assert await find(match={"order": 1, "ok": True}) == first.id
    assert await find(match={"order": 3}) is None
    assert await find(match={"missing": None}) is None
    await bus.publish(PublishRequest("listed", [1, 2], None, 60_000))
    assert await bus.find(EventQuery("listed", START, {"0": 1})) is None
    assert await bus.find(EventQuery("listed", START)) is not None
    assert await find(correlation_key="corr-2") == second.id
    assert await find(correlation_key="other") is None
    assert await find(since=START + timedelta(milliseconds=1)) == second.id
    found = await bus.find(EventQuery("paid", START, {"order": 2}))
    assert found is not None and found.payload == {"order": 2} and found.correlation_key == "corr-2"
    assert await bus.now() == tclock.now()

    tclock.advance(9_900)  # the first event expires
    assert await find() == second.id
    assert await bus.purge_expired() == 1
    assert await bus.purge_expired() == 0
    tclock.advance(60_000)
    assert await find() is None
    assert await bus.purge_expired() == 3  # "paid", "shipped" and "listed"


async def test_event_match_compares_json_values(mem: MemoryDriver) -> None:
    event = await mem.events.publish(
        PublishRequest("e", {"flag": 1, "ratio": 2, "tags": [True, "x"], "id": "a1"}, None, 1_000)
    )

    async def matches(match: dict[str, Any]) -> bool:
        found = await mem.events.find(EventQuery("e", START, match))
        return found is not None and found.id == event.id

    assert await matches({"ratio": 2.0, "tags": [True, "x"]})
    assert not await matches({"flag": True})
    assert not await matches({"tags": [1, "x"]})
    assert await matches({"id": "a1", "tags": (True, "x")})  # compared in JSON form


async def test_publish_wakes_a_suspended_waiting_run(mem: MemoryDriver, tclock: TickClock) -> None:
    waiting = await mem.enqueue(request("waiting"))
    other = await mem.enqueue(request("other"))
    for job in await claim(mem, limit=2):
        match = {"order": 7} if job.id == waiting.id else {"order": 8}
        await mem.steps.write(
            StepWrite(
                job.id,
                job.fence,
                job.run_id,
                StepRecord("wait", "waiting", started_at=START, event="paid", match=match),
            )
        )
        await mem.nack(job.id, NackOptions(job.fence, park=True, delay_ms=900_000))
    heard: list[str] = []
    unsubscribe = await mem.wake.subscribe(heard.append)
    tclock.advance(10)

    await mem.events.publish(PublishRequest("paid", {"order": 7, "extra": 1}, None, 60_000))
    await asyncio.sleep(0)
    assert heard == ["default"]
    assert (await info(mem, waiting.id)).run_at == START + timedelta(milliseconds=10)
    assert (await info(mem, other.id)).run_at == START + timedelta(milliseconds=900_000)
    [woken] = await claim(mem)
    assert (woken.id, woken.attempt, woken.claim) == (waiting.id, 1, 2)
    await unsubscribe()


# --- wake ------------------------------------------------------------------------------------


async def test_wake_hears_due_enqueues_nacks_and_resumes(mem: MemoryDriver) -> None:
    heard: list[str] = []
    unsubscribe = await mem.wake.subscribe(heard.append)
    await mem.enqueue(request("a"))
    await mem.enqueue(request("later", delay_ms=1_000))
    await mem.enqueue_many([request("b", queue="q2"), request("c", queue="q2")])
    await asyncio.sleep(0)
    assert heard == ["default", "q2"]
    [job] = await claim(mem, "q2", limit=1)
    await mem.nack(job.id, NackOptions(job.fence))
    await mem.introspect.pause_queue("q3")
    await mem.introspect.resume_queue("q3")
    await asyncio.sleep(0)
    assert heard == ["default", "q2", "q2", "q3"]
    await unsubscribe()
    await unsubscribe()
    await mem.enqueue(request("d"))
    await asyncio.sleep(0)
    assert heard == ["default", "q2", "q2", "q3"]


async def test_wake_is_delivered_on_the_subscribers_loop(mem: MemoryDriver) -> None:
    subscribed = threading.Event()
    heard: list[tuple[str, int]] = []
    done = threading.Event()

    def subscriber_thread() -> None:
        async def main() -> None:
            heard_here = asyncio.Event()

            def callback(queue: str) -> None:
                heard.append((queue, threading.get_ident()))
                heard_here.set()

            unsubscribe = await mem.wake.subscribe(callback)
            subscribed.set()
            await asyncio.wait_for(heard_here.wait(), 5)
            await unsubscribe()
            done.set()

        asyncio.run(main())

    thread = threading.Thread(target=subscriber_thread)
    thread.start()
    assert await asyncio.to_thread(subscribed.wait, 5)
    await mem.enqueue(request("a"))
    assert await asyncio.to_thread(done.wait, 5)
    thread.join(5)
    assert heard == [("default", thread.ident)]


async def test_a_subscriber_whose_loop_closed_is_dropped(mem: MemoryDriver) -> None:
    def subscribe_and_leave() -> None:
        async def main() -> None:
            await mem.wake.subscribe(lambda queue: None)

        asyncio.run(main())

    await asyncio.to_thread(subscribe_and_leave)
    assert len(mem._m.subscribers) == 1
    await mem.enqueue(request("a"))
    assert len(mem._m.subscribers) == 0
    await mem.enqueue(request("b"))


# --- close -----------------------------------------------------------------------------------


async def test_close_makes_every_call_unavailable(tclock: TickClock) -> None:
    driver = MemoryDriver(tclock)
    await driver.enqueue(request("k"))
    await driver.close()
    await driver.close()
    calls = [
        driver.enqueue(request("x")),
        driver.enqueue_many([request("y")]),
        claim(driver),
        driver.stats(),
        driver.demand(),
        driver.steps.load(new_id()),
        driver.introspect.list(JobFilter()),
        driver.leases.holders("k"),
        driver.events.find(EventQuery("e", START)),
        driver.wake.subscribe(print),
    ]
    for call in calls:
        with pytest.raises(DriverUnavailableError):
            await call
    assert driver.describe()["name"] == "memory"


# --- concurrency -----------------------------------------------------------------------------


async def test_concurrent_claimers_never_share_a_row(mem: MemoryDriver) -> None:
    total = 2_000
    for start in range(0, total, 500):
        await mem.enqueue_many([request(f"k{i}") for i in range(start, start + 500)])
    seen: list[UUID] = []
    seen_lock = threading.Lock()

    async def claimer(worker: str, rng: random.Random) -> None:
        while True:
            jobs = await claim(mem, limit=rng.randint(1, 7), worker=worker)
            if not jobs:
                return
            with seen_lock:
                seen.extend(j.id for j in jobs)
            for job in jobs:
                assert await mem.ack(job.id, Settle(job.fence))
            await asyncio.sleep(0)

    def thread_main(index: int) -> None:
        asyncio.run(claimer(f"thread-{index}", random.Random(index)))

    threads = [threading.Thread(target=thread_main, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    await asyncio.gather(*(claimer(f"task-{i}", random.Random(100 + i)) for i in range(20)))
    for thread in threads:
        await asyncio.to_thread(thread.join, 30)
    assert len(seen) == total
    assert len(set(seen)) == total
    stats = await mem.stats()
    assert [(s.queue, s.done, s.ready, s.running) for s in stats] == [("default", total, 0, 0)]


# --- a randomised check of claim against a brute-force model --------------------------------


@dataclass
class _Model:
    id: UUID
    queue: str
    seq: int
    run_at: datetime
    state: JobState = JobState.READY
    visible_at: datetime | None = None
    attempts: int = 0
    claim: int = 0
    fence: Fence | None = None


@pytest.mark.parametrize("seed", range(5))
async def test_claims_match_a_brute_force_model(seed: int) -> None:
    rng = random.Random(seed)
    clock = TickClock()
    driver = MemoryDriver(clock)
    model: dict[UUID, _Model] = {}
    queues = ["a", "b", "c"]
    max_attempts = 4

    def claimable(row: _Model, now: datetime, names: list[str]) -> bool:
        if row.queue not in names:
            return False
        if row.state in (JobState.READY, JobState.DELAYED, JobState.SUSPENDED):
            return row.run_at <= now
        return (
            row.state is JobState.RUNNING and row.visible_at is not None and row.visible_at <= now
        )

    for step in range(600):
        now = clock.now()
        op = rng.random()
        if op < 0.3:
            delay = rng.choice([0, 0, 50, 200])
            queue = rng.choice(queues)
            result = await driver.enqueue(
                request(f"k{step}", queue=queue, delay_ms=delay, max_attempts=max_attempts)
            )
            model[result.id] = _Model(
                result.id,
                queue,
                step,
                now + timedelta(milliseconds=delay),
                JobState.DELAYED if delay else JobState.READY,
            )
        elif op < 0.55:
            names = rng.sample(queues, rng.randint(1, 3))
            limit = rng.randint(1, 4)
            vt = rng.choice([100, 300])
            expected: list[UUID] = []
            buried: set[UUID] = set()
            for row in sorted(
                (r for r in model.values() if claimable(r, now, names)),
                key=lambda r: (r.run_at, r.seq),
            ):
                if len(expected) == limit:
                    break
                if row.state is JobState.RUNNING and row.attempts + 1 >= max_attempts:
                    buried.add(row.id)
                    continue
                expected.append(row.id)
            told: list[BuriedJob] = []
            claimed = await claim(
                driver, *names, limit=limit, vt=vt, worker=f"w{step}", on_exhausted=told.append
            )
            assert [j.id for j in claimed] == expected
            assert {b.id for b in told} == buried
            for bid in buried:
                model[bid].state = JobState.DEAD
                model[bid].attempts += 1
            for job in claimed:
                row = model[job.id]
                if row.state is JobState.RUNNING:
                    row.attempts += 1
                assert job.attempt == row.attempts + 1
                row.state = JobState.RUNNING
                row.claim += 1
                row.fence = job.fence
                row.visible_at = now + timedelta(milliseconds=vt)
        elif op < 0.85:
            running = [r for r in model.values() if r.state is JobState.RUNNING]
            if running:
                row = rng.choice(running)
                assert row.fence is not None
                kind = rng.random()
                if kind < 0.3:
                    assert await driver.ack(row.id, Settle(row.fence))
                    row.state = JobState.DONE
                elif kind < 0.6:
                    delay = rng.choice([0, 100])
                    park = rng.random() < 0.3
                    assert await driver.nack(
                        row.id, NackOptions(row.fence, delay_ms=delay, park=park)
                    )
                    row.state = (
                        JobState.SUSPENDED
                        if park
                        else JobState.DELAYED
                        if delay
                        else JobState.READY
                    )
                    row.attempts += 0 if park else 1
                    row.run_at = now + timedelta(milliseconds=delay)
                else:
                    assert await driver.heartbeat(row.id, row.fence, 300)
                    row.visible_at = now + timedelta(milliseconds=300)
        else:
            clock.advance(rng.choice([10, 60, 150, 400]))
        for job_id, row in model.items():
            if row.state in (JobState.DONE, JobState.DEAD):
                continue
            got = await info(driver, job_id)
            assert (got.state, got.attempt, got.claim) == (row.state, row.attempts, row.claim)
    await driver.close()


async def test_an_event_published_while_its_waiter_runs_makes_the_park_due_at_once() -> None:
    from jobs_core.driver import PublishRequest
    from jobs_core.ids import new_id
    from jobs_core.types import ClaimRequest, EnqueueRequest, NackOptions, StepRecord, StepWrite

    clock = TickClock()
    mem = MemoryDriver(clock=clock)
    req = EnqueueRequest(
        name="waiter",
        queue="q",
        input={},
        idempotency_key="k",
        tenant_id=None,
        max_attempts=3,
        id=new_id(),
        run_id=new_id(),
    )
    await mem.enqueue(req)
    [job] = await mem.claim(ClaimRequest(["q"], 1, 30_000, "w"))
    waiting = StepRecord("w", "waiting", started_at=clock.now(), event="ev", match={"id": 1})
    assert await mem.steps.write(StepWrite(job.id, job.fence, job.run_id, waiting))
    await mem.events.publish(PublishRequest("ev", {"id": 1}, None, 60_000))
    # The runner looked before the publish and parks for the long backstop after it.
    park = NackOptions(job.fence, delay_ms=15 * 60_000, park=True, count_attempt=False)
    assert await mem.nack(job.id, park)
    [again] = await mem.claim(ClaimRequest(["q"], 1, 30_000, "w"))
    assert again.id == job.id
