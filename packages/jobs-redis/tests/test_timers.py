"""Timers on time on Redis: the next-due script, the wake of an earlier row for later, and a
worker that sleeps until a row's due instant instead of its poll (which here runs every 30 s).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Worker, job, use_driver
from jobs_core.driver import TimedWakeSource
from jobs_redis import RedisDriver
from redis_helpers import eventually, request


class Tick(BaseModel):
    key: str


async def test_next_due_answers_the_first_waiting_row_of_the_unpaused_queues(
    driver: RedisDriver,
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
    await driver.operator.pause_queue("other")
    paused = await wake.next_due_ms(["other", "q"])
    assert paused is not None and paused > 4_000


async def test_a_row_for_later_publishes_only_when_it_comes_first_in_its_queue(
    driver: RedisDriver,
) -> None:
    heard: list[str] = []
    unsubscribe = await driver.wake.subscribe(heard.append)
    try:
        await driver.enqueue(request("first", queue="q", delay_ms=60_000))
        await eventually(lambda: _is(heard, ["q"]), timeout=5)
        await driver.enqueue(request("later", queue="q", delay_ms=120_000))
        await asyncio.sleep(0.3)
        assert heard == ["q"]
        await driver.enqueue(request("earlier", queue="q", delay_ms=30_000))
        await eventually(lambda: _is(heard, ["q", "q"]), timeout=5)
    finally:
        await unsubscribe()


async def _is(heard: list[str], expected: list[str]) -> bool:
    return heard == expected


async def test_an_enqueue_for_later_wakes_a_worker_sleeping_until_a_later_row(
    driver: RedisDriver,
) -> None:
    registry = JobRegistry()
    runs: list[str] = []

    @job(input=Tick, idempotency_key=lambda i: i.key, tenant="none", name="tick", registry=registry)
    async def tick(input: Tick, step: Any, ctx: Any) -> None:
        runs.append(input.key)

    with use_driver(driver):
        await tick.enqueue(Tick(key="late"), delay="1h")
        worker = Worker(driver, registry=registry, poll_interval="30s", idle_poll_max="30s")
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.3)
            soon = await tick.enqueue(Tick(key="soon"), delay="800ms")

            async def done() -> bool:
                row = await driver.operator.get(soon.id)
                return row is not None and row.state == JobState.DONE

            await eventually(done, timeout=8)
        finally:
            await worker.stop()
            await running
    assert runs == ["soon"]
