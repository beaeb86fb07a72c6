"""Timers on time on Postgres: the next-due probe, the wake of an earlier row for later, and a
worker that sleeps until a row's due instant instead of its poll.

The workers here poll only every 30 s, so a row that runs within the few seconds each test waits
proves the worker woke for its due instant (or for the NOTIFY of its enqueue), not the poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, Worker, job, use_driver
from jobs_core.driver import TimedWakeSource
from jobs_pg import PostgresDriver
from pg_helpers import claim, info, request, until

SLOW_POLL = {"poll_interval": "30s", "idle_poll_max": "30s"}


class Tick(BaseModel):
    key: str


@pytest.fixture
def registry() -> JobRegistry:
    return JobRegistry()


@pytest.fixture
async def enqueuer(driver_factory: Callable[..., Any]) -> AsyncIterator[PostgresDriver]:
    """Another driver (its own pool): the process that enqueues."""
    opened: PostgresDriver = await driver_factory()
    yield opened
    await opened.close()


async def test_next_due_answers_the_first_waiting_row_of_the_unpaused_queues(
    driver: PostgresDriver,
) -> None:
    wake = driver.wake
    assert isinstance(wake, TimedWakeSource)
    assert await wake.next_due_ms(["q"]) is None
    await driver.enqueue(request("late", queue="q", delay_ms=20_000))
    later = await wake.next_due_ms(["q", "other"])
    assert later is not None and 19_000 < later <= 20_000
    await driver.enqueue(request("soon", queue="q", delay_ms=5_000))
    sooner = await wake.next_due_ms(["q"])
    assert sooner is not None and 4_000 < sooner <= 5_000
    await driver.enqueue(request("now", queue="other"))
    assert await wake.next_due_ms(["other", "q"]) == 0
    await driver.introspect.pause_queue("other")
    paused = await wake.next_due_ms(["other", "q"])
    assert paused is not None and paused > 4_000


async def test_next_due_answers_the_earliest_row_over_every_priority(
    driver: PostgresDriver,
) -> None:
    """first_waiting() (migration 0015) takes each priority's first row from its probe."""
    wake = driver.wake
    assert isinstance(wake, TimedWakeSource)
    await driver.enqueue(request("urgent-late", queue="p", delay_ms=40_000, priority=-5))
    await driver.enqueue(request("lazy-soon", queue="p", delay_ms=10_000, priority=7))
    await driver.enqueue(request("middle", queue="p", delay_ms=25_000, priority=0))
    due = await wake.next_due_ms(["p"])
    assert due is not None and 9_000 < due <= 10_000
    # A claim of a due row leaves its index entry behind (no vacuum here): the probe passes it.
    now = await driver.enqueue(request("now", queue="p", priority=7))
    assert await wake.next_due_ms(["p"]) == 0
    assert [job.id for job in await claim(driver, "p")] == [now.id]
    due = await wake.next_due_ms(["p"])
    assert due is not None and 9_000 < due <= 10_000


async def test_a_row_for_later_notifies_only_when_it_comes_first_in_its_queue(
    driver: PostgresDriver, enqueuer: PostgresDriver
) -> None:
    heard: list[str] = []
    unsubscribe = await driver.wake.subscribe(heard.append)
    try:
        await until(lambda: driver.wake.live, timeout=10)
        await asyncio.sleep(0.3)
        heard.clear()
        await enqueuer.enqueue(request("first", queue="q", delay_ms=60_000))
        await until(lambda: heard == ["q"], timeout=5)
        # A later row (in a new slot, so the throttle is not what keeps it quiet) is not first.
        await asyncio.sleep(0.3)
        await enqueuer.enqueue(request("later", queue="q", delay_ms=120_000))
        await asyncio.sleep(0.5)
        assert heard == ["q"]
        await enqueuer.enqueue(request("earlier", queue="q", delay_ms=30_000))
        await until(lambda: heard == ["q", "q"], timeout=5)
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


async def _run_until_done(
    driver: PostgresDriver, registry: JobRegistry, before: Any, after: Any = None
) -> Any:
    """Run a slow-polling worker; ``before``/``after`` enqueue before it starts / once idle."""
    queued = await before() if before is not None else None
    worker = Worker(driver, registry=registry, **SLOW_POLL)
    running = asyncio.create_task(worker.run())
    try:
        if after is not None:
            await until(lambda: driver.wake.live, timeout=10)
            # The worker has claimed nothing and sleeps until the row due in an hour (or polls).
            await asyncio.sleep(0.3)
            queued = await after()

        async def done() -> bool:
            return (await info(driver, queued.id)).state == JobState.DONE

        await until(done, timeout=8)
    finally:
        await worker.stop()
        await running
    return queued


async def test_an_idle_worker_runs_a_delayed_job_at_its_due_instant(
    driver: PostgresDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs)
    with use_driver(driver):
        await _run_until_done(driver, registry, lambda: tick.enqueue(Tick(key="a"), delay="1500ms"))
    assert runs == [1]


async def test_an_enqueue_for_later_wakes_a_worker_sleeping_until_a_later_row(
    driver: PostgresDriver, enqueuer: PostgresDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs)
    with use_driver(driver):
        await tick.enqueue(Tick(key="late"), delay="1h")
    with use_driver(enqueuer):
        await _run_until_done(
            driver, registry, None, lambda: tick.enqueue(Tick(key="soon"), delay="1500ms")
        )
    assert runs == [1]


async def test_a_retry_runs_at_its_backoff_not_at_the_next_poll(
    driver: PostgresDriver, registry: JobRegistry
) -> None:
    runs: list[int] = []
    tick = _tick(registry, runs, retry=Retry(attempts=2, delay="1500ms", jitter=False))
    with use_driver(driver):
        await _run_until_done(driver, registry, lambda: tick.enqueue(Tick(key="a")))
    assert runs == [1, 2]
