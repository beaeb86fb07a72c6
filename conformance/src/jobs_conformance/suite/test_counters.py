"""Outcome counters (where ``counters`` is declared): what settles add, and what a read answers.

Each settle path adds what the memory driver adds, and a read answers the buckets that end after
its ``since``.

Folding needs a day to pass on the driver's clock: ``test_scheduler.py`` checks it where the
target runs on a manual clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import pytest

from jobs_conformance.target import Target, claim, request
from jobs_core.driver import CounterStore, JobDriver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.testing import ManualClock
from jobs_core.types import CounterBucket, NackOptions, Settle

Counts = tuple[str, int, int, int, int, float]


async def _script(driver: JobDriver, advance: Callable[[int], Awaitable[None]]) -> None:
    """Settle rows of three names along every path that counts, and two that do not."""
    await driver.enqueue_many(
        [request(f"a{i}", name="conformance.alpha") for i in range(6)]
        + [request("b", name="conformance.beta")]
        + [request("dead", name="conformance.beta", queue="lapse", max_attempts=1)]
        + [request("failed", name="conformance.gamma", queue="lapse", max_attempts=1)]
    )
    held = {job.idempotency_key: job for job in await claim(driver, limit=7)}
    assert len(await claim(driver, "lapse", vt=300)) == 2
    a = [held[f"a{i}"] for i in range(6)]
    # Acks arriving together (a driver may settle them in one call) and one on its own.
    assert all(
        await asyncio.gather(
            driver.ack(a[0].id, Settle(a[0].fence, duration_ms=1.25)),
            driver.ack(a[1].id, Settle(a[1].fence, duration_ms=2.5)),
        )
    )
    assert await driver.ack(held["b"].id, Settle(held["b"].fence))
    assert await driver.nack(a[2].id, NackOptions(a[2].fence, delay_ms=60_000))
    assert await driver.nack(a[3].id, NackOptions(a[3].fence, dead_letter=True))
    # A park and a hand-back spend no attempt: neither is an outcome.
    assert await driver.nack(a[4].id, NackOptions(a[4].fence, delay_ms=60_000, park=True))
    assert await driver.nack(a[5].id, NackOptions(a[5].fence, count_attempt=False))
    await advance(500)
    # The one-attempt rows' leases lapsed: the claim buries them, gamma's as "failed".
    assert await claim(driver, "lapse", drop_exhausted=frozenset({"conformance.gamma"})) == []


def _counts(bucket: CounterBucket) -> Counts:
    return (
        bucket.tier,
        bucket.done,
        bucket.retried,
        bucket.failed,
        bucket.dead,
        bucket.duration_ms,
    )


async def _read(counters: CounterStore, since: datetime) -> dict[str, list[Counts]]:
    names = ("conformance.alpha", "conformance.beta", "conformance.gamma")
    return {name: [_counts(b) for b in await counters.counters(name, since)] for name in names}


async def test_each_settle_adds_its_outcome_as_on_the_memory_driver(target: Target) -> None:
    """Each settle adds its outcome to its job's minute bucket, as on the memory driver.

    Acks add ``done`` and their durations, a spent retry ``retried``, a dead letter ``dead``, a
    lapsed final attempt ``dead`` (``failed`` when dropped); a park or a hand-back nothing.
    """
    counters: CounterStore = target.require("counters")
    clock = ManualClock(target.clock.now()) if target.clock else None
    reference = MemoryDriver(clock)

    async def advance_both(ms: int) -> None:
        if clock is not None:
            clock.advance(ms)
        await target.advance(ms)

    try:
        await _script(target.driver, target.advance)
        await _script(reference, advance_both)
        since = (await target.driver.steps.now()) - timedelta(hours=1)
        ref_since = (await reference.steps.now()) - timedelta(hours=1)
        ours = await _read(counters, since)
        assert ours == await _read(reference.counters, ref_since)
        totals = await counters.totals(since)
        ref_totals = await reference.counters.totals(ref_since)
    finally:
        await reference.close()
    assert ours["conformance.alpha"] == [("1m", 2, 1, 0, 1, 3.75)]
    assert ours["conformance.beta"] == [("1m", 1, 0, 0, 1, 0.0)]
    assert ours["conformance.gamma"] == [("1m", 0, 0, 1, 0, 0.0)]
    assert {n: _counts(b) for n, b in totals.items()} == {
        n: _counts(b) for n, b in ref_totals.items()
    }
    assert {b.bucket for b in totals.values()} == {since}


async def test_a_read_answers_the_buckets_that_end_after_since(target: Target) -> None:
    """A minute bucket is answered from ``since`` up to its last instant, and not after it."""
    counters: CounterStore = target.require("counters")
    driver = target.driver
    await driver.enqueue(request("k", name="conformance.late"))
    [held] = await claim(driver)
    assert await driver.ack(held.id, Settle(held.fence, duration_ms=1.0))
    [minute] = await counters.counters("conformance.late", await driver.steps.now())
    assert minute.bucket.second == minute.bucket.microsecond == 0
    assert minute.bucket.utcoffset() == timedelta(0)
    end = minute.bucket + timedelta(minutes=1)
    assert [
        b.done for b in await counters.counters("conformance.late", end - timedelta(seconds=1))
    ] == [1]
    assert await counters.counters("conformance.late", end) == []
    assert await counters.totals(end) == {}
    assert await counters.counters("conformance.never", minute.bucket) == []
    for call in (
        counters.counters("conformance.late", datetime(2030, 1, 1)),
        counters.totals(datetime(2030, 1, 1)),
    ):
        with pytest.raises(DriverRequestInvalidError) as refused:
            await call
        assert refused.value.code == "X_DRIVER_REQUEST_INVALID"
