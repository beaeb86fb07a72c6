"""Introspection (where declared): paging and cursors, operator rules, bulk bounds, pauses."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core.driver import Introspector
from jobs_core.errors import (
    JobDuplicateError,
    JobNotCancellableError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobPageInvalidError,
)
from jobs_core.ids import new_id
from jobs_core.types import (
    BULK_LIMIT,
    MAX_JOB_PAGE,
    JobFilter,
    JobState,
    NackOptions,
    Settle,
    StepRecord,
    StepWrite,
)


def _ops(target: Target) -> Introspector:
    ops: Introspector = target.require("introspect")
    return ops


async def _enqueue_in_order(target: Target, count: int, **kw: Any) -> list[UUID]:
    ids = []
    for n in range(count):
        ids.append((await target.driver.enqueue(request(f"k{n}", **kw))).id)
        await target.advance(1)
    return ids


async def test_get_answers_the_row_and_its_steps(target: Target) -> None:
    """``get`` shows a row as stored, with its step trace; an unknown id is ``None``."""
    ops = _ops(target)
    driver = target.driver
    req = request("a", tenant="t9", max_attempts=4, payload={"x": [1, 2]})
    await driver.enqueue(req)
    [held] = await claim(driver)
    record = StepRecord("s1", "completed", output={"ok": True})
    assert await driver.steps.write(StepWrite(held.id, held.fence, held.run_id, record))
    info = await ops.get(req.id)
    assert info is not None
    assert (info.id, info.run_id, info.name, info.queue) == (
        req.id,
        req.run_id,
        "conformance.job",
        "default",
    )
    assert (info.state, info.max_attempts, info.claim, info.tenant_id) == (
        JobState.RUNNING,
        4,
        1,
        "t9",
    )
    assert (info.idempotency_key, info.input, info.claimed_by) == ("a", {"x": [1, 2]}, "w1")
    assert [(s.name, s.output) for s in info.steps] == [("s1", {"ok": True})]
    assert await ops.get(new_id()) is None


async def test_pages_run_newest_first_and_cursors_go_both_ways(target: Target) -> None:
    """Pages follow ``next`` to older rows and ``prev`` back to newer ones, with no gaps."""
    ops = _ops(target)
    ids = await _enqueue_in_order(target, 25)
    newest_first = ids[::-1]
    pages = []
    page = await ops.list(JobFilter(limit=10))
    assert page.prev is None
    while True:
        pages.append([row.id for row in page.rows])
        if page.next is None:
            break
        page = await ops.list(JobFilter(limit=10, after=page.next))
    assert pages == [newest_first[:10], newest_first[10:20], newest_first[20:]]
    assert page.prev is not None
    back = await ops.list(JobFilter(limit=10, before=page.prev))
    assert [row.id for row in back.rows] == newest_first[10:20]
    assert back.prev is not None and back.next is not None
    first = await ops.list(JobFilter(limit=10, before=back.prev))
    assert [row.id for row in first.rows] == newest_first[:10]
    assert first.prev is None


async def test_listing_filters_combine(target: Target) -> None:
    """Queue, name, state and tenant filters combine with AND."""
    ops = _ops(target)
    driver = target.driver
    await driver.enqueue(request("a", queue="q1", tenant="t1"))
    await driver.enqueue(request("b", queue="q1", tenant="t2"))
    await driver.enqueue(request("c", queue="q2", tenant="t1", name="conformance.other"))
    await claim(driver, "q2")

    async def keys(**kw: Any) -> list[str]:
        return sorted(row.idempotency_key for row in (await ops.list(JobFilter(**kw))).rows)

    assert await keys(queue="q1") == ["a", "b"]
    assert await keys(tenant_id="t1") == ["a", "c"]
    assert await keys(queue="q1", tenant_id="t1") == ["a"]
    assert await keys(state=JobState.RUNNING) == ["c"]
    assert await keys(name="conformance.other") == ["c"]
    assert await keys(name="conformance.other", state=JobState.READY) == []


async def test_bad_pages_are_refused(target: Target) -> None:
    """A limit outside 1..200, a foreign cursor, or both cursors is X_JOB_PAGE_INVALID."""
    ops = _ops(target)
    await _enqueue_in_order(target, 3)
    page = await ops.list(JobFilter(limit=1))
    assert page.next is not None
    bad = [
        JobFilter(limit=0),
        JobFilter(limit=MAX_JOB_PAGE + 1),
        JobFilter(after="not-a-cursor"),
        JobFilter(after=page.next, before=page.next),
    ]
    for flt in bad:
        with pytest.raises(JobPageInvalidError):
            await ops.list(flt)
    assert len((await ops.list(JobFilter(limit=MAX_JOB_PAGE))).rows) == 3


async def test_cancel_stops_live_rows_only(target: Target) -> None:
    """A queued or running row is cancelled (the running claim is fenced out); finished is not."""
    ops = _ops(target)
    driver = target.driver
    queued = await driver.enqueue(request("queued", queue="waiting"))
    await driver.enqueue(request("running"))
    [held] = await claim(driver)
    assert (await ops.cancel(queued.id, "not needed")).state == JobState.CANCELLED
    assert await claim(driver, "waiting") == []
    cancelled = await ops.cancel(held.id, "operator said so")
    assert cancelled.state == JobState.CANCELLED
    assert cancelled.last_error == "operator said so"
    assert not await driver.heartbeat(held.id, held.fence, 30_000)
    assert not await driver.ack(held.id, Settle(held.fence))
    with pytest.raises(JobNotCancellableError):
        await ops.cancel(held.id, "again")
    with pytest.raises(JobNotFoundError):
        await ops.cancel(new_id(), "nobody")
    again = await driver.enqueue(request("running"))
    assert not again.deduped, "a cancelled row frees its key"


async def test_requeue_rules(target: Target) -> None:
    """Only finished rows requeue; ``from_step`` drops that step and later ones; keys are kept."""
    ops = _ops(target)
    driver = target.driver
    done = await driver.enqueue(request("a"))
    [held] = await claim(driver)
    for name in ("one", "two", "three"):
        record = StepRecord(name, "completed", output=name)
        assert await driver.steps.write(StepWrite(held.id, held.fence, held.run_id, record))
    with pytest.raises(JobNotRequeueableError):
        await ops.requeue(done.id)
    assert await driver.nack(held.id, NackOptions(held.fence, dead_letter=True))
    requeued = await ops.requeue(done.id, from_step="two")
    assert (requeued.state, requeued.attempt, requeued.run_id) == (JobState.READY, 0, done.run_id)
    assert [r.name for r in await driver.steps.load(done.run_id)] == ["one"]
    [again] = await claim(driver)
    assert (again.id, again.attempt) == (done.id, 1)
    assert await driver.ack(again.id, Settle(again.fence))
    blocker = await driver.enqueue(request("a"))
    assert not blocker.deduped
    with pytest.raises(JobDuplicateError):
        await ops.requeue(done.id)
    with pytest.raises(JobNotFoundError):
        await ops.requeue(new_id())


async def test_remove_rules(target: Target) -> None:
    """Any row but a running one is removed with its steps."""
    ops = _ops(target)
    driver = target.driver
    queued = await driver.enqueue(request("queued"))
    running = await driver.enqueue(request("running", queue="busy"))
    [held] = await claim(driver, "busy")
    with pytest.raises(JobNotRemovableError):
        await ops.remove(running.id)
    await ops.remove(queued.id)
    assert await ops.get(queued.id) is None
    with pytest.raises(JobNotFoundError):
        await ops.remove(queued.id)
    assert await driver.ack(held.id, Settle(held.fence))
    await ops.remove(running.id)
    assert await ops.get(running.id) is None
    assert await driver.steps.load(running.run_id) == []


async def test_promote_rules(target: Target) -> None:
    """A delayed or suspended row becomes due now; any other is not promotable."""
    ops = _ops(target)
    driver = target.driver
    delayed = await driver.enqueue(request("delayed", delay_ms=3_600_000))
    parked = await driver.enqueue(request("parked"))
    [held] = await claim(driver)
    assert held.id == parked.id
    assert await driver.nack(held.id, NackOptions(held.fence, park=True, delay_ms=3_600_000))
    ready = await driver.enqueue(request("ready"))
    with pytest.raises(JobNotPromotableError):
        await ops.promote(ready.id)
    with pytest.raises(JobNotFoundError):
        await ops.promote(new_id())
    await ops.promote(delayed.id)
    await ops.promote(parked.id)
    claimed = {c.id for c in await claim(driver)}
    assert claimed == {delayed.id, parked.id, ready.id}


async def test_bulk_operations_are_bounded_and_report_what_remains(target: Target) -> None:
    """Bulk calls touch at most 1,000 rows and say how many still match, until zero."""
    ops = _ops(target)
    driver = target.driver
    total = BULK_LIMIT + 5
    await driver.enqueue_many(
        [request(f"k{n}", queue="bulk", delay_ms=3_600_000) for n in range(total)]
    )
    await driver.enqueue(request("other", queue="elsewhere", delay_ms=3_600_000))
    flt = JobFilter(queue="bulk")
    first = await ops.promote_many(flt)
    assert (first.affected, first.remaining) == (BULK_LIMIT, 5)
    second = await ops.promote_many(flt)
    assert (second.affected, second.remaining) == (5, 0)
    assert state_counts(await driver.stats(), "bulk") == {"ready": total}
    assert state_counts(await driver.stats(), "elsewhere") == {"delayed": 1}
    assert (await ops.requeue_many(flt)).affected == 0, "live rows are not requeueable"
    removed = await ops.remove_many(flt)
    assert (removed.affected, removed.remaining) == (BULK_LIMIT, 5)
    removed = await ops.remove_many(flt)
    assert (removed.affected, removed.remaining) == (5, 0)
    assert state_counts(await driver.stats(), "bulk") == {}


async def test_requeue_many_skips_rows_whose_key_is_live(target: Target) -> None:
    """Finished rows requeue in bulk, except one whose key a live row holds."""
    ops = _ops(target)
    driver = target.driver
    await driver.enqueue_many([request(k, queue="rq") for k in ("a", "b", "c")])
    for held in await claim(driver, "rq"):
        assert await driver.nack(held.id, NackOptions(held.fence, dead_letter=True))
    await driver.enqueue(request("b", queue="rq"))
    result = await ops.requeue_many(JobFilter(queue="rq", state=JobState.DEAD))
    assert result.affected == 2
    assert state_counts(await driver.stats(), "rq") == {"ready": 3, "dead": 1}


async def test_pauses_are_listed_and_survive_enqueues(target: Target) -> None:
    """Paused queues are listed sorted; pausing twice is harmless; resume lists them no more."""
    ops = _ops(target)
    for queue in ("zeta", "alpha", "alpha"):
        await ops.pause_queue(queue)
    assert await ops.paused_queues() == ["alpha", "zeta"]
    await target.driver.enqueue(request("a", queue="alpha"))
    assert await claim(target.driver, "alpha") == []
    await ops.resume_queue("alpha")
    await ops.resume_queue("never-paused")
    assert await ops.paused_queues() == ["zeta"]
    assert len(await claim(target.driver, "alpha")) == 1
