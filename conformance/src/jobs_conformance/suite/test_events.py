"""Events (where declared): publish, find, match, expiry, one clock; waking waiters and workers."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.target import (
    Target,
    claim,
    eventually,
    outcome,
    request,
    running_worker,
    state_counts,
)
from jobs_core import JobRegistry, job, use_driver
from jobs_core.driver import EventBus, EventQuery, PublishRequest, TimedWakeSource
from jobs_core.types import Settle


def _bus(target: Target) -> EventBus:
    bus: EventBus = target.require("events")
    return bus


async def test_find_matches_by_name_since_payload_and_correlation(target: Target) -> None:
    """``find`` answers the earliest unexpired event matching every part of the query."""
    bus = _bus(target)
    since = await bus.now()
    first = await bus.publish(PublishRequest("paid", {"order": "o1", "n": 1}, "c1", 60_000))
    await target.advance(5)
    second = await bus.publish(PublishRequest("paid", {"order": "o2", "n": 2}, None, 60_000))
    await bus.publish(PublishRequest("shipped", {"order": "o1"}, None, 60_000))
    cases: list[tuple[EventQuery, Any]] = [
        (EventQuery("paid", since), first.id),
        (EventQuery("paid", since, {"order": "o2"}), second.id),
        (EventQuery("paid", since, {"order": "o1", "n": 1}), first.id),
        (EventQuery("paid", since, {"n": True}), None),
        (EventQuery("paid", since, {"order": "o3"}), None),
        (EventQuery("paid", since, correlation_key="c1"), first.id),
        (EventQuery("paid", since, correlation_key="c2"), None),
        (EventQuery("paid", second.published_at), second.id),
        (EventQuery("refunded", since), None),
    ]
    for query, expected in cases:
        found = await bus.find(query)
        assert (found.id if found else None) == expected, query
    found = await bus.find(EventQuery("paid", since, {"order": "o1"}))
    assert found is not None
    assert (found.name, found.payload, found.correlation_key) == (
        "paid",
        {"order": "o1", "n": 1},
        "c1",
    )


async def test_publish_is_stamped_on_the_bus_clock(target: Target) -> None:
    """``published_at`` comes from the bus's own ``now()``; ``expires_at`` adds the ttl."""
    bus = _bus(target)
    before = await bus.now()
    event = await bus.publish(PublishRequest("tick", {"n": 1}, None, 90_000))
    after = await bus.now()
    assert before <= event.published_at <= after
    assert event.expires_at - event.published_at == timedelta(milliseconds=90_000)
    assert event.published_at.utcoffset() == timedelta(0)
    assert await bus.find(EventQuery("tick", after + timedelta(milliseconds=1))) is None


async def test_expired_events_stop_matching_and_are_purged(target: Target) -> None:
    """An event past its ttl no longer matches; ``purge_expired`` deletes exactly those."""
    bus = _bus(target)
    since = await bus.now()
    await bus.publish(PublishRequest("short", {"n": 1}, None, 300))
    await bus.publish(PublishRequest("short", {"n": 2}, None, 300))
    kept = await bus.publish(PublishRequest("long", {"n": 3}, None, 3_600_000))
    assert await bus.find(EventQuery("short", since)) is not None
    await target.advance(500)
    assert await bus.find(EventQuery("short", since)) is None
    assert await bus.purge_expired() == 2
    assert await bus.purge_expired() == 0
    found = await bus.find(EventQuery("long", since))
    assert found is not None and found.id == kept.id


class Paid(BaseModel):
    """The payload the waiting job expects."""

    order_id: str
    amount: int


class Order(BaseModel):
    """The waiting job's input."""

    order_id: str


def _waiting_job(registry: JobRegistry, poll: str, seen: list[Any]) -> Any:
    @job(
        input=Order,
        idempotency_key=lambda i: i.order_id,
        tenant="none",
        name="conformance.await-payment",
        event_poll=poll,
        registry=registry,
    )
    async def await_payment(input: Order, step: Any, ctx: Any) -> None:
        paid = await step.wait_for_event(
            "paid", "conformance.paid", schema=Paid, match={"order_id": input.order_id}
        )
        seen.append(paid)

    return await_payment


async def _run_until_paid(target: Target, poll: str, advance_ms: int) -> list[Any]:
    registry = JobRegistry()
    seen: list[Any] = []
    handle = _waiting_job(registry, poll, seen)
    with use_driver(target.driver):
        result = await handle.enqueue(Order(order_id="o1"))
    async with running_worker(target, registry):

        async def parked() -> bool:
            return state_counts(await target.driver.stats()).get("suspended") == 1

        await eventually(parked, what="the run to park on its wait")
        bus = _bus(target)
        await bus.publish(
            PublishRequest("conformance.paid", {"order_id": "o2", "amount": 1}, None, 60_000)
        )
        await bus.publish(
            PublishRequest("conformance.paid", {"order_id": "o1", "amount": 5}, None, 60_000)
        )
        await target.advance(advance_ms)

        async def finished() -> bool:
            return (await outcome(target.driver, result.id))[0] == "done"

        await eventually(finished, what="the woken run to finish")
    return seen


async def test_a_published_event_resumes_its_waiting_run(target: Target) -> None:
    """A run parked on a wait resumes at its next check with the matching payload parsed."""
    seen = await _run_until_paid(target, poll="300ms", advance_ms=500)
    assert seen == [Paid(order_id="o1", amount=5)]


async def test_a_waking_bus_resumes_the_run_at_once(target: Target) -> None:
    """On a bus that wakes waiters, a publish makes the run due without waiting out its poll."""
    bus = _bus(target)
    if not bus.wakes_waiters:
        pytest.skip(f"NOT APPLICABLE: the {target.driver.name} event bus does not wake waiters")
    seen = await _run_until_paid(target, poll="1h", advance_ms=0)
    assert seen == [Paid(order_id="o1", amount=5)]


async def test_the_wake_source_announces_due_work(target: Target) -> None:
    """A subscriber hears the queue of a row that became due (an enqueue of ready work)."""
    wake = target.require("wake")
    heard: list[str] = []
    unsubscribe = await wake.subscribe(heard.append)
    try:
        await target.driver.enqueue(request("a", queue="woken"))

        async def told() -> bool:
            await asyncio.sleep(0)
            return "woken" in heard

        await eventually(told, timeout=5.0, what="a wake for queue 'woken'")
    finally:
        await unsubscribe()


async def test_an_idle_workers_timer_counts_a_running_rows_lease_expiry(target: Target) -> None:
    """``next_due_ms`` answers the first lease expiry too: a lapsed lease is claimable work.

    So an idle worker beside one that died wakes when the dead worker's lease lapses, not at
    its next idle poll (issue 14 item 11).
    """
    wake = target.require("wake")
    if not isinstance(wake, TimedWakeSource):
        pytest.skip(f"NOT APPLICABLE: the {target.driver.name} wake source keeps no timers")
    driver = target.driver
    await driver.enqueue(request("later", queue="timed", delay_ms=60_000))
    await driver.enqueue(request("held", queue="timed"))
    [held] = await claim(driver, "timed", vt=3_000)
    due = await wake.next_due_ms(["timed"])
    assert due is not None and 0 < due <= 3_000, due
    await target.advance(3_500)
    assert await wake.next_due_ms(["timed"]) == 0
    [again] = await claim(driver, "timed", worker="w2")
    assert again.id == held.id
    assert await driver.ack(again.id, Settle(again.fence))
    rest = await wake.next_due_ms(["timed"])
    assert rest is not None and 3_000 < rest <= 60_000, rest
