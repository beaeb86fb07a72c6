"""The Redis driver, member by member, against the real server (real time, short delays)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from jobs_core.driver import (
    CAPABILITIES,
    EventBus,
    EventQuery,
    Introspector,
    JobDriver,
    LeaseRequest,
    LeaseStore,
    PublishRequest,
    ResettableEventBus,
    RetentionStore,
    StepResolution,
    StepStore,
    WakeSource,
    open_driver,
)
from jobs_core.errors import (
    DriverRequestInvalidError,
    DriverUnavailableError,
    JobNotCancellableError,
    JobNotFoundError,
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
    JobInfo,
    JobState,
    NackOptions,
    Settle,
    StepRecord,
    StepWrite,
)
from jobs_redis import RedisDriver, _driver, open_redis_driver
from jobs_redis._scripts import Script
from redis_helpers import claim, request


async def info(driver: RedisDriver, job_id: Any) -> JobInfo:
    found = await driver.operator.get(job_id)
    assert found is not None
    return found


# --- shape -----------------------------------------------------------------------------------


async def test_protocols_capabilities_and_describe(driver: RedisDriver) -> None:
    assert isinstance(driver, JobDriver)
    assert isinstance(driver.steps, StepStore)
    assert isinstance(driver.leases, LeaseStore)
    assert isinstance(driver.events, EventBus)
    assert isinstance(driver.events, ResettableEventBus)
    assert isinstance(driver.wake, WakeSource)
    assert isinstance(driver.retention, RetentionStore)
    assert isinstance(driver.introspect, Introspector)
    assert driver.capabilities == {
        "introspect",
        "leases",
        "events",
        "wake",
        "retention",
        "scheduler_state",
        "leader",
        "workers",
        "priority",
        "debounce",
        "children",
        "rate",
        "counters",
    }
    described = driver.describe()
    assert described["capabilities"] == sorted(driver.capabilities)
    assert described["not_applicable"] == sorted(set(CAPABILITIES) - driver.capabilities)
    assert set(described["not_carried"]) == set(described["not_applicable"])
    assert driver.operator is driver.introspect


def test_open_driver_through_the_entry_points(redis_url: str) -> None:
    for scheme in ("redis", "rediss"):
        opened = open_driver(f"{scheme}://127.0.0.1:6379/0?prefix=p1&done_ttl=1d")
        assert isinstance(opened, RedisDriver)
        assert (opened.prefix, opened.done_ttl_ms) == ("p1", 86_400_000)
    assert open_redis_driver(redis_url, prefix="p2", done_ttl=0).done_ttl_ms == 0
    hidden = open_redis_driver("redis://:secret@127.0.0.1:6379/0").describe()["url"]
    assert "secret" not in hidden
    for bad in ("memory://", "postgresql://x/y"):
        with pytest.raises(DriverRequestInvalidError):
            open_redis_driver(bad)
    with pytest.raises(DriverRequestInvalidError):
        open_redis_driver(redis_url, pool_size=3)
    with pytest.raises(DriverRequestInvalidError):
        open_redis_driver(f"{redis_url}?prefix=a", prefix="b")
    with pytest.raises(DriverRequestInvalidError):
        open_redis_driver(redis_url, prefix="a{b}")
    with pytest.raises(DriverRequestInvalidError):
        open_redis_driver(redis_url, done_ttl="soon")


async def test_every_key_carries_the_prefix_hash_tag(
    driver: RedisDriver, redis_url: str, prefix: str
) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed")))
    await driver.events.publish(PublishRequest("e", {"a": 1}, "ck", 60_000))
    await driver.leases.acquire(LeaseRequest("job:x", 1, "h", 60_000))
    await driver.operator.pause_queue("default")
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    keys = [k async for k in client.scan_iter(match=f"*{prefix}*")]
    await client.aclose()
    assert keys and all(k.startswith("{" + prefix + "}:") for k in keys)
    assert f"{{{prefix}}}:j:{result.id}" in keys


# --- enqueue ---------------------------------------------------------------------------------


async def test_dedupe_per_name_tenant_and_key(driver: RedisDriver) -> None:
    first = await driver.enqueue(request("k"))
    again = await driver.enqueue(request("k"))
    assert not first.deduped
    assert again == EnqueueResult(first.id, first.run_id, deduped=True)
    other_tenant = await driver.enqueue(request("k", tenant="t2"))
    other_name = await driver.enqueue(request("k", name="other"))
    assert not other_tenant.deduped and not other_name.deduped
    assert len({first.id, other_tenant.id, other_name.id}) == 3
    no_tenant = await driver.enqueue(request("k", tenant=None))
    assert (await driver.enqueue(request("k", tenant=""))).id == no_tenant.id
    # Separators inside the parts cannot make two keys one.
    a = await driver.enqueue(request("2:bc", name="a", tenant="b"))
    b = await driver.enqueue(request("c", name="a", tenant="b2:b"))
    assert a.id != b.id and not b.deduped
    [stats] = await driver.stats()
    assert stats.ready == 6


async def test_running_and_retrying_rows_hold_their_key(driver: RedisDriver) -> None:
    first = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    assert (await driver.enqueue(request("k"))).id == first.id
    await driver.nack(job.id, NackOptions(job.fence, delay_ms=60_000))
    assert (await info(driver, first.id)).state is JobState.DELAYED
    assert (await driver.enqueue(request("k"))).id == first.id


async def test_finished_row_does_not_block_its_key(driver: RedisDriver) -> None:
    first = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    assert await driver.ack(job.id, Settle(job.fence))
    second = await driver.enqueue(request("k"))
    assert not second.deduped and second.id != first.id


async def test_explicit_id_meets_its_row_live_and_finished(driver: RedisDriver) -> None:
    job_id = new_id()
    first = await driver.enqueue(request("k", job_id=job_id))
    met = await driver.enqueue(request("other", job_id=job_id))
    assert met == EnqueueResult(job_id, first.run_id, deduped=True)
    [job] = await claim(driver)
    await driver.ack(job.id, Settle(job.fence))
    after = await driver.enqueue(request("k", job_id=job_id))
    assert after == EnqueueResult(job_id, first.run_id, deduped=True)
    [stats] = await driver.stats()
    assert (stats.ready, stats.done) == (0, 1)


async def test_enqueue_honours_ids_and_attribution(driver: RedisDriver) -> None:
    run_id = new_id()
    before = await driver.steps.now()
    result = await driver.enqueue(request("k", run_id=run_id, max_attempts=7))
    assert result.run_id == run_id
    [job] = await claim(driver)
    assert (job.run_id, job.max_attempts, job.attempt, job.claim) == (run_id, 7, 1, 1)
    assert (job.tenant_id, job.idempotency_key, job.input) == ("t1", "k", {"key": "k"})
    assert (job.traceparent, job.enqueued_by) == ("00-trace-span-01", "user-1")
    assert before <= job.created_at <= await driver.steps.now()
    none = await driver.enqueue(request("n", tenant=None))
    assert (await info(driver, none.id)).tenant_id is None


async def test_enqueue_many_keeps_order_and_dedupes_inside_the_batch(driver: RedisDriver) -> None:
    live = await driver.enqueue(request("held"))
    results = await driver.enqueue_many(
        [request("a"), request("b"), request("a"), request("held"), request("c")]
    )
    assert [r.deduped for r in results] == [False, False, True, True, False]
    assert results[2].id == results[0].id
    assert results[3].id == live.id
    claimed = await claim(driver, limit=10)
    assert [j.idempotency_key for j in claimed] == ["held", "a", "b", "c"]
    assert await driver.enqueue_many([]) == []


async def test_enqueue_many_across_chunks_is_one_transaction(driver: RedisDriver) -> None:
    reqs = [request(f"k{i}") for i in range(2_500)]
    reqs.append(request("k7"))  # a duplicate in the last chunk of a key from the first
    results = await driver.enqueue_many(reqs)
    assert [r.id for r in results[:-1]] == [r.id for r in reqs[:-1]]
    assert results[-1] == EnqueueResult(reqs[7].id, reqs[7].run_id, deduped=True)
    [stats] = await driver.stats()
    assert stats.ready == 2_500
    claimed = await claim(driver, limit=2_500)
    assert [j.idempotency_key for j in claimed] == [f"k{i}" for i in range(2_500)]


async def test_enqueue_many_refuses_the_whole_batch(driver: RedisDriver) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await driver.enqueue_many([request("a"), request("b", payload={"bad": {1, 2}})])
    assert await driver.stats() == []


@pytest.mark.parametrize(
    "bad",
    [{"set": {1}}, {"nan": float("nan")}, {"nul": "a\u0000b"}, {"a\u0000": 1}, object()],
)
async def test_input_that_no_driver_can_store_is_refused(driver: RedisDriver, bad: Any) -> None:
    with pytest.raises(DriverRequestInvalidError):
        await driver.enqueue(request("k", payload=bad))
    assert await driver.stats() == []


async def test_escaped_backslash_before_u0000_is_not_a_nul(driver: RedisDriver) -> None:
    text = "\\u0000 is how JSON spells NUL"
    await driver.enqueue(request("k", payload={"doc": text, "emoji": "\u00e9\U0001f600"}))
    [job] = await claim(driver)
    assert job.input == {"doc": text, "emoji": "\u00e9\U0001f600"}


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
async def test_malformed_enqueue_is_refused(driver: RedisDriver, change: dict[str, Any]) -> None:
    base = request("k")
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    with pytest.raises(DriverRequestInvalidError):
        await driver.enqueue(EnqueueRequest(**(fields | change)))


async def test_delayed_ready_and_past_run_at(driver: RedisDriver) -> None:
    now = await driver.steps.now()
    later = await driver.enqueue(request("later", delay_ms=400))
    at = await driver.enqueue(request("at", run_at=now + timedelta(milliseconds=800)))
    past = await driver.enqueue(request("past", run_at=datetime(1960, 1, 1, tzinfo=UTC)))
    negative = await driver.enqueue(request("neg", delay_ms=-(10**12)))
    far = await driver.enqueue(request("far", run_at=datetime(9999, 1, 1, tzinfo=UTC)))
    assert (await info(driver, later.id)).state is JobState.DELAYED
    assert (await info(driver, far.id)).state is JobState.DELAYED
    assert (await info(driver, at.id)).run_at == now + timedelta(milliseconds=800)
    past_info = await info(driver, past.id)
    # A past run_at (or a negative delay) is due now and stored as now.
    assert past_info.state is JobState.READY and past_info.run_at >= now
    assert [j.id for j in await claim(driver)] == [past.id, negative.id]
    await asyncio.sleep(0.45)
    assert [j.id for j in await claim(driver)] == [later.id]
    await asyncio.sleep(0.4)
    assert [j.id for j in await claim(driver)] == [at.id]
    assert await claim(driver) == []


# --- claim -----------------------------------------------------------------------------------


async def test_claim_order_limit_and_ordinal(driver: RedisDriver) -> None:
    c = await driver.enqueue(request("c", delay_ms=200))
    a = await driver.enqueue(request("a"))
    b = await driver.enqueue(request("b"))
    await asyncio.sleep(0.25)
    first = await claim(driver, limit=2)
    assert [j.id for j in first] == [a.id, b.id]
    assert [j.claim for j in first] == [1, 1]
    [rest] = await claim(driver, limit=2)
    assert rest.id == c.id
    assert await claim(driver) == []


async def test_claim_filters_and_merges_queues(driver: RedisDriver) -> None:
    x1 = await driver.enqueue(request("x1", queue="x"))
    y1 = await driver.enqueue(request("y1", queue="y"))
    x2 = await driver.enqueue(request("x2", queue="x"))
    await driver.enqueue(request("z1", queue="z"))
    assert await claim(driver, "nope") == []
    claimed = await claim(driver, "y", "x", "x", limit=10)
    assert [j.id for j in claimed] == [x1.id, y1.id, x2.id]
    assert {j.queue for j in await claim(driver, "z")} == {"z"}


async def test_paused_queue_yields_nothing_until_resumed(driver: RedisDriver) -> None:
    op = driver.operator
    await driver.enqueue(request("a"))
    await driver.enqueue(request("b", queue="other"))
    await op.pause_queue("default")
    await op.pause_queue("default")
    assert await op.paused_queues() == ["default"]
    assert [j.queue for j in await claim(driver, "default", "other")] == ["other"]
    assert await claim(driver) == []
    assert not (await driver.enqueue(request("c"))).deduped
    assert await driver.demand() == {"default": 0, "other": 1}
    await op.resume_queue("default")
    assert await op.paused_queues() == []
    assert len(await claim(driver)) == 2


@pytest.mark.parametrize(
    "req",
    [
        ClaimRequest(queues=[], limit=1, visibility_timeout_ms=1_000, worker_id="w"),
        ClaimRequest(queues=["default"], limit=0, visibility_timeout_ms=1_000, worker_id="w"),
        ClaimRequest(queues=["default"], limit=1, visibility_timeout_ms=10**18, worker_id="w"),
    ],
)
async def test_claim_refuses_empty_queues_limit_and_lease(
    driver: RedisDriver, req: ClaimRequest
) -> None:
    await driver.enqueue(request("k"))
    with pytest.raises(DriverRequestInvalidError):
        await driver.claim(req)
    [stats] = await driver.stats()
    assert (stats.ready, stats.running) == (1, 0)


async def test_lapsed_lease_is_reclaimed_with_the_attempt_counted(driver: RedisDriver) -> None:
    result = await driver.enqueue(request("k", max_attempts=3))
    [first] = await claim(driver, vt=300, worker="w1")
    assert first.attempt == 1
    assert await claim(driver, worker="w2") == []
    await asyncio.sleep(0.35)
    [second] = await claim(driver, vt=30_000, worker="w2")
    assert (second.id, second.attempt, second.claim, second.worker_id) == (result.id, 2, 2, "w2")
    assert not await driver.ack(first.id, Settle(first.fence))
    assert not await driver.nack(first.id, NackOptions(first.fence))
    assert not await driver.heartbeat(first.id, first.fence, 1_000)
    assert await driver.ack(second.id, Settle(second.fence, result={"ok": True}))
    done = await info(driver, result.id)
    assert (done.state, done.attempt, done.claim, done.result) == (
        JobState.DONE,
        2,
        2,
        {"ok": True},
    )


async def test_lapsed_running_row_keeps_its_run_at_place(driver: RedisDriver) -> None:
    old = await driver.enqueue(request("old"))
    [job] = await claim(driver, vt=300)
    newer = await driver.enqueue(request("newer"))
    await asyncio.sleep(0.35)
    assert [j.id for j in await claim(driver, limit=2, worker="w2")] == [old.id, newer.id]
    assert job.id == old.id


@pytest.mark.parametrize(("dropped", "state"), [(False, JobState.DEAD), (True, JobState.FAILED)])
async def test_final_attempt_lapse_is_buried(
    driver: RedisDriver, dropped: bool, state: JobState
) -> None:
    result = await driver.enqueue(request("k", name="crasher", max_attempts=2))
    other = await driver.enqueue(request("fine", name="fine", max_attempts=2))
    await claim(driver, vt=200, limit=1)
    await asyncio.sleep(0.25)
    [again] = await claim(driver, vt=200, limit=1)
    assert (again.id, again.attempt) == (result.id, 2)
    await asyncio.sleep(0.25)
    told: list[BuriedJob] = []
    handed = await claim(
        driver,
        vt=30_000,
        drop_exhausted=frozenset({"crasher"}) if dropped else frozenset(),
        on_exhausted=told.append,
    )
    assert [j.id for j in handed] == [other.id]
    assert told == [BuriedJob(result.id, "crasher", "default", state)]
    buried = await info(driver, result.id)
    assert (buried.state, buried.attempt, buried.last_error, buried.last_error_code) == (
        state,
        2,
        LEASE_LAPSED_FINAL_ATTEMPT,
        "X_JOB_MAX_ATTEMPTS",
    )
    assert not (await driver.enqueue(request("k", name="crasher"))).deduped
    [stats] = await driver.stats()
    assert (stats.dead, stats.failed) == ((0, 1) if dropped else (1, 0))


async def test_heartbeat_extends_the_lease(driver: RedisDriver) -> None:
    await driver.enqueue(request("k"))
    [job] = await claim(driver, vt=400)
    await asyncio.sleep(0.25)
    assert await driver.heartbeat(job.id, job.fence, 400)
    await asyncio.sleep(0.25)
    assert await claim(driver, worker="w2") == []
    await asyncio.sleep(0.2)
    [again] = await claim(driver, worker="w2")
    assert again.id == job.id and again.attempt == 2


async def test_heartbeat_after_lapse_before_reclaim_keeps_the_row(driver: RedisDriver) -> None:
    await driver.enqueue(request("k"))
    [job] = await claim(driver, vt=200)
    await asyncio.sleep(0.25)
    assert await claim(driver, "other") == []
    assert await driver.heartbeat(job.id, job.fence, 30_000)
    assert await claim(driver, worker="w2") == []
    assert await driver.ack(job.id, Settle(job.fence))


async def test_settles_are_fenced_on_worker_and_claim(driver: RedisDriver) -> None:
    await driver.enqueue(request("k"))
    [job] = await claim(driver)
    for fence in (Fence("intruder", job.claim), Fence(job.worker_id, job.claim + 1)):
        assert not await driver.ack(job.id, Settle(fence))
        assert not await driver.nack(job.id, NackOptions(fence, dead_letter=True))
        assert not await driver.heartbeat(job.id, fence, 1_000)
    assert not await driver.ack(new_id(), Settle(job.fence))
    assert (await info(driver, job.id)).state is JobState.RUNNING
    assert await driver.ack(job.id, Settle(job.fence))
    assert not await driver.ack(job.id, Settle(job.fence))


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
    driver: RedisDriver, flags: dict[str, Any], state: JobState, counted: int
) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    assert await driver.nack(job.id, NackOptions(job.fence, **flags))
    row = await info(driver, result.id)
    assert (row.state, row.attempt) == (state, counted)
    if state in (JobState.DEAD, JobState.FAILED):
        assert not (await driver.enqueue(request("k"))).deduped
    else:
        assert (await driver.enqueue(request("k"))).id == result.id


async def test_nack_delay_and_error_are_stored(driver: RedisDriver) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    error = ErrorInfo("boom", code="X_APP", stack="Traceback ...")
    before = await driver.steps.now()
    await driver.nack(job.id, NackOptions(job.fence, error=error, delay_ms=300))
    row = await info(driver, result.id)
    assert (row.last_error, row.last_error_code, row.last_error_stack) == (
        "boom",
        "X_APP",
        "Traceback ...",
    )
    assert before + timedelta(milliseconds=300) <= row.run_at
    assert await claim(driver) == []
    await asyncio.sleep(0.35)
    [again] = await claim(driver)
    assert again.attempt == 2


async def test_suspended_row_is_claimed_when_due(driver: RedisDriver) -> None:
    await driver.enqueue(request("k"))
    [job] = await claim(driver)
    await driver.nack(job.id, NackOptions(job.fence, park=True, delay_ms=300))
    assert await claim(driver) == []
    await asyncio.sleep(0.35)
    [again] = await claim(driver)
    assert (again.attempt, again.claim) == (1, 2)


# --- stats and demand ------------------------------------------------------------------------


async def test_stats_and_demand_after_a_scripted_sequence(driver: RedisDriver) -> None:
    await driver.enqueue_many([request(f"r{i}") for i in range(3)])
    await driver.enqueue(request("later", delay_ms=60_000))
    await driver.enqueue(request("b1", queue="b"))
    running = await claim(driver, limit=2, vt=400)
    [b1] = await claim(driver, "b")
    await driver.ack(b1.id, Settle(b1.fence))
    await driver.enqueue(request("b2", queue="b"))
    [b2] = await claim(driver, "b")
    await driver.nack(b2.id, NackOptions(b2.fence, park=True, delay_ms=400))
    await driver.enqueue(request("b3", queue="b"))
    [b3] = await claim(driver, "b")
    await driver.nack(b3.id, NackOptions(b3.fence, dead_letter=True))
    cancelled = await driver.enqueue(request("b4", queue="b"))
    await driver.operator.cancel(cancelled.id, "not needed")
    await driver.enqueue(request("c1", queue="c"))
    await driver.operator.pause_queue("c")
    await asyncio.sleep(0.1)

    stats = {s.queue: s for s in await driver.stats()}
    assert list(stats) == ["b", "c", "default"]
    a = stats["default"]
    assert (a.ready, a.delayed, a.running, a.suspended, a.done) == (1, 1, 2, 0, 0)
    assert 100 <= a.oldest_ready_ms < 5_000
    b = stats["b"]
    assert (b.ready, b.running, b.suspended, b.done, b.dead, b.cancelled) == (0, 0, 1, 1, 1, 1)
    assert b.oldest_ready_ms == 0
    assert (stats["c"].ready, stats["c"].oldest_ready_ms >= 100) == (1, True)
    assert await driver.demand() == {"b": 0, "c": 0, "default": 3}

    await asyncio.sleep(0.45)  # the leases lapse and the suspended row is due
    stats = {s.queue: s for s in await driver.stats()}
    assert (stats["default"].ready, stats["default"].delayed, stats["default"].running) == (1, 1, 2)
    assert await driver.demand() == {"b": 1, "c": 0, "default": 3}
    await driver.operator.resume_queue("c")
    assert (await driver.demand())["c"] == 1
    assert len(running) == 2


# --- steps -----------------------------------------------------------------------------------


async def test_step_writes_are_fenced_and_numbered(driver: RedisDriver) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver, vt=300)

    def write(record: StepRecord, fence: Fence | None = job.fence) -> StepWrite:
        return StepWrite(job.id if fence else None, fence, job.run_id, record)

    at = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert await driver.steps.write(
        write(StepRecord("a", "completed", output={"n": 1}, started_at=at, completed_at=at))
    )
    assert await driver.steps.write(write(StepRecord("b", "failed", attempts=1, error="x")))
    assert await driver.steps.write(write(StepRecord("b", "completed", output=[2], seq=99)))
    assert await driver.steps.write(write(StepRecord("c", "completed", output="three", once=True)))
    steps = await driver.steps.load(job.run_id)
    assert [(s.name, s.seq, s.status, s.output) for s in steps] == [
        ("a", 0, "completed", {"n": 1}),
        ("b", 1, "completed", [2]),
        ("c", 2, "completed", "three"),
    ]
    assert (steps[0].started_at, steps[0].completed_at, steps[2].once) == (at, at, True)
    await asyncio.sleep(0.35)
    [again] = await claim(driver, worker="w2")
    assert not await driver.steps.write(write(StepRecord("d", "completed")))
    assert await driver.steps.write(write(StepRecord("d", "completed"), again.fence))
    assert not await driver.steps.write(
        StepWrite(job.id, again.fence, new_id(), StepRecord("e", "completed"))
    )
    assert [s.name for s in (await info(driver, result.id)).steps] == ["a", "b", "c", "d"]
    assert await driver.steps.load(new_id()) == []


async def test_unfenced_and_half_fenced_step_writes(driver: RedisDriver) -> None:
    run_id = new_id()
    assert await driver.steps.write(
        StepWrite(None, None, run_id, StepRecord("inline", "completed"))
    )
    assert [s.name for s in await driver.steps.load(run_id)] == ["inline"]
    with pytest.raises(DriverRequestInvalidError):
        await driver.steps.write(StepWrite(new_id(), None, run_id, StepRecord("x", "completed")))
    with pytest.raises(DriverRequestInvalidError):
        await driver.steps.write(
            StepWrite(None, Fence("w", 1), run_id, StepRecord("x", "completed"))
        )
    for bad in ({1, 2}, "nul\u0000"):
        with pytest.raises(DriverRequestInvalidError):
            await driver.steps.write(
                StepWrite(None, None, run_id, StepRecord("x", "completed", output=bad))
            )


async def test_step_error_text_may_hold_anything(driver: RedisDriver) -> None:
    run_id = new_id()
    odd = 'quote " backslash \\ nul \u0000 done'
    record = StepRecord("s", "failed", attempts=2, error=odd)
    assert await driver.steps.write(StepWrite(None, None, run_id, record))
    [loaded] = await driver.steps.load(run_id)
    assert (loaded.error, loaded.attempts) == (odd, 2)


def count_scripts(driver: RedisDriver, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the driver's script calls (round trips) by script name from now on."""
    calls: Counter[str] = Counter()
    run = driver._conn.run

    async def counted(script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        calls[script.name] += 1
        return await run(script, keys, args)

    monkeypatch.setattr(driver._conn, "run", counted)
    return calls


async def test_a_claim_carries_its_runs_steps_to_the_first_load(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    await driver.enqueue(request("stepped"))
    await driver.enqueue(request("fresh"))
    [job] = await claim(driver, limit=1)
    record = StepRecord("a", "completed", output={"n": 1})
    assert await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    assert await driver.nack(job.id, NackOptions(job.fence, count_attempt=False))
    calls = count_scripts(driver, monkeypatch)
    fresh, again = await claim(driver)
    assert again.id == job.id
    assert [(s.name, s.seq, s.output) for s in await driver.steps.load(again.run_id)] == [
        ("a", 0, {"n": 1})
    ]
    assert await driver.steps.load(fresh.run_id) == []
    assert calls == Counter({"claim": 1})
    # Only the first load is answered from the claim; a write goes to the server and so does
    # every later load.
    assert [s.name for s in await driver.steps.load(again.run_id)] == ["a"]
    assert calls["step_load"] == 1
    await driver.enqueue(request("third"))
    [third] = await claim(driver)
    record = StepRecord("b", "completed")
    assert await driver.steps.write(StepWrite(third.id, third.fence, third.run_id, record))
    assert [s.name for s in await driver.steps.load(third.run_id)] == ["b"]
    assert calls["step_load"] == 2


async def test_preloaded_steps_are_capped(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_driver, "PRELOADED_KEPT", 2)
    for key in ("a", "b", "c"):
        await driver.enqueue(request(key))
    first, second, third = await claim(driver)
    assert list(driver._s.preloaded) == [second.run_id, third.run_id]
    calls = count_scripts(driver, monkeypatch)
    assert await driver.steps.load(first.run_id) == []
    assert calls == Counter({"step_load": 1})


async def test_acks_made_together_share_one_call_and_keep_their_order(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(40):
        await driver.enqueue(request(f"k{i}"))
    jobs = await claim(driver, limit=40)
    calls = count_scripts(driver, monkeypatch)
    first = jobs[0]
    intruder = Settle(Fence("intruder", first.claim))
    answers = await asyncio.gather(
        driver.ack(first.id, intruder),
        driver.ack(first.id, Settle(first.fence, result={"r": 1})),
        driver.ack(first.id, Settle(first.fence)),
        *(driver.ack(job.id, Settle(job.fence)) for job in jobs[1:]),
    )
    assert answers == [False, True, False] + [True] * 39
    assert calls == Counter({"ack": 1})
    assert (await info(driver, first.id)).result == {"r": 1}
    [stats] = await driver.stats()
    assert (stats.done, stats.running) == (40, 0)


async def test_acks_past_the_batch_cap_take_more_calls(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_driver, "ACK_BATCH", 16)
    for i in range(40):
        await driver.enqueue(request(f"k{i}"))
    jobs = await claim(driver, limit=40)
    calls = count_scripts(driver, monkeypatch)
    answers = await asyncio.gather(*(driver.ack(job.id, Settle(job.fence)) for job in jobs))
    assert answers == [True] * 40
    assert calls == Counter({"ack": 3})


async def test_acks_from_several_event_loops(driver: RedisDriver) -> None:
    for key in ("a", "b", "c"):
        await driver.enqueue(request(key))
    a, b, c = await claim(driver)

    def on_a_fresh_loop(job_id: Any, fence: Fence) -> bool:
        return asyncio.run(driver.ack(job_id, Settle(fence)))

    assert await asyncio.to_thread(on_a_fresh_loop, a.id, a.fence)
    assert await driver.ack(b.id, Settle(b.fence))
    assert await asyncio.to_thread(on_a_fresh_loop, c.id, c.fence)
    assert not await asyncio.to_thread(on_a_fresh_loop, c.id, c.fence)
    # A finished loop's queue is dropped once another loop acks.
    assert len(driver._acks._pending) <= 2


# --- done_ttl --------------------------------------------------------------------------------


async def test_done_rows_and_their_steps_expire_after_done_ttl(redis_url: str, prefix: str) -> None:
    driver = await RedisDriver.connect(redis_url, prefix=prefix, done_ttl="300ms")
    done = await driver.enqueue(request("done"))
    dead = await driver.enqueue(request("dead"))
    jobs = {j.id: j for j in await claim(driver)}
    for job in jobs.values():
        await driver.steps.write(
            StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed"))
        )
    await driver.ack(done.id, Settle(jobs[done.id].fence))
    await driver.nack(dead.id, NackOptions(jobs[dead.id].fence, dead_letter=True))
    assert (await info(driver, done.id)).state is JobState.DONE
    await asyncio.sleep(0.4)
    assert await driver.operator.get(done.id) is None
    assert await driver.steps.load(done.run_id) == []
    kept = await info(driver, dead.id)
    assert kept.state is JobState.DEAD and [s.name for s in kept.steps] == ["s"]
    [stats] = await driver.stats()
    assert (stats.done, stats.dead) == (1, 1)
    await driver.close()


async def test_done_ttl_zero_keeps_done_rows(redis_url: str, prefix: str) -> None:
    driver = await RedisDriver.connect(redis_url, prefix=prefix, done_ttl=0)
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    await driver.ack(job.id, Settle(job.fence))
    client = aioredis.Redis.from_url(redis_url)
    assert await client.pttl(f"{{{prefix}}}:j:{result.id}") == -1
    await client.aclose()
    await driver.close()


# --- operator --------------------------------------------------------------------------------


async def test_get_shows_the_whole_row(driver: RedisDriver) -> None:
    assert await driver.operator.get(new_id()) is None
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed")))
    row = await info(driver, result.id)
    assert (row.state, row.claimed_by, row.claim, row.attempt) == (JobState.RUNNING, "w1", 1, 0)
    assert [s.name for s in row.steps] == ["s"]
    assert row.created_at == row.run_at <= row.updated_at
    assert (row.traceparent, row.enqueued_by, row.input) == (
        "00-trace-span-01",
        "user-1",
        {"key": "k"},
    )


async def test_cancel_rules(driver: RedisDriver) -> None:
    with pytest.raises(JobNotFoundError):
        await driver.operator.cancel(new_id(), "why")
    queued = await driver.enqueue(request("queued"))
    running = await driver.enqueue(request("running", queue="q2"))
    [job] = await claim(driver, "q2")
    cancelled = await driver.operator.cancel(queued.id, "operator said so")
    assert (cancelled.state, cancelled.last_error, cancelled.last_error_code) == (
        JobState.CANCELLED,
        "operator said so",
        "X_JOB_CANCELLED",
    )
    assert await claim(driver) == []
    assert not (await driver.enqueue(request("queued"))).deduped
    assert cancelled.attempt == 0
    # The running attempt the cancel stopped is counted (it ran): `jobsctl ls` reads 1/3.
    assert (await driver.operator.cancel(running.id, "stop")).attempt == 1
    assert not await driver.heartbeat(job.id, job.fence, 1_000)
    assert not await driver.ack(job.id, Settle(job.fence))
    assert not await driver.steps.write(
        StepWrite(job.id, job.fence, job.run_id, StepRecord("s", "completed"))
    )
    with pytest.raises(JobNotCancellableError):
        await driver.operator.cancel(running.id, "again")


async def test_resolve_step_rules(driver: RedisDriver) -> None:
    with pytest.raises(JobNotFoundError):
        await driver.operator.resolve_step(new_id(), "s", StepResolution(ran=True))
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)

    async def put(record: StepRecord) -> None:
        assert await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))

    await put(StepRecord("first", "completed", output=1))
    await put(StepRecord("charge", "started", once=True))
    await put(StepRecord("plain", "started"))
    await put(StepRecord("refund", "started", once=True))
    await put(StepRecord("later", "completed", output=2))
    for step in ("missing", "first", "plain"):
        with pytest.raises(StepNotResolvableError):
            await driver.operator.resolve_step(result.id, step, StepResolution(ran=True))
    before = await driver.steps.now()
    await driver.operator.resolve_step(
        result.id, "charge", StepResolution(ran=True, output={"id": 9})
    )
    await driver.operator.resolve_step(result.id, "refund", StepResolution(ran=False))
    steps = {s.name: s for s in await driver.steps.load(job.run_id)}
    assert (steps["charge"].status, steps["charge"].output) == ("completed", {"id": 9})
    assert steps["charge"].completed_at is not None and steps["charge"].completed_at >= before
    assert "refund" not in steps
    assert [(s.name, s.seq) for s in await driver.steps.load(job.run_id)] == [
        ("first", 0),
        ("charge", 1),
        ("plain", 2),
        ("later", 4),
    ]
    with pytest.raises(StepNotResolvableError):
        await driver.operator.resolve_step(result.id, "charge", StepResolution(ran=True))
    await put(StepRecord("refund", "completed"))
    assert [(s.name, s.seq) for s in await driver.steps.load(job.run_id)][-1] == ("refund", 5)


