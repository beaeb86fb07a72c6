"""Child jobs (where ``children`` is declared): the parent link, invoke, gather, failure, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from jobs_conformance.target import Target, claim, eventually, outcome, request, running_worker
from jobs_core import JobRegistry, Retry, classify, job, use_driver
from jobs_core import introspect as ops
from jobs_core.children import CHILD_SETTLED, child_ids
from jobs_core.driver import ChildJobs, capability
from jobs_core.types import BuriedJob, NackOptions, StepRecord, StepWrite
from jobs_core.worker import Worker

BROKE = "X_CONFORMANCE_CHILD_BROKE"
"""The terminal code a failing child raises."""

classify({BROKE: "terminal"})


class Broke(Exception):
    """A child's terminal failure."""

    code = BROKE


class Num(BaseModel):
    """A child's input: the number it answers (doubled), or fails on."""

    tag: str
    n: int
    fail: bool = False
    hold: bool = False


class Fan(BaseModel):
    """A parent's input."""

    tag: str
    count: int = 5
    fail_at: int | None = None
    fail_fast: bool = False
    hold: bool = False


def _store(target: Target) -> ChildJobs:
    target.require("events")
    store: ChildJobs = target.require("children")
    return store


def _code(target: Target) -> str | None:
    """The parent's expected last error code: the child's (read only with ``introspect``)."""
    return BROKE if capability(target.driver, "introspect") is not None else None


def _jobs(registry: JobRegistry, released: asyncio.Event, seen: list[tuple[str, int]]) -> Any:
    @job(
        input=Num,
        idempotency_key=lambda i: f"{i.tag}:{i.n}",
        tenant="none",
        name="conformance.child.double",
        retry=Retry(attempts=1),
        registry=registry,
    )
    async def double(input: Num, step: Any, ctx: Any) -> int:
        seen.append((input.tag, input.n))
        if input.hold:
            await released.wait()
        if input.fail:
            raise Broke(f"child {input.n} broke")
        return input.n * 2

    @job(
        input=Fan,
        idempotency_key=lambda i: i.tag,
        tenant="none",
        name="conformance.child.parent",
        event_poll="1h",
        retry=Retry(attempts=1),
        registry=registry,
    )
    async def parent(input: Fan, step: Any, ctx: Any) -> int:
        one = await step.invoke("first", double, Num(tag=input.tag, n=100))
        calls = [
            (double, Num(tag=input.tag, n=i, fail=i == input.fail_at, hold=input.hold and i > 0))
            for i in range(input.count)
        ]
        many = await step.gather("fan", calls, fail_fast=input.fail_fast)
        return int(one) + sum(int(x) for x in many)

    return double, parent


def _worker(
    target: Target, registry: JobRegistry, queues: Sequence[str] = ("default",)
) -> AbstractAsyncContextManager[Worker]:
    # One slot: children can only run while the parent waits if the parent holds no slot.
    return running_worker(target, registry, queues=queues, concurrency=1)


async def _settled(target: Target, job_id: UUID, timeout: float = 20.0) -> tuple[str, str | None]:
    async def ended() -> bool:
        return (await outcome(target.driver, job_id))[0] not in (
            "ready",
            "delayed",
            "running",
            "suspended",
        )

    await eventually(ended, timeout=timeout, what=f"job {job_id} to settle")
    return await outcome(target.driver, job_id)


async def test_the_parent_link_is_stored_claimed_and_listed(target: Target) -> None:
    """A row enqueued with ``parent_run_id`` carries it on claim and get, and lists under it."""
    store = _store(target)
    parent = request("parent")
    await target.driver.enqueue(parent)
    kids = [
        dataclasses.replace(request(f"kid-{i}", queue="kids"), parent_run_id=parent.run_id)
        for i in range(3)
    ]
    for kid in kids:
        await target.driver.enqueue(kid)
        await target.advance(2)
    await target.driver.enqueue(request("stranger", queue="kids"))
    listed = await store.children(parent.run_id)
    assert [row.id for row in listed] == [kid.id for kid in kids]
    assert all(row.parent_run_id == parent.run_id for row in listed)
    assert all(row.steps == () for row in listed)
    picked = await store.children(parent.run_id, [kids[2].id, kids[0].id])
    assert [row.id for row in picked] == [kids[0].id, kids[2].id]
    assert await store.children(kids[0].run_id) == []
    claimed = await claim(target.driver, "kids", limit=10)
    by_id = {row.id: row.parent_run_id for row in claimed}
    assert len(by_id) == 4
    assert all(by_id.pop(kid.id) == parent.run_id for kid in kids)
    assert list(by_id.values()) == [None]
    info = await target.require("introspect").get(kids[1].id)
    assert info.parent_run_id == parent.run_id


async def test_invoke_and_gather_answer_child_results_in_order(target: Target) -> None:
    """The parent parks (no slot held), each child's settle wakes it, results come in order."""
    store = _store(target)
    registry = JobRegistry()
    seen: list[tuple[str, int]] = []
    _, parent = _jobs(registry, asyncio.Event(), seen)
    with use_driver(target.driver):
        result = await parent.enqueue(Fan(tag="ok", count=5))
    async with _worker(target, registry):
        assert await _settled(target, result.id) == ("done", None)
    info = await target.require("introspect").get(result.id)
    assert info.result == 200 + sum(2 * i for i in range(5))
    assert sorted(n for _, n in seen) == [0, 1, 2, 3, 4, 100]
    rows = await store.children(result.run_id)
    assert len(rows) == 6 and {row.state.value for row in rows} == {"done"}
    fanned = {child_ids(result.run_id, "fan", i)[0] for i in range(5)}
    assert {row.id for row in rows} == fanned | {child_ids(result.run_id, "first", 0)[0]}
    fan = next(s for s in info.steps if s.name == "fan")
    assert (fan.status, fan.event, fan.output) == ("completed", CHILD_SETTLED, [0, 2, 4, 6, 8])
    views = await ops.children(target.driver, result.id)
    assert [v.job.id for v in views] == [row.id for row in rows]


