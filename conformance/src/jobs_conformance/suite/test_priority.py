"""Priorities (the ``priority`` capability): lower first within a queue, FIFO within one."""

from __future__ import annotations

import pytest

from jobs_conformance.target import Target, claim, request
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.types import NackOptions


async def test_lower_priority_is_claimed_first_fifo_within_one(target: Target) -> None:
    """Ready rows come out by priority (lower first), then oldest first within a priority."""
    target.require_flag("priority")
    driver = target.driver
    order = [("a", 5), ("b", 0), ("c", 5), ("d", -3), ("e", 0), ("f", 32767), ("g", -32768)]
    for key, priority in order:
        await driver.enqueue(request(key, priority=priority))
        await target.advance(2)
    claimed = await claim(driver, limit=3)
    assert [c.idempotency_key for c in claimed] == ["g", "d", "b"]
    claimed = await claim(driver, limit=10)
    assert [c.idempotency_key for c in claimed] == ["e", "a", "c", "f"]


async def test_a_due_row_of_lower_priority_beats_a_backlog(target: Target) -> None:
    """Urgent rows enqueued behind a backlog are the next claim's first rows."""
    target.require_flag("priority")
    driver = target.driver
    await driver.enqueue_many([request(f"bulk-{i}", priority=5) for i in range(200)])
    await target.advance(2)
    await driver.enqueue_many([request(f"urgent-{i}", priority=0) for i in range(10)])
    claimed = await claim(driver, limit=10)
    assert [c.idempotency_key for c in claimed] == [f"urgent-{i}" for i in range(10)]
    assert [c.idempotency_key for c in await claim(driver, limit=2)] == ["bulk-0", "bulk-1"]


async def test_priority_does_not_make_a_delayed_row_due(target: Target) -> None:
    """A delayed row of a lower priority waits for its run_at; due rows go first meanwhile."""
    target.require_flag("priority")
    driver = target.driver
    await driver.enqueue(request("later", priority=-5, delay_ms=60_000))
    await driver.enqueue(request("now", priority=5))
    assert [c.idempotency_key for c in await claim(driver)] == ["now"]
    assert await claim(driver) == []


async def test_priority_is_per_queue_and_survives_a_retry(target: Target) -> None:
    """Other queues are untouched; a retried row keeps its priority."""
    target.require_flag("priority")
    driver = target.driver
    await driver.enqueue(request("other", queue="q2", priority=-1))
    await driver.enqueue(request("low", priority=9, max_attempts=3))
    await target.advance(2)
    await driver.enqueue(request("mid", priority=1))
    [low, mid] = sorted(await claim(driver, limit=2), key=lambda c: c.idempotency_key)
    assert (low.idempotency_key, mid.idempotency_key) == ("low", "mid")
    assert await driver.nack(low.id, NackOptions(low.fence))
    await target.advance(2)
    await driver.enqueue(request("high", priority=3))
    assert [c.idempotency_key for c in await claim(driver)] == ["high", "low"]
    assert [c.idempotency_key for c in await claim(driver, "q2")] == ["other"]


async def test_introspection_shows_the_priority(target: Target) -> None:
    """``introspect.get`` answers the row's priority (0 by default)."""
    target.require_flag("priority")
    introspect = target.require("introspect")
    one = await target.driver.enqueue(request("one", priority=-7))
    two = await target.driver.enqueue(request("two"))
    assert (await introspect.get(one.id)).priority == -7
    assert (await introspect.get(two.id)).priority == 0


async def test_out_of_range_priority_is_refused(target: Target) -> None:
    """A priority outside -32768..32767 is ``X_DRIVER_REQUEST_INVALID``, naming the field."""
    target.require_flag("priority")
    for bad in (-32769, 32768):
        with pytest.raises(DriverRequestInvalidError) as raised:
            await target.driver.enqueue(request("bad", priority=bad))
        assert raised.value.meta.get("field") == "priority"
    assert await claim(target.driver) == []