async def test_deleting_the_highest_step_reuses_its_seq(driver: RedisDriver) -> None:
    result = await driver.enqueue(request("k"))
    [job] = await claim(driver)
    for record in (StepRecord("a", "completed"), StepRecord("b", "started", once=True)):
        await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
    await driver.operator.resolve_step(result.id, "b", StepResolution(ran=False))
    await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, StepRecord("c", "completed")))
    assert [(s.name, s.seq) for s in await driver.steps.load(job.run_id)] == [("a", 0), ("c", 1)]


# --- leases ----------------------------------------------------------------------------------


async def test_lease_slots_holders_and_expiry(driver: RedisDriver) -> None:
    leases = driver.leases

    def req(holder: str, ttl_ms: int = 400) -> LeaseRequest:
        return LeaseRequest("job:send", limit=2, holder=holder, ttl_ms=ttl_ms)

    assert await leases.acquire(req("r1"))
    assert await leases.acquire(req("r2", ttl_ms=200))
    assert not await leases.acquire(req("r3"))
    assert await leases.holders("job:send") == ["r1", "r2"]
    assert await leases.acquire(req("r1", ttl_ms=5_000))  # renewed, keeping its place
    assert await leases.holders("job:send") == ["r1", "r2"]
    await asyncio.sleep(0.25)  # r2 expired
    assert await leases.holders("job:send") == ["r1"]
    assert not await leases.renew(req("r2"))
    assert await leases.acquire(req("r3", ttl_ms=300))
    assert await leases.holders("job:send") == ["r1", "r3"]
    assert await leases.renew(req("r3", ttl_ms=5_000))
    await leases.release("job:send", "r1")
    await leases.release("job:send", "nobody")
    assert await leases.holders("job:send") == ["r3"]
    assert await leases.holders("job:unknown") == []
    for bad in (LeaseRequest("k", 0, "h", 1_000), LeaseRequest("k", 1, "h", 0)):
        with pytest.raises(DriverRequestInvalidError):
            await leases.acquire(bad)


