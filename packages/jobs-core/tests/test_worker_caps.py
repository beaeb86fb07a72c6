"""What a scaler reads from a worker: the configured cap, the effective capacity, and demand
asked only when there is work."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from jobs_core import JobRegistry, Limits, Worker, introspect, job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.metrics import JobsMetrics


class Item(BaseModel):
    key: str


class CountingDemand(MemoryDriver):
    """A memory driver that counts its ``demand()`` calls."""

    demand_calls = 0

    async def demand(self) -> dict[str, int]:
        self.demand_calls += 1
        return await super().demand()


def test_an_uncapped_worker_has_no_max_in_flight_and_its_slots_as_capacity() -> None:
    worker = Worker(MemoryDriver(), queues=["a", "b"], concurrency=4)
    stats = worker.stats()
    assert (stats.max_in_flight, stats.capacity, stats.peak_in_flight) == (None, 8, 0)


async def test_the_cap_is_max_in_flight_and_the_registry_row_holds_the_tighter(
    registry: JobRegistry,
) -> None:
    driver = MemoryDriver()
    started = asyncio.Event()
    release = asyncio.Event()

    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", registry=registry)
    async def hold(input: Item, step: Any, ctx: Any) -> None:
        started.set()
        await release.wait()

    with use_driver(driver):
        await hold.enqueue(Item(key="a"))
    capped = Worker(
        driver,
        queues=["default", "other"],
        concurrency=4,
        limits=Limits(global_=3),
        poll_interval="5ms",
        registry=registry,
    )
    assert (capped.stats().max_in_flight, capped.stats().capacity) == (3, 3)
    roomy = Worker(driver, queues=["default"], concurrency=2, limits=Limits(global_=50))
    assert (roomy.stats().max_in_flight, roomy.stats().capacity) == (50, 2)
    running = asyncio.create_task(capped.run())
    await started.wait()
    [row] = await introspect.workers(driver)
    assert row.slots == 3, "the registry row's concurrency is the tighter of cap and slots"
    metrics = JobsMetrics()
    metrics.attach(capped)
    assert metrics.registry.get_sample_value("job_worker_capacity") == 3
    release.set()
    await capped.stop()
    await running


async def test_demand_is_asked_only_when_stats_show_work(registry: JobRegistry) -> None:
    driver = CountingDemand()
    metrics = JobsMetrics()
    await metrics.refresh(driver)
    assert driver.demand_calls == 0
    assert [overview.demand for overview in await introspect.stats(driver)] == []
    assert driver.demand_calls == 0

    @job(input=Item, idempotency_key=lambda i: i.key, tenant="none", registry=registry)
    async def noop(input: Item, step: Any, ctx: Any) -> None:
        """Never run."""

    with use_driver(driver):
        await noop.enqueue(Item(key="a"))
    await metrics.refresh(driver)
    assert driver.demand_calls == 1
    assert metrics.registry.get_sample_value("queue_demand", {"queue": "default"}) == 1
    [overview] = await introspect.stats(driver)
    assert (overview.demand, driver.demand_calls) == (1, 2)
    later = CountingDemand()
    with use_driver(later):
        await noop.enqueue(Item(key="later"), delay="1h")
    await metrics.refresh(later)
    assert later.demand_calls == 0, "a delayed row is not demand yet"
    assert metrics.registry.get_sample_value("queue_demand", {"queue": "default"}) == 0
