"""A settle that meets ``X_DRIVER_UNAVAILABLE`` is retried while the lease can hold (issue 14).

The memory driver is wrapped so that its ack, nack or step writes refuse with
``DriverUnavailableError`` during an "outage" the test ends; heartbeats go on landing (a stale
pooled connection, say) unless the test breaks them too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, Worker, job, use_driver
from jobs_core.driver import LeaseRequest
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import DriverUnavailableError


class Item(BaseModel):
    key: str


class Outage:
    """Makes the wrapped driver calls refuse while ``on``; counts calls."""

    def __init__(self) -> None:
        self.on = True
        self.refused: dict[str, int] = {}
        self.landed: dict[str, int] = {}

    def wrap(self, name: str, call: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        async def flaky(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.refused[name] = self.refused.get(name, 0) + 1
                raise DriverUnavailableError("the test's outage", driver="memory")
            self.landed[name] = self.landed.get(name, 0) + 1
            return await call(*args, **kwargs)

        return flaky


def counting(name: str, outage: Outage, call: Callable[..., Awaitable[Any]]) -> Any:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        if outage.on:
            outage.landed[f"{name}-during"] = outage.landed.get(f"{name}-during", 0) + 1
        return await call(*args, **kwargs)

    return counted


def declare(registry: JobRegistry, name: str, body: Any, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )(body)


async def settled(driver: MemoryDriver, job_id: Any, *states: JobState) -> Any:
    for _ in range(1000):
        row = await driver.introspect.get(job_id)
        if row is not None and row.state in states:
            return row
        await asyncio.sleep(0.01)
    raise AssertionError(f"the row never reached {states}")


async def run_until(worker: Worker, done: Callable[[], Awaitable[Any]]) -> Any:
    running = asyncio.create_task(worker.run())
    try:
        return await done()
    finally:
        await worker.stop()
        await running


async def end_after(outage: Outage, seconds: float) -> None:
    await asyncio.sleep(seconds)
    outage.on = False


@pytest.fixture
def crashed(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.INFO, logger="jobs")
    return lambda: [r.getMessage() for r in caplog.records if r.getMessage().endswith("crashed")]


async def test_an_ack_refused_longer_than_the_lease_lands_while_heartbeats_renew_it(
    registry: JobRegistry, crashed: Callable[[], list[str]]
) -> None:
    driver, outage, runs = MemoryDriver(), Outage(), []
    driver.ack = outage.wrap("ack", driver.ack)  # type: ignore[method-assign]
    driver.heartbeat = counting("heartbeat", outage, driver.heartbeat)  # type: ignore[method-assign]

    async def body(input: Item, step: Any, ctx: Any) -> str:
        runs.append(input.key)
        asyncio.get_running_loop().create_task(end_after(outage, 0.9))
        return "ok"

    declare(registry, "acked", body)
    with use_driver(driver):
        queued = await registry.get("acked").enqueue(Item(key="a"))  # type: ignore[union-attr]
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="600ms")
    row = await run_until(worker, lambda: settled(driver, queued.id, JobState.DONE))

    assert row.result == "ok"
    assert runs == ["a"]
    assert outage.refused["ack"] >= 2
    # The outage outlived the first lease (0.6 s): heartbeats kept it while the ack waited.
    assert outage.landed.get("heartbeat-during", 0) >= 2
    assert worker.stats().outcomes == {"completed": 1}
    assert crashed() == []


async def test_a_retry_nack_and_a_step_write_refused_for_a_while_land_once(
    registry: JobRegistry, crashed: Callable[[], list[str]]
) -> None:
    driver, outage, effects = MemoryDriver(), Outage(), []
    driver.nack = outage.wrap("nack", driver.nack)  # type: ignore[method-assign]
    driver.steps.write = outage.wrap("write", driver.steps.write)  # type: ignore[method-assign]

    async def body(input: Item, step: Any, ctx: Any) -> str:
        async def effect() -> int:
            effects.append(ctx.attempt)
            return len(effects)

        if ctx.attempt == 1:
            asyncio.get_running_loop().create_task(end_after(outage, 0.3))
        await step.run("effect", effect)
        if ctx.attempt == 1:
            raise RuntimeError("try again")
        return "ok"

    declare(registry, "nacked", body, retry=Retry(attempts=3, delay="10ms"))
    outage.on = False
    with use_driver(driver):
        queued = await registry.get("nacked").enqueue(Item(key="a"))  # type: ignore[union-attr]
    outage.on = True
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="3s")
    row = await run_until(worker, lambda: settled(driver, queued.id, JobState.DONE))

    assert row.result == "ok"
    # The step's write waited out the outage: its effect ran once, attempt 2 replayed it.
    assert effects == [1]
    assert outage.refused["write"] >= 1 and outage.refused.get("nack", 0) == 0
    assert worker.stats().outcomes == {"retried": 1, "completed": 1}
    assert crashed() == []


async def test_a_failing_nack_is_retried_too(
    registry: JobRegistry, crashed: Callable[[], list[str]]
) -> None:
    driver, outage, runs = MemoryDriver(), Outage(), []
    driver.nack = outage.wrap("nack", driver.nack)  # type: ignore[method-assign]

    async def body(input: Item, step: Any, ctx: Any) -> str:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            asyncio.get_running_loop().create_task(end_after(outage, 0.3))
            raise RuntimeError("try again")
        return "ok"

    declare(registry, "renacked", body, retry=Retry(attempts=3, delay="10ms"))
    with use_driver(driver):
        queued = await registry.get("renacked").enqueue(Item(key="a"))  # type: ignore[union-attr]
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="3s")
    row = await run_until(worker, lambda: settled(driver, queued.id, JobState.DONE))

    assert row.result == "ok" and row.attempt == 2
    assert runs == [1, 2]
    assert outage.refused["nack"] >= 2
    assert crashed() == []


async def test_a_settle_is_abandoned_once_the_lease_is_surely_gone(
    registry: JobRegistry, caplog: pytest.LogCaptureFixture, crashed: Callable[[], list[str]]
) -> None:
    driver, outage = MemoryDriver(), Outage()
    driver.ack = outage.wrap("ack", driver.ack)  # type: ignore[method-assign]
    driver.heartbeat = outage.wrap("heartbeat", driver.heartbeat)  # type: ignore[method-assign]

    async def body(input: Item, step: Any, ctx: Any) -> str:
        return "ok"

    declare(registry, "abandoned", body)
    outage.on = False
    with use_driver(driver):
        queued = await registry.get("abandoned").enqueue(Item(key="a"))  # type: ignore[union-attr]
    outage.on = True
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="300ms")

    async def abandoned() -> Any:
        for _ in range(500):
            found = [r for r in caplog.records if r.getMessage() == "jobs.settle.abandoned"]
            if found:
                return found[0]
            await asyncio.sleep(0.01)
        raise AssertionError("no jobs.settle.abandoned")

    record = await run_until(worker, abandoned)
    assert record.job_id == str(queued.id)
    assert record.outcome == "completed"
    # (the lapsed row may be re-claimed and abandoned again before the worker stops)
    assert set(worker.stats().outcomes) == {"lost"}
    assert crashed() == []


async def test_a_parks_clock_question_refused_for_a_while_is_retried(
    registry: JobRegistry, crashed: Callable[[], list[str]]
) -> None:
    """The park asks the driver's clock before its nack: both ride the settle retry."""
    driver, outage, runs = MemoryDriver(), Outage(), []
    driver.steps.now = outage.wrap("now", driver.steps.now)  # type: ignore[method-assign]

    async def body(input: Item, step: Any, ctx: Any) -> str:
        runs.append(ctx.attempt)
        asyncio.get_running_loop().create_task(end_after(outage, 0.3))
        await step.sleep("nap", "50ms")
        return "rested"

    declare(registry, "napper", body)
    with use_driver(driver):
        queued = await registry.get("napper").enqueue(Item(key="a"))  # type: ignore[union-attr]
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="3s")
    row = await run_until(worker, lambda: settled(driver, queued.id, JobState.DONE))

    assert row.result == "rested" and row.attempt == 1
    assert outage.refused["now"] >= 1
    assert worker.stats().outcomes == {"suspended": 1, "completed": 1}
    assert crashed() == []