async def test_lease_keys_expire_with_their_last_slot(
    driver: RedisDriver, redis_url: str, prefix: str
) -> None:
    assert await driver.leases.acquire(LeaseRequest("job:gone", 1, "h", 200))
    client = aioredis.Redis.from_url(redis_url)
    assert 0 < await client.pttl(f"{{{prefix}}}:ls:job:gone") <= 200
    await asyncio.sleep(0.3)
    assert await client.exists(f"{{{prefix}}}:ls:job:gone", f"{{{prefix}}}:lx:job:gone") == 0
    await client.aclose()


# --- events ----------------------------------------------------------------------------------


async def test_events_publish_find_match_and_expiry(driver: RedisDriver) -> None:
    bus = driver.events
    start = await bus.now()
    first = await bus.publish(PublishRequest("paid", {"order": 1, "ok": True}, None, 400))
    assert first.expires_at - first.published_at == timedelta(milliseconds=400)
    assert start <= first.published_at <= await bus.now()
    second = await bus.publish(PublishRequest("paid", {"order": 2}, "corr-2", 60_000))
    await bus.publish(PublishRequest("shipped", {"order": 1}, None, 60_000))

    async def find(**kw: Any) -> Any:
        found = await bus.find(EventQuery("paid", **({"since": start} | kw)))
        return None if found is None else found.id

    assert await find() == first.id
    assert await find(match={"order": 2}) == second.id
    assert await find(match={"order": 1, "ok": True}) == first.id
    assert await find(match={"order": 3}) is None
    assert await find(match={"missing": None}) is None
    await bus.publish(PublishRequest("listed", [1, 2], None, 60_000))
    assert await bus.find(EventQuery("listed", start, {"0": 1})) is None
    assert await bus.find(EventQuery("listed", start)) is not None
    assert await find(correlation_key="corr-2") == second.id
    assert await find(correlation_key="other") is None
    assert await find(since=first.published_at + timedelta(microseconds=1)) == second.id
    found = await bus.find(EventQuery("paid", start, {"order": 2}))
    assert found is not None and found.payload == {"order": 2} and found.correlation_key == "corr-2"

    await asyncio.sleep(0.45)  # the first event expires
    assert await find() == second.id
    assert await bus.purge_expired() == 1
    assert await bus.purge_expired() == 0
    assert await bus.reset() == 3
    assert await find() is None


