"""Timers on time: an idle worker sleeps until the next due row instead of its poll.

Every worker here polls only every 30 s, so a row that runs within the few seconds each test
waits proves the worker woke for its due instant (or for the wake of its enqueue), not the poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, Worker, job, use_driver
from jobs_core.driver import TimedWakeSource
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.ids import new_id
from jobs_core.types import EnqueueRequest

SLOW_POLL = {"poll_interval": "30s", "idle_poll_max": "30s"}


class Tick(BaseModel):
    key: str


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


@pytest.fixture
async def real() -> AsyncIterator[MemoryDriver]:
    mem = MemoryDriver()
    with use_driver(mem):
        yield mem
    await mem.close()


def request(queue: str = "default", delay_ms: int = 0) -> EnqueueRequest:
    return EnqueueRequest(
        id=new_id(),
        run_id=new_id(),
        name="tick",
        queue=queue,
        input={},
        idempotency_key=new_id().hex,
        tenant_id=None,
        max_attempts=3,
        run_at=None,
        delay_ms=delay_ms,
    )


async def test_memory_wake_source_answers_the_next_due_instant(real: MemoryDriver) -> None:
    wake = real.wake
    assert isinstance(wake, TimedWakeSource)
    assert await wake.next_due_ms(["default"]) is None
    await real.enqueue(request(delay_ms=20_000))
    later = await wake.next_due_ms(["default", "other"])
    assert later is not None and 19_000 < later <= 20_000
    await real.enqueue(request(delay_ms=5_000))
    sooner = await wake.next_due_ms(["default"])
    assert sooner is not None and 4_000 < sooner <= 5_000
    assert await wake.next_due_ms(["other"]) is None
    await real.enqueue(request(queue="other"))
    assert await wake.next_due_ms(["other", "default"]) == 0
    await real.introspect.pause_queue("other")
    sooner_again = await wake.next_due_ms(["other", "default"])
    assert sooner_again is not None and sooner_again > 4_000


async def test_a_row_for_later_wakes_its_queue_only_when_it_comes_first(
    real: MemoryDriver,
) -> None:
    heard: list[str] = []
    unsubscribe = await real.wake.subscribe(heard.append)
    try:
        await real.enqueue(request(delay_ms=10_000))
        await asyncio.sleep(0.01)
        assert heard == ["default"]
        await real.enqueue(request(delay_ms=20_000))
        await asyncio.sleep(0.01)
        assert heard == ["default"]
        await real.enqueue(request(delay_ms=5_000))
        await asyncio.sleep(0.01)
        assert heard == ["default", "default"]
    finally:
        await unsubscribe()


def _tick(registry: JobRegistry, runs: list[int], **options: Any) -> Any:
    @job(
        input=Tick,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name="tick",
        registry=registry,
        **options,
    )
    async def tick(input: Tick, step: Any, ctx: Any) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1 and options.get("retry") is not None:
            raise RuntimeError("first attempt fails")

    return tick


async def _done(driver: MemoryDriver, job_id: Any) -> bool:
    row = await driver.introspect.get(job_id)
    return row is not None and row.state == JobState.DONE


async def test_an_idle_worker_runs_a_delayed_job_at_its_due_instant(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs)
    queued = await tick.enqueue(Tick(key="a"), delay="300ms")
    worker = Worker(real, registry=registry, **SLOW_POLL)
    running = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: _done(real, queued.id))
    finally:
        await worker.stop()
        await running
    assert runs == [1]


async def test_an_enqueue_for_later_wakes_a_worker_sleeping_until_a_later_row(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs)
    await tick.enqueue(Tick(key="late"), delay="1h")
    worker = Worker(real, registry=registry, **SLOW_POLL)
    running = asyncio.create_task(worker.run())
    try:
        # The worker has claimed nothing and sleeps until the row due in an hour.
        await asyncio.sleep(0.1)
        soon = await tick.enqueue(Tick(key="soon"), delay="300ms")
        await eventually(lambda: _done(real, soon.id))
    finally:
        await worker.stop()
        await running
    assert runs == [1]


async def test_a_retry_runs_at_its_backoff_not_at_the_next_poll(
    real: MemoryDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs, retry=Retry(attempts=2, delay="300ms", jitter=False))
    queued = await tick.enqueue(Tick(key="a"))
    worker = Worker(real, registry=registry, **SLOW_POLL)
    running = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: _done(real, queued.id))
    finally:
        await worker.stop()
        await running
    assert runs == [1, 2]