async def test_a_busy_slots_hand_back_refused_for_a_while_is_retried(
    registry: JobRegistry, crashed: Callable[[], list[str]]
) -> None:
    """A row handed back because its only slot is taken is not stranded by a blip."""
    driver, outage, runs = MemoryDriver(), Outage(), []

    async def body(input: Item, step: Any, ctx: Any) -> str:
        runs.append(ctx.attempt)
        return "ok"

    declare(registry, "single", body, concurrency=1)
    with use_driver(driver):
        queued = await registry.get("single").enqueue(Item(key="a"))  # type: ignore[union-attr]
    other = LeaseRequest("job:single", 1, "someone-else", 60_000)
    assert await driver.leases.acquire(other)
    driver.nack = outage.wrap("nack", driver.nack)  # type: ignore[method-assign]

    async def free_the_slot_later() -> None:
        await asyncio.sleep(0.3)
        outage.on = False
        await driver.leases.release(other.key, other.holder)

    asyncio.get_running_loop().create_task(free_the_slot_later())
    worker = Worker(driver, registry=registry, poll_interval="5ms", visibility_timeout="3s")
    row = await run_until(worker, lambda: settled(driver, queued.id, JobState.DONE))

    assert row.result == "ok" and row.attempt == 1
    assert runs == [1]
    assert outage.refused["nack"] >= 1
    assert worker.stats().outcomes.get("lost", 0) == 0
    assert crashed() == []