async def test_event_match_compares_json_values(driver: RedisDriver) -> None:
    start = await driver.events.now()
    payload = {"flag": 1, "ratio": 2, "tags": [True, "x"], "id": "a1", "obj": {}, "n": 2**53 + 1}
    event = await driver.events.publish(PublishRequest("e", payload, None, 60_000))

    async def matches(match: dict[str, Any]) -> bool:
        found = await driver.events.find(EventQuery("e", start, match))
        return found is not None and found.id == event.id

    assert await matches({"ratio": 2.0, "tags": [True, "x"]})
    assert await matches({"id": "a1", "tags": (True, "x")})
    assert await matches({"obj": {}, "n": 2**53 + 1})
    assert await matches({})
    assert not await matches({"flag": True})
    assert not await matches({"tags": [1, "x"]})
    assert not await matches({"obj": []})
    assert not await matches({"n": 2**53})


async def test_publish_wakes_a_suspended_waiting_run(driver: RedisDriver) -> None:
    waiting = await driver.enqueue(request("waiting"))
    other = await driver.enqueue(request("other"))
    start = await driver.events.now()
    for job in await claim(driver, limit=2):
        match = {"order": 7} if job.id == waiting.id else {"order": 8}
        await driver.steps.write(
            StepWrite(
                job.id,
                job.fence,
                job.run_id,
                StepRecord("wait", "waiting", started_at=start, event="paid", match=match),
            )
        )
        await driver.nack(job.id, NackOptions(job.fence, park=True, delay_ms=900_000))
    heard: list[str] = []
    unsubscribe = await driver.wake.subscribe(heard.append)
    await asyncio.sleep(0.2)  # the subscription is listening
    event = await driver.events.publish(
        PublishRequest("paid", {"order": 7.0, "extra": 1}, None, 60_000)
    )
    for _ in range(100):
        if heard:
            break
        await asyncio.sleep(0.01)
    assert heard == ["default"]
    assert (await info(driver, waiting.id)).run_at == event.published_at
    assert (await info(driver, other.id)).run_at > event.published_at + timedelta(minutes=10)
    [woken] = await claim(driver)
    assert (woken.id, woken.attempt, woken.claim) == (waiting.id, 1, 2)
    # Once the step completes its index entry is gone: a later publish wakes nothing.
    await driver.steps.write(
        StepWrite(woken.id, woken.fence, woken.run_id, StepRecord("wait", "completed"))
    )
    await driver.nack(woken.id, NackOptions(woken.fence, park=True, delay_ms=900_000))
    await driver.events.publish(PublishRequest("paid", {"order": 7}, None, 60_000))
    assert await claim(driver) == []
    await unsubscribe()
    await unsubscribe()


