"""A scheduler leader rolls the counters up: a busy job's history is never cut at 4,176 buckets."""

from __future__ import annotations

from datetime import timedelta

from jobs_core import MAX_COUNTER_ROWS, Scheduler
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock
from jobs_core.types import ClaimRequest, EnqueueRequest, Settle


def _request(key: str) -> EnqueueRequest:
    return EnqueueRequest(
        name="busy",
        queue="default",
        input={},
        idempotency_key=key,
        tenant_id=None,
        max_attempts=1,
        id=new_id(),
        run_id=new_id(),
    )


async def _settle_one(driver: MemoryDriver, key: str) -> None:
    await driver.enqueue(_request(key))
    [held] = await driver.claim(ClaimRequest(["default"], 1, 30_000, "w"))
    assert await driver.ack(held.id, Settle(held.fence, duration_ms=1.0))


async def test_three_days_of_one_job_a_minute_keep_every_count(
    driver: MemoryDriver, clock: ManualClock
) -> None:
    """4,320 minutes of settles: without the rollup the newest 4,176 minute buckets were all a
    query answered, and 144 settles were silently missing from the job's history."""
    minutes = 3 * 24 * 60
    assert minutes > MAX_COUNTER_ROWS
    start = clock.now()
    scheduler = Scheduler(driver, tasks=[], clock=clock, leader_ttl="3h", rollup_interval="1h")
    for minute in range(minutes):
        await _settle_one(driver, f"k{minute}")
        await scheduler.tick_once()
        clock.advance("1m")
    buckets = await driver.counters.counters("busy", start - timedelta(minutes=1))
    assert sum(b.done for b in buckets) == minutes
    assert len(buckets) <= MAX_COUNTER_ROWS
    tiers = {b.tier for b in buckets}
    assert tiers == {"1m", "5m"}, "day-old minutes were folded into 5-minute buckets"
    totals = await driver.counters.totals(start - timedelta(minutes=1))
    assert totals["busy"].done == minutes
