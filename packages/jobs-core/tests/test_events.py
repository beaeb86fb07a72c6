"""Events: publishing, the test and purge seams, and the rules ``wait_for_event`` keeps."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import (
    JobRegistry,
    JobState,
    Worker,
    events_purge_target,
    job,
    publish_event,
    reset_event_bus,
)
from jobs_core.driver import EventBus, EventQuery, PublishRequest
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import (
    DriverUnavailableError,
    JobOptionsInvalidError,
    NotImplementedByDriverError,
)
from jobs_core.steps import WAKING_EVENT_POLL_MS
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import StepRecord, StepWrite, StoredEvent

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Order(BaseModel):
    order_id: str
    org_id: str = "org-1"


class Confirmation(BaseModel):
    order_id: str
    accepted: bool


def waiting_job(registry: JobRegistry, answers: list[Any], **wait: Any) -> Any:
    @job(
        input=Order,
        idempotency_key=lambda i: f"wait:{i.order_id}",
        tenant=lambda i: i.org_id,
        name="waiter",
        registry=registry,
    )
    async def waiter(input: Order, step: Any, ctx: Any) -> None:
        options = {"schema": Confirmation, "timeout": "1d", **wait}
        answers.append(await step.wait_for_event("confirm", "order.confirmed", **options))

    return waiter


async def state_of(driver: MemoryDriver, job_id: UUID) -> JobState:
    row = await driver.introspect.get(job_id)
    assert row is not None
    return row.state


async def until_state(driver: MemoryDriver, job_id: UUID, state: JobState) -> None:
    async def poll() -> None:
        while await state_of(driver, job_id) != state:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 5)


# --- publish_event ------------------------------------------------------------------------------


async def test_publish_event_refuses_what_it_cannot_store(driver: MemoryDriver) -> None:
    for name, payload, ttl in (("", {}, "1d"), ("e", {}, "0s"), ("e", {"tags": {1, 2}}, "1d")):
        with pytest.raises(JobOptionsInvalidError):
            await publish_event(name, payload, ttl=ttl)
    assert await driver.events.find(EventQuery("e", EPOCH)) is None


async def test_publish_event_without_a_driver_is_refused() -> None:
    with pytest.raises(DriverUnavailableError):
        await publish_event("e", {})


# --- the seams ----------------------------------------------------------------------------------


async def test_reset_event_bus_forgets_every_event(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    await publish_event("short", {"n": 1}, ttl="1s")
    await publish_event("long", {"n": 2})
    clock.advance("2s")  # "short" expired but is still stored: reset removes it too

    assert await reset_event_bus() == 2
    assert await driver.events.purge_expired() == 0
    assert await driver.events.find(EventQuery("long", EPOCH)) is None
    await publish_event("long", {"n": 3})
    found = await driver.events.find(EventQuery("long", EPOCH))
    assert found is not None
    assert found.payload == {"n": 3}
    assert await reset_event_bus(driver.events) == 1


class PlainBus:
    """An event bus with the four required members and no ``reset``."""

    wakes_waiters = False

    def __init__(self, inner: EventBus) -> None:
        self.inner = inner

    async def publish(self, req: PublishRequest) -> StoredEvent:
        return await self.inner.publish(req)

    async def find(self, query: EventQuery) -> StoredEvent | None:
        return await self.inner.find(query)

    async def now(self) -> datetime:
        return await self.inner.now()

    async def purge_expired(self) -> int:
        return await self.inner.purge_expired()


async def test_reset_event_bus_needs_a_resettable_bus(driver: MemoryDriver) -> None:
    with pytest.raises(NotImplementedByDriverError) as refused:
        await reset_event_bus(PlainBus(driver.events))
    assert refused.value.code == "X_NOT_IMPLEMENTED"


async def test_reset_event_bus_without_a_driver_is_refused() -> None:
    with pytest.raises(DriverUnavailableError):
        await reset_event_bus()


async def test_events_purge_target_purges_only_expired_events(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    await publish_event("short", {}, ttl="1s")
    await publish_event("short", {}, ttl="1s")
    await publish_event("long", {}, ttl="1h")
    clock.advance("2s")
    target = events_purge_target(PlainBus(driver.events))

    assert target.name == "events"
    assert await target.purge() == 2
    assert await target.purge() == 0
    assert await driver.events.find(EventQuery("long", EPOCH)) is not None
    assert events_purge_target(driver.events, name="bus-b").name == "bus-b"
    with pytest.raises(JobOptionsInvalidError):
        events_purge_target(object())
    with pytest.raises(JobOptionsInvalidError):
        events_purge_target(driver.events, name="")


# --- wait_for_event -----------------------------------------------------------------------------


class PublishBeforeTheWaitLands:
    """The driver's step store, where an event is published while a waiting record is in flight.

    The publish lands one second after the wait began (on the bus clock) and the clock moves one
    more second before the record is written, so only a wait that looks from its start finds it.
    """

    def __init__(self, driver: MemoryDriver, clock: ManualClock) -> None:
        self.inner = driver.steps
        self.bus = driver.events
        self.clock = clock
        self.published: StoredEvent | None = None

    async def load(self, run_id: UUID) -> list[StepRecord]:
        return await self.inner.load(run_id)

    async def now(self) -> datetime:
        return await self.inner.now()

    async def write(self, write: StepWrite) -> bool:
        if write.record.status == "waiting" and self.published is None:
            self.clock.advance("1s")
            payload = {"order_id": "o1", "accepted": True}
            self.published = await self.bus.publish(
                PublishRequest("order.confirmed", payload, None, 60_000)
            )
            self.clock.advance("1s")
        return await self.inner.write(write)


async def test_an_event_published_before_the_waiting_record_lands_is_found_at_once(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers)
    steps = PublishBeforeTheWaitLands(driver, clock)
    driver.steps = steps
    start = clock.now()

    result = await waiter.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)

    assert steps.published is not None
    assert answers == [Confirmation(order_id="o1", accepted=True)]
    # Found by the check after writing `waiting`, not by the 15-minute backstop.
    assert clock.now() - start == timedelta(seconds=2)
    assert await state_of(driver, result.id) == JobState.DONE


async def test_an_event_published_before_the_wait_began_does_not_match(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers, timeout="1h")
    await publish_event("order.confirmed", {"order_id": "o1", "accepted": True})
    clock.advance("1ms")

    await waiter.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)

    assert answers == [None]


async def test_a_worker_clock_running_ahead_of_the_bus_neither_hides_an_event_nor_gives_up_early(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers, timeout="1d")
    # Two days ahead: past the wait's deadline, had the worker's clock been the one read.
    ahead = ManualClock(clock.now() + timedelta(days=2))
    worker = Worker(driver, registry=registry, poll_interval="5ms", clock=ahead)
    running = asyncio.create_task(worker.run())
    try:
        result = await waiter.enqueue(Order(order_id="o1"))
        await until_state(driver, result.id, JobState.SUSPENDED)
        assert answers == []
        await publish_event("order.confirmed", {"order_id": "o1", "accepted": True})
        await until_state(driver, result.id, JobState.DONE)
    finally:
        await worker.stop()
        await running

    assert answers == [Confirmation(order_id="o1", accepted=True)]


async def test_a_publish_wakes_its_waiter_without_the_backstop(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers, timeout="1d")
    worker = Worker(driver, registry=registry, poll_interval="5ms", clock=clock)
    running = asyncio.create_task(worker.run())
    start = clock.now()
    try:
        result = await waiter.enqueue(Order(order_id="o1"))
        await until_state(driver, result.id, JobState.SUSPENDED)
        parked = await driver.introspect.get(result.id)
        assert parked is not None
        # A bus that wakes waiters parks for the long backstop, well inside the 1-day timeout.
        assert parked.run_at == start + timedelta(milliseconds=WAKING_EVENT_POLL_MS)
        await publish_event("order.confirmed", {"order_id": "o1", "accepted": True})
        await until_state(driver, result.id, JobState.DONE)
    finally:
        await worker.stop()
        await running

    assert clock.now() == start
    assert answers == [Confirmation(order_id="o1", accepted=True)]


async def test_a_correlation_key_picks_its_own_event(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers, correlation_key="order-o1")
    worker = Worker(driver, registry=registry, poll_interval="5ms", clock=clock)
    running = asyncio.create_task(worker.run())
    try:
        result = await waiter.enqueue(Order(order_id="o1"))
        await until_state(driver, result.id, JobState.SUSPENDED)
        other = {"order_id": "o1", "accepted": False}
        await publish_event("order.confirmed", other, correlation_key="order-o2")
        await publish_event(
            "order.confirmed", {"order_id": "o1", "accepted": True}, correlation_key="order-o1"
        )
        await until_state(driver, result.id, JobState.DONE)
    finally:
        await worker.stop()
        await running

    assert answers == [Confirmation(order_id="o1", accepted=True)]


@pytest.mark.parametrize("schema", [None, 42])
async def test_wait_for_event_needs_a_schema_pydantic_can_use(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry, schema: Any
) -> None:
    answers: list[Any] = []
    waiter = waiting_job(registry, answers, schema=schema)

    result = await waiter.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)

    row = await driver.introspect.get(result.id)
    assert row is not None
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_OPTIONS_INVALID"
    assert row.last_error is not None and "schema" in row.last_error
    assert row.attempt == 1