# --- wake ------------------------------------------------------------------------------------


async def test_wake_hears_due_enqueues_nacks_and_resumes(driver: RedisDriver) -> None:
    heard: list[str] = []
    unsubscribe = await driver.wake.subscribe(heard.append)
    await asyncio.sleep(0.2)
    await driver.enqueue(request("a"))
    await driver.enqueue(request("later", delay_ms=60_000))  # the first row for later wakes
    await driver.enqueue(request("later still", delay_ms=90_000))  # not first: no wake
    await driver.enqueue_many([request("b", queue="q2"), request("c", queue="q2")])
    await driver.enqueue(request("a"))  # deduped: nothing new is due
    await asyncio.sleep(0.1)
    assert heard == ["default", "default", "q2"]
    [job] = await claim(driver, "q2", limit=1)
    await driver.nack(job.id, NackOptions(job.fence))
    await driver.operator.pause_queue("q3")
    await driver.operator.resume_queue("q3")
    await driver.operator.resume_queue("q3")  # not paused any more: no wake
    await asyncio.sleep(0.1)
    assert heard == ["default", "default", "q2", "q2", "q3"]
    assert driver.wake.healthy
    await unsubscribe()
    await driver.enqueue(request("d"))
    await asyncio.sleep(0.1)
    assert heard == ["default", "default", "q2", "q2", "q3"]