async def test_a_failed_child_fails_the_step_after_every_sibling_settled(target: Target) -> None:
    """Without ``fail_fast`` the step fails once all children ended, with the child's code."""
    store = _store(target)
    registry = JobRegistry()
    seen: list[tuple[str, int]] = []
    _, parent = _jobs(registry, asyncio.Event(), seen)
    with use_driver(target.driver):
        result = await parent.enqueue(Fan(tag="late", count=4, fail_at=1))
    async with _worker(target, registry):
        state, code = await _settled(target, result.id)
    assert (state, code) == ("dead", _code(target))
    rows = await store.children(result.run_id)
    assert sorted(row.state.value for row in rows) == ["dead", "done", "done", "done", "done"]
    failed = next(row for row in rows if row.state.value == "dead")
    assert failed.id == child_ids(result.run_id, "fan", 1)[0]
    if code is not None:
        info = await target.require("introspect").get(result.id)
        assert "child #1" in (info.last_error or "")


async def test_fail_fast_fails_at_once_and_cancels_live_siblings(target: Target) -> None:
    """With ``fail_fast`` the first failure fails the step; the live siblings are cancelled."""
    store = _store(target)
    registry = JobRegistry()
    released = asyncio.Event()
    seen: list[tuple[str, int]] = []
    _, parent = _jobs(registry, released, seen)
    with use_driver(target.driver):
        result = await parent.enqueue(Fan(tag="fast", count=3, fail_at=0, fail_fast=True))
    async with _worker(target, registry):
        state, code = await _settled(target, result.id)
        assert (state, code) == ("dead", _code(target))
        rows = {row.id: row.state.value for row in await store.children(result.run_id)}
        fan = [rows[child_ids(result.run_id, "fan", i)[0]] for i in range(3)]
        assert rows[child_ids(result.run_id, "first", 0)[0]] == "done"
        assert fan[0] == "dead"
        assert set(fan[1:]) <= {"cancelled", "done"}


async def test_cancelling_a_parent_cancels_its_live_children(target: Target) -> None:
    """``cancel`` of a waiting parent cancels its live children (``cancel_children`` default)."""
    store = _store(target)
    target.require("introspect")
    registry = JobRegistry()
    released = asyncio.Event()
    seen: list[tuple[str, int]] = []
    _, parent = _jobs(registry, released, seen)
    with use_driver(target.driver):
        result = await parent.enqueue(Fan(tag="cancel", count=3, hold=True))
    async with _worker(target, registry):

        async def holding() -> bool:
            return ("cancel", 1) in seen

        await eventually(holding, what="a held child to run")
        cancelled = await ops.cancel(target.driver, result.id)
        assert cancelled.state.value == "cancelled"
        rows = await store.children(result.run_id)
        by_n = {row.input["n"]: row.state.value for row in rows}
        assert by_n[100] == "done" and by_n[0] == "done"
        assert by_n[1] == "cancelled" and by_n[2] == "cancelled"
        released.set()
        await asyncio.sleep(0.05)
    assert (await outcome(target.driver, result.id))[0] == "cancelled"


async def test_a_child_buried_by_the_claim_wakes_its_parent(target: Target) -> None:
    """A child buried by the claim (its final lease lapsed) wakes its parent.

    The buried row carries its parent run, and the worker whose claim buried it publishes its
    ending, so the parked parent is due at once, not at the backstop.
    """
    _store(target)
    introspect = target.require("introspect")
    driver = target.driver
    parent = request("parent", queue="parents")
    await driver.enqueue(parent)
    [held] = await claim(driver, "parents")
    wait = StepRecord(
        "kids",
        "waiting",
        started_at=await driver.steps.now(),
        event=CHILD_SETTLED,
        match={"parent_run_id": str(parent.run_id)},
    )
    assert await driver.steps.write(StepWrite(held.id, held.fence, held.run_id, wait))
    far = 3_600_000
    assert await driver.nack(held.id, NackOptions(held.fence, delay_ms=far, park=True))
    kids = [
        dataclasses.replace(
            request(f"kid-{i}", queue="kids", max_attempts=1), parent_run_id=parent.run_id
        )
        for i in range(2)
    ]
    # Each is claimed by a claimant that dies, so its only attempt lapses; the first is buried
    # by a bare claim (which publishes nothing), the second by a worker's.
    await driver.enqueue(kids[0])
    assert len(await claim(driver, "kids", vt=200, worker="gone")) == 1
    await target.advance(400)
    buried: list[BuriedJob] = []
    assert await claim(driver, "kids", on_exhausted=buried.append) == []
    assert [(b.id, b.parent_run_id) for b in buried] == [(kids[0].id, parent.run_id)]
    await driver.enqueue(kids[1])
    assert len(await claim(driver, "kids", vt=200, worker="gone")) == 1
    await target.advance(400)
    before = await introspect.get(parent.id)
    assert before.state.value == "suspended" and before.run_at > await driver.steps.now()
    # The other child is buried by a real worker's claim: the worker publishes its ending.
    async with _worker(target, JobRegistry(), queues=["kids"]):

        async def woken() -> bool:
            row = await introspect.get(parent.id)
            return bool(row.run_at <= await driver.steps.now())

        await eventually(woken, what="the parent to be made due by the buried child")
