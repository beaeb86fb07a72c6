"""The wake throttle (migration 0002): a NOTIFY is never swallowed while a worker waits for it.

``wake()`` notifies a queue once per 250 ms slot, and again at once after a worker that heard the
last NOTIFY claimed the queue empty (the claim re-arms it). Each test here starts just after a
slot begins and redoes its steps when they spilled into the next slot, so what it proves never
rests on the slot throttle alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from jobs_pg import PostgresDriver
from pg_helpers import claim, request, until

SLOT_S = 0.25


def _slot() -> int:
    return int(time.time() / SLOT_S)


async def _slot_start() -> int:
    """Sleep until a wake slot has just begun; answer it."""
    await asyncio.sleep(SLOT_S - time.time() % SLOT_S + 0.002)
    return _slot()


async def _in_one_slot(steps: Callable[[], Awaitable[None]]) -> None:
    """Run ``steps`` from the start of a slot until one run stays within it."""
    for _ in range(20):
        first = await _slot_start()
        await steps()
        if _slot() == first:
            return
    pytest.fail("the steps never fit in one 250 ms slot")


async def _drain(driver: PostgresDriver) -> None:
    """Claim what an earlier run of the steps (one that spilled over a slot) left in ``q``."""
    while await claim(driver, "q", limit=100):
        pass


@pytest.fixture
async def heard(driver: PostgresDriver) -> AsyncIterator[list[str]]:
    """The queues ``driver``'s wake listener reports, once it is live."""
    names: list[str] = []
    unsubscribe = await driver.wake.subscribe(names.append)
    await until(lambda: driver.wake.live, timeout=10)
    yield names
    await unsubscribe()


@pytest.fixture
async def enqueuer(driver_factory: Callable[..., Any]) -> AsyncIterator[PostgresDriver]:
    """Another driver (its own pool): the process that enqueues."""
    opened: PostgresDriver = await driver_factory()
    yield opened
    await opened.close()


async def test_an_enqueue_after_an_idle_claim_wakes_at_once_in_the_same_slot(
    driver: PostgresDriver, enqueuer: PostgresDriver, heard: list[str]
) -> None:
    """The pickup figure's case: the second probe lands in the slot of the first one, which the
    worker already claimed; the old throttle sent no NOTIFY for it."""
    count = 0

    async def steps() -> None:
        nonlocal count
        await _drain(driver)
        heard.clear()
        await enqueuer.enqueue(request(f"first{count}", queue="q"))
        await until(lambda: heard == ["q"], timeout=5)
        assert len(await claim(driver, "q")) == 1
        assert await claim(driver, "q") == []  # the worker goes idle: this re-arms q
        await enqueuer.enqueue(request(f"second{count}", queue="q"))
        count += 1

    await _in_one_slot(steps)
    await until(lambda: heard == ["q", "q"], timeout=5)
    assert len(await claim(driver, "q")) == 1


async def test_a_burst_without_an_idle_claim_costs_one_notify_per_slot(
    driver: PostgresDriver, enqueuer: PostgresDriver, heard: list[str]
) -> None:
    """Enqueues while the worker is busy (its claims keep finding rows) re-arm nothing."""
    count = 0

    async def steps() -> None:
        nonlocal count
        await _drain(driver)
        heard.clear()
        await enqueuer.enqueue_many([request(f"a{count}-{i}", queue="q") for i in range(3)])
        await until(lambda: heard == ["q"], timeout=5)
        assert len(await claim(driver, "q", limit=1)) == 1  # found rows: nothing re-armed
        for i in range(5):
            await enqueuer.enqueue(request(f"b{count}-{i}", queue="q"))
        count += 1

    await _in_one_slot(steps)
    await asyncio.sleep(0.2)
    assert heard == ["q"]


async def test_an_enqueue_still_committing_when_the_worker_rearms_is_claimed_after_it(
    driver: PostgresDriver, enqueuer: PostgresDriver, heard: list[str]
) -> None:
    """An enqueue saw the queue disarmed (no NOTIFY) and has not committed when the worker's
    claim finds nothing: the re-arm waits for it (in the background past 20 ms), then wakes the
    worker for its row instead of leaving it to the next poll."""
    count = 0
    held: list[Any] = []

    async def steps() -> None:
        nonlocal count
        await _drain(driver)
        heard.clear()
        await enqueuer.enqueue(request(f"first{count}", queue="q"))
        await until(lambda: heard == ["q"], timeout=5)
        async with enqueuer._db.connection() as conn, conn.transaction():
            await enqueuer._enqueue_on(conn, [request(f"late{count}", queue="q")])
            # Claims "first" (rows came back: no re-arm), then nothing: re-arm, lock busy.
            assert len(await claim(driver, "q")) == 1
            held[:] = await claim(driver, "q")
            await asyncio.sleep(0.05)
        count += 1

    await _in_one_slot(steps)
    assert held == []
    await until(lambda: heard == ["q", "q"], timeout=5)
    assert [job.idempotency_key for job in await claim(driver, "q")] == [f"late{count - 1}"]


async def test_an_idle_poll_without_a_notify_heard_sends_no_rearm(
    driver: PostgresDriver, heard: list[str]
) -> None:
    """A queue is disarmed only by a NOTIFY the listener hears, so empty claims between NOTIFYs
    cost one statement, not two."""
    sent: list[str] = []
    rows = driver._db.rows

    async def counted(block: str, values: Any, conn: Any = None) -> Any:
        sent.append(block)
        return await rows(block, values, conn)

    driver._db.rows = counted  # type: ignore[method-assign]
    for _ in range(3):
        assert await claim(driver, "q") == []
    assert sent == ["claim"] * 3
    assert heard == []


async def test_unsubscribing_right_after_a_wake_closes_the_listener(
    driver: PostgresDriver, enqueuer: PostgresDriver
) -> None:
    """The listener stops, and promptly, when its last subscriber leaves right after a wake.

    The listener reads inside psycopg's ``notifies()`` generator, which holds the connection's
    lock while it is suspended; it must be cancelled inside it, never between two reads.
    """
    stopped: list[asyncio.Task[None]] = []

    def on_wake(queue: str) -> None:
        if not stopped:
            stopped.append(asyncio.get_running_loop().create_task(unsubscribe()))

    unsubscribe = await driver.wake.subscribe(on_wake)
    await until(lambda: driver.wake.live, timeout=10)
    await enqueuer.enqueue(request("k", queue="q"))
    await until(lambda: bool(stopped), timeout=5)
    await asyncio.wait_for(stopped[0], timeout=10)
    assert (driver.wake._task, driver.wake.live) == (None, False)
