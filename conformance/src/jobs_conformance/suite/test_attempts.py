"""Attempts through a real worker: lost fleet slots, hand-backs, cancels, progress, exhaustion.

Each test runs a :class:`~jobs_core.worker.Worker` on the target and checks what the row says
afterwards, so the worker's decisions are proven against every driver's storage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.target import Target, claim, eventually, outcome, request
from jobs_core import JobHandle, JobRegistry, Retry, job, use_driver
from jobs_core.driver import LeaseRequest
from jobs_core.errors import AbortedError
from jobs_core.execute import hand_back
from jobs_core.metrics import JobsMetrics
from jobs_core.testing import run_jobs
from jobs_core.types import JobInfo, JobState
from jobs_core.worker import Worker


class Item(BaseModel):
    """A test job's input."""

    key: str


def item_job(
    registry: JobRegistry, name: str, **options: Any
) -> Callable[[Callable[..., Any]], JobHandle[Any, Any]]:
    """Declare a job of ``Item`` keyed by its key, in ``registry``."""
    return job(
        input=Item,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


@asynccontextmanager
async def worker_on(target: Target, registry: JobRegistry, **options: Any) -> AsyncIterator[Worker]:
    """Run a worker (by default a 300 ms lease, renewed every 100 ms) for the ``async with`` body.

    It is drained at the end (a body still running is cancelled and the drain ends within 2 s),
    so a failing check never leaves the test waiting on a body forever.
    """
    options.setdefault("visibility_timeout", "300ms")
    options.setdefault("drain_timeout", "2s")
    worker = Worker(
        target.driver,
        concurrency=4,
        poll_interval="5ms",
        idle_poll_max="20ms",
        registry=registry,
        clock=target.clock,
        **options,
    )
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.drain(close_driver=False)
        await task


async def _info(target: Target, job_id: Any) -> JobInfo:
    info: JobInfo | None = await target.require("introspect").get(job_id)
    assert info is not None
    return info


async def test_a_lost_fleet_slot_stops_the_body_and_hands_the_row_back(target: Target) -> None:
    """A slot renewal answering False fires the cancel, refuses steps, hands back uncounted."""
    leases = target.require("leases")
    registry = JobRegistry()
    started = asyncio.Event()
    seen: dict[str, Any] = {}

    @item_job(registry, "conformance.slot", concurrency=1, retry=Retry(attempts=3))
    async def exclusive(input: Item, step: Any, ctx: Any) -> None:
        if ctx.attempt > 1 or seen:
            return
        started.set()
        reason = await ctx.cancel.wait()
        seen["reason"] = reason.code
        try:
            await step.run("after", lambda: "x")
        except AbortedError as exc:
            seen["step"] = exc.code
        raise RuntimeError("stopped")

    with use_driver(target.driver):
        result = await exclusive.enqueue(Item(key="a"))
    async with worker_on(target, registry) as worker:
        await asyncio.wait_for(started.wait(), 10)
        # Someone else takes the only slot: the slot expired and another holder acquired it.
        await leases.release("job:conformance.slot", str(result.run_id))
        assert await leases.acquire(LeaseRequest("job:conformance.slot", 1, "intruder", 60_000))

        async def handed_back() -> bool:
            return worker.stats().outcomes.get("interrupted", 0) == 1

        await eventually(handed_back, what="the attempt to be handed back")
        assert seen == {"reason": "X_JOB_SLOT_LOST", "step": "X_ABORTED"}
        assert worker.stats().leases_lost == {}
    state, code = await outcome(target.driver, result.id)
    assert state in ("ready", "delayed")
    assert code in ("X_JOB_SLOT_LOST", None)
    assert [r.name for r in await target.driver.steps.load(result.run_id)] == []
    assert await leases.holders("job:conformance.slot") == ["intruder"]
    # The attempt was not spent: the next claim is attempt 1 again.
    await leases.release("job:conformance.slot", "intruder")
    await target.advance(1_500)
    [again] = await claim(target.driver)
    assert (again.id, again.attempt) == (result.id, 1)


async def test_busy_hand_backs_are_jittered_per_call(target: Target) -> None:
    """The default hand-back delay is drawn on every call (12 hand-backs, spread over 100 ms)."""
    introspect = target.require("introspect")
    driver = target.driver
    for n in range(12):
        await driver.enqueue(request(f"k{n}"))
    held = await claim(driver, limit=12)
    assert len(held) == 12
    for one in held:
        assert await hand_back(driver, one) == "deferred"
    due = [(await introspect.get(one.id)).run_at for one in held]
    spread = (max(due) - min(due)).total_seconds()
    assert len(set(due)) > 1 and spread >= 0.1, f"hand-back delays not jittered: {spread:.3f} s"


@pytest.mark.parametrize("cooperative", [True, False], ids=["cooperative", "ignores-cancel"])
async def test_an_operator_cancel_ends_a_running_async_body_as_cancelled(
    target: Target, cooperative: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancel of a running body: outcome ``cancelled``; a body ignoring it is cancelled at grace."""
    introspect = target.require("introspect")
    registry = JobRegistry()
    started = asyncio.Event()
    ended: list[str] = []

    @item_job(registry, "conformance.cancel", retry=Retry(attempts=3))
    async def long(input: Item, step: Any, ctx: Any) -> None:
        started.set()
        try:
            if cooperative:
                await ctx.cancel.wait()
                ctx.cancel.raise_if_cancelled()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            ended.append("task-cancelled")
            raise
        finally:
            ended.append("ended")

    with use_driver(target.driver):
        result = await long.enqueue(Item(key="a"))
    caplog.set_level(logging.INFO, logger="jobs")
    async with worker_on(target, registry, cancel_grace="200ms") as worker:
        await asyncio.wait_for(started.wait(), 10)
        await introspect.cancel(result.id, "stopped by the test")

        async def counted() -> bool:
            return worker.stats().outcomes.get("cancelled", 0) == 1

        await eventually(counted, what="the attempt counted as cancelled")
        assert worker.stats().outcomes == {"cancelled": 1}
    assert ended == (["ended"] if cooperative else ["task-cancelled", "ended"])
    assert await outcome(target.driver, result.id) == ("cancelled", "X_JOB_CANCELLED")
    # The attempt the operator stopped was spent: `jobsctl ls` reads 1/3, not 0/3.
    assert (await _info(target, result.id)).attempt == 1
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "jobs.settle.fenced" not in events
    assert "jobs.attempt.cancelled" in events


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_the_last_progress_report_is_written(target: Target, sync: bool) -> None:
    """Five reports within a second: the finished row carries the fifth."""
    target.require("introspect")
    registry = JobRegistry()

    def report(ctx: Any) -> None:
        for done in range(1, 6):
            ctx.progress(done, 5)

    def counting_sync(input: Item, step: Any, ctx: Any) -> None:
        report(ctx)

    async def counting_async(input: Item, step: Any, ctx: Any) -> None:
        report(ctx)

    counting = item_job(registry, "conformance.progress")(counting_sync if sync else counting_async)
    with use_driver(target.driver):
        result = await counting.enqueue(Item(key="a"))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    info = await _info(target, result.id)
    assert info.state == JobState.DONE
    assert info.progress == {"done": 5, "total": 5, "note": None}


class _Boom(Exception):
    code = "X_CONFORMANCE_BOOM"


async def test_a_row_whose_attempts_ran_out_says_so(target: Target) -> None:
    """Exhausted: X_JOB_MAX_ATTEMPTS, the last attempt's code and message in the error text."""
    registry = JobRegistry()

    @item_job(registry, "conformance.exhaust", retry=Retry(attempts=2, delay="100ms"))
    async def flaky(input: Item, step: Any, ctx: Any) -> None:
        raise _Boom(f"gateway down on attempt {ctx.attempt}")

    @item_job(registry, "conformance.terminal", queue="other", retry=Retry(attempts=2))
    async def refused(input: Item, step: Any, ctx: Any) -> None:
        from jobs_core.errors import JobInputInvalidError

        raise JobInputInvalidError("the input is wrong")

    with use_driver(target.driver):
        exhausted = await flaky.enqueue(Item(key="a"))
        terminal = await refused.enqueue(Item(key="b"))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    assert (await outcome(target.driver, exhausted.id))[0] == "dead"
    if "introspect" not in target.driver.capabilities:
        return
    assert await outcome(target.driver, terminal.id, "other") == ("dead", "X_JOB_INPUT_INVALID")
    info = await _info(target, exhausted.id)
    assert (info.last_error_code, info.attempt) == ("X_JOB_MAX_ATTEMPTS", 2)
    assert info.last_error is not None
    assert "X_CONFORMANCE_BOOM" in info.last_error
    assert "gateway down on attempt 2" in info.last_error


async def test_a_stuck_run_is_visible(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    """queue_oldest_running_seconds rises and one warning names a run past ``stuck_after``."""
    registry = JobRegistry()
    started = asyncio.Event()
    release = asyncio.Event()

    @item_job(registry, "conformance.stuck")
    async def hold(input: Item, step: Any, ctx: Any) -> None:
        started.set()
        await release.wait()

    with use_driver(target.driver):
        result = await hold.enqueue(Item(key="a"))
    metrics = JobsMetrics()
    caplog.set_level(logging.WARNING, logger="jobs")
    # A long lease with a quick heartbeat: time moves (on a manual clock too) without a lapse.
    options: dict[str, Any] = {"visibility_timeout": "30s", "heartbeat": "50ms"}
    async with worker_on(target, registry, metrics=metrics, stuck_after="300ms", **options):
        await asyncio.wait_for(started.wait(), 10)

        async def warned() -> bool:
            await target.advance(20)
            return any(getattr(r, "event", None) == "jobs.attempt.stuck" for r in caplog.records)

        await eventually(warned, what="the stuck-run warning")
        age = metrics.registry.get_sample_value(
            "queue_oldest_running_seconds", {"queue": "default"}
        )
        assert age is not None and age >= 0.3
        # Twice the threshold later, still one warning for the run.
        for _ in range(30):
            await target.advance(20)
        stuck = [r for r in caplog.records if getattr(r, "event", None) == "jobs.attempt.stuck"]
        assert len(stuck) == 1
        assert getattr(stuck[0], "job_id", None) == str(result.id)
        release.set()

        async def finished() -> bool:
            return (await outcome(target.driver, result.id))[0] == "done"

        await eventually(finished, what="the run to finish")

        async def cleared() -> bool:
            sample = metrics.registry.get_sample_value(
                "queue_oldest_running_seconds", {"queue": "default"}
            )
            return sample == 0

        await eventually(cleared, what="the gauge to fall to 0")
