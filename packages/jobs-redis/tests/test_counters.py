"""The ``counters`` capability on Redis: every settle path counts as the memory driver does,
the rollup folds the tiers on the shared rules, bounded per call and safe with two callers, and
nothing but the indexes is walked."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from jobs_core.driver import JobDriver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.testing import ManualClock
from jobs_core.types import CounterBucket, NackOptions, Settle
from jobs_redis import RedisDriver, _counters
from redis_helpers import claim, request


async def _settle_every_way(driver: JobDriver, lapse: Callable[[], Awaitable[None]]) -> None:
    """Settle rows of three names along every path that counts, and the ones that do not.

    ``lapse`` lets a 1 ms lease lapse on the driver's clock.
    """
    await driver.enqueue_many(
        [request(f"a{i}", name="alpha") for i in range(6)]
        + [request("b0", name="beta")]
        + [request("dead", name="beta", queue="lapse", max_attempts=1)]
        + [request("failed", name="gamma", queue="lapse", max_attempts=1)]
    )
    jobs = {job.idempotency_key: job for job in await claim(driver, limit=7)}
    assert len(await claim(driver, "lapse", vt=1)) == 2
    a = [jobs[f"a{i}"] for i in range(6)]
    # Two acks gathered into one script call, one more on its own.
    assert all(
        await asyncio.gather(
            driver.ack(a[0].id, Settle(a[0].fence, duration_ms=1.25)),
            driver.ack(a[1].id, Settle(a[1].fence, duration_ms=2.5)),
        )
    )
    assert await driver.ack(jobs["b0"].id, Settle(jobs["b0"].fence))
    assert await driver.nack(a[2].id, NackOptions(a[2].fence, delay_ms=60_000))  # retried
    assert await driver.nack(a[3].id, NackOptions(a[3].fence, dead_letter=True))  # dead
    # A park and a hand-back spend no attempt: neither counts.
    assert await driver.nack(a[4].id, NackOptions(a[4].fence, delay_ms=60_000, park=True))
    assert await driver.nack(a[5].id, NackOptions(a[5].fence, count_attempt=False))
    await lapse()
    # The one-attempt rows' leases lapsed: the next claim buries them (gamma's "failed").
    assert await claim(driver, "lapse", drop_exhausted=frozenset({"gamma"})) == []


async def _sleep() -> None:
    await asyncio.sleep(0.01)


def _counts(bucket: CounterBucket) -> tuple[str, int, int, int, int, float]:
    return (
        bucket.tier,
        bucket.done,
        bucket.retried,
        bucket.failed,
        bucket.dead,
        bucket.duration_ms,
    )


async def test_every_settle_path_counts_as_on_the_memory_driver(driver: RedisDriver) -> None:
    memory = MemoryDriver()
    for each in (driver, memory):
        await _settle_every_way(each, _sleep)
    for each in (driver, memory):
        await each.counters.rollup()  # nothing aged: nothing moves
    since = (await driver.steps.now()) - timedelta(hours=1)
    memory_since = (await memory.steps.now()) - timedelta(hours=1)
    for name in ("alpha", "beta", "gamma"):
        ours = [_counts(b) for b in await driver.counters.counters(name, since)]
        theirs = [_counts(b) for b in await memory.counters.counters(name, memory_since)]
        assert ours == theirs, name
    [alpha] = await driver.counters.counters("alpha", since)
    assert _counts(alpha) == ("1m", 2, 1, 0, 1, 3.75)
    assert alpha.bucket.second == 0 and alpha.bucket.tzinfo is UTC
    assert alpha.bucket <= await driver.steps.now() < alpha.bucket + timedelta(minutes=1)
    totals = await driver.counters.totals(since)
    assert {name: _counts(b) for name, b in totals.items()} == {
        name: _counts(b) for name, b in (await memory.counters.totals(memory_since)).items()
    }
    assert set(totals) == {"alpha", "beta", "gamma"}
    assert (totals["beta"].done, totals["beta"].dead, totals["gamma"].failed) == (1, 1, 1)
    assert totals["alpha"].bucket == since
    await memory.close()


async def test_reads_answer_only_buckets_ending_after_since(driver: RedisDriver) -> None:
    await driver.enqueue(request("k", name="late"))
    [job] = await claim(driver)
    assert await driver.ack(job.id, Settle(job.fence, duration_ms=1.0))
    now = await driver.steps.now()
    [minute] = await driver.counters.counters("late", now)
    assert await driver.counters.counters("late", minute.bucket + timedelta(minutes=1)) == []
    assert await driver.counters.counters("late", minute.bucket + timedelta(seconds=59)) != []
    assert await driver.counters.totals(minute.bucket + timedelta(minutes=1)) == {}
    assert await driver.counters.counters("other", now - timedelta(days=1)) == []
    with pytest.raises(DriverRequestInvalidError) as naive:
        await driver.counters.counters("late", datetime(2030, 1, 1))
    assert naive.value.code == "X_DRIVER_REQUEST_INVALID"
    with pytest.raises(DriverRequestInvalidError):
        await driver.counters.totals(datetime(2030, 1, 1))


async def test_a_non_finite_duration_counts_the_ack_and_spares_the_batch(
    driver: RedisDriver,
) -> None:
    await driver.enqueue_many([request(f"k{i}", name="odd") for i in range(3)])
    jobs = await claim(driver)
    landed = await asyncio.gather(
        driver.ack(jobs[0].id, Settle(jobs[0].fence, duration_ms=math.nan)),
        driver.ack(jobs[1].id, Settle(jobs[1].fence, duration_ms=math.inf)),
        driver.ack(jobs[2].id, Settle(jobs[2].fence, duration_ms=4.0)),
    )
    assert landed == [True, True, True]
    [bucket] = await driver.counters.counters("odd", (await driver.steps.now()) - timedelta(1))
    assert (bucket.done, bucket.duration_ms) == (3, 4.0)


async def _fold_like_memory(
    driver: RedisDriver, offsets: list[timedelta]
) -> list[tuple[int, int, list[tuple[str, int, int, int, int, float]]]]:
    """Settle on both drivers, then roll up at each offset from now; answer both sides' steps."""
    clock = ManualClock(await driver.steps.now())
    memory = MemoryDriver(clock=clock)
    steps = []

    async def tick() -> None:
        clock.advance("10ms")

    await _settle_every_way(driver, _sleep)
    await _settle_every_way(memory, tick)
    start = clock.now()
    since = start - timedelta(days=1)
    for offset in offsets:
        clock.set(start + offset)
        ours = await driver.counters.rollup(now=start + offset)
        theirs = await memory.counters.rollup()
        buckets = [_counts(b) for b in await driver.counters.counters("alpha", since)]
        assert buckets == [_counts(b) for b in await memory.counters.counters("alpha", since)]
        steps.append((ours, theirs, buckets))
    await memory.close()
    return steps