async def test_concurrent_enqueuers_of_one_key_make_one_live_row(
    redis_url: str, prefix: str
) -> None:
    """FIELD-FAILURES C27: 20 enqueuers of one key at once, each on its own connection."""
    drivers = [RedisDriver(redis_url, prefix=prefix) for _ in range(20)]
    results = await asyncio.gather(*(d.enqueue(request("K")) for d in drivers))
    assert len({r.id for r in results}) == 1
    assert sum(not r.deduped for r in results) == 1
    [job] = await claim(drivers[0])
    # Running, the key is still held; finished, it is free again.
    assert (await drivers[1].enqueue(request("K"))).id == job.id
    assert await drivers[0].nack(job.id, NackOptions(job.fence, delay_ms=60_000))
    assert (await drivers[2].enqueue(request("K"))).id == job.id
    for d in drivers:
        await d.close()


async def test_one_driver_serves_several_event_loops(driver: RedisDriver) -> None:
    """A sync caller's enqueue runs on a fresh loop each time (asyncio.run), in any thread."""

    def on_a_fresh_loop(key: str) -> EnqueueResult:
        return asyncio.run(driver.enqueue(request(key)))

    first = await asyncio.to_thread(on_a_fresh_loop, "a")
    second = await asyncio.to_thread(on_a_fresh_loop, "b")
    here = await driver.enqueue(request("c"))
    assert not any(r.deduped for r in (first, second, here))
    assert [j.id for j in await claim(driver)] == [first.id, second.id, here.id]
    # The finished loops' clients are dropped once another loop's client is built.
    await asyncio.to_thread(on_a_fresh_loop, "d")
    assert len(driver._conn._clients) <= 2


# --- close -----------------------------------------------------------------------------------


async def test_close_makes_every_call_unavailable(redis_url: str, prefix: str) -> None:
    driver = await RedisDriver.connect(redis_url, prefix=prefix)
    await driver.enqueue(request("k"))
    await driver.close()
    await driver.close()
    calls = [
        driver.enqueue(request("x")),
        claim(driver),
        driver.stats(),
        driver.demand(),
        driver.steps.load(new_id()),
        driver.leases.holders("k"),
        driver.events.find(EventQuery("e", datetime.now(UTC))),
        driver.operator.paused_queues(),
        driver.wake.subscribe(print),
    ]
    for call in calls:
        with pytest.raises(DriverUnavailableError):
            await call
    assert driver.describe()["name"] == "redis"


async def test_a_server_error_reply_passes_through_unmapped(driver: RedisDriver) -> None:
    # Another client's value of the wrong type under one of our keys: the server answers
    # WRONGTYPE, which is not an outage and must not be reported as one.
    client = driver._conn.client()
    await client.set(f"{{{driver.prefix}}}:live", "not a hash")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await driver.enqueue(request("k"))