async def test_the_rollup_folds_the_tiers_as_the_memory_driver(
    driver: RedisDriver, redis_url: str
) -> None:
    day = timedelta(days=1)
    steps = await _fold_like_memory(driver, [timedelta(hours=23), 1.1 * day, 8 * day, 31 * day])
    for ours, theirs, _ in steps:
        assert ours == theirs
    tiers = [[bucket[0] for bucket in buckets] for _, _, buckets in steps]
    assert tiers == [["1m"], ["5m"], ["1h"], []]
    assert steps[1][2] == [("5m", 2, 1, 0, 1, 3.75)]
    assert [ours for ours, _, _ in steps] == [0, 3, 3, 3]  # alpha, beta, gamma each step
    # Nothing is left, the name index included.
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        left = [key async for key in client.scan_iter(match=driver._keys.base + "c[bnz]*")]
    finally:
        await client.aclose()
    assert left == []


async def test_one_rollup_folds_a_month_old_minute_straight_out(driver: RedisDriver) -> None:
    [(ours, theirs, buckets)] = await _fold_like_memory(driver, [timedelta(days=31)])
    assert (ours, theirs, buckets) == (9, 9, [])  # 3 names x (1m fold, 5m fold, 1h drop)


async def test_the_rollup_is_bounded_per_call_and_safe_with_two_callers(
    driver: RedisDriver,
    driver_factory: Callable[[], Awaitable[RedisDriver]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = [f"n{i}" for i in range(40)]
    await driver.enqueue_many([request(name, name=name) for name in names])
    jobs = await claim(driver, limit=40)
    assert all(await asyncio.gather(*(driver.ack(j.id, Settle(j.fence)) for j in jobs)))
    monkeypatch.setattr(_counters, "ROLLUP_BATCH", 3)
    folded: list[int] = []
    run = driver._s.run

    async def counting(script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        reply = await run(script, keys, args)
        if script == "counter_rollup":
            folded.append(int(reply[0]))
        return reply

    other = await driver_factory()
    monkeypatch.setattr(driver._s, "run", counting)
    later = (await driver.steps.now()) + timedelta(hours=25)
    try:
        ours, theirs = await asyncio.gather(
            driver.counters.rollup(now=later), other.counters.rollup(now=later)
        )
    finally:
        await other.close()
    assert ours + theirs == 40, "each minute bucket folded exactly once between the two"
    assert folded and max(folded) <= 3 and sum(folded) == ours, "3 buckets a call at most"
    since = later - timedelta(days=2)
    totals = await driver.counters.totals(since)
    assert {name: (b.tier, b.done) for name, b in totals.items()} == {n: ("5m", 1) for n in names}
    assert await driver.counters.rollup(now=later) == 0
