"""Stats and demand: exact counts after a scripted sequence, equal to the memory driver's."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from jobs_conformance.target import Target, claim, request
from jobs_core.clock import Clock
from jobs_core.driver import JobDriver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import ManualClock
from jobs_core.types import NackOptions, QueueStats, Settle


async def _script(driver: JobDriver, advance: Any) -> tuple[list[QueueStats], dict[str, int]]:
    """Drive one scripted sequence and answer the stats and demand it ends with."""
    for key in "abcdef":
        await driver.enqueue(request(key, queue="alpha"))
    await driver.enqueue(request("g", queue="alpha", delay_ms=60_000))
    a, b, c, d = await claim(driver, "alpha", limit=4)
    assert await driver.ack(a.id, Settle(a.fence))
    assert await driver.nack(b.id, NackOptions(b.fence, dead_letter=True))
    assert await driver.nack(c.id, NackOptions(c.fence, fail=True))
    [e] = await claim(driver, "alpha", limit=1)
    assert await driver.nack(e.id, NackOptions(e.fence, park=True, delay_ms=60_000))
    await driver.enqueue_many([request("h", queue="beta"), request("i", queue="beta")])
    [h] = await claim(driver, "beta", limit=1, vt=300)
    await advance(500)
    assert d.queue == "alpha" and h.queue == "beta"
    return await driver.stats(), await driver.demand()


def _without_age(stats: list[QueueStats]) -> list[QueueStats]:
    return [replace(row, oldest_ready_ms=0) for row in stats]


async def test_counts_per_state_after_a_scripted_sequence(target: Target) -> None:
    """Every state is counted in its queue; a lapsed lease still counts as running."""
    stats, demand = await _script(target.driver, target.advance)
    assert _without_age(stats) == [
        QueueStats(
            queue="alpha", ready=1, delayed=1, running=1, suspended=1, done=1, failed=1, dead=1
        ),
        QueueStats(queue="beta", ready=1, running=1),
    ]
    alpha = stats[0]
    assert 500 <= alpha.oldest_ready_ms < 60_000
    assert stats[1].oldest_ready_ms >= 500
    # alpha: d under a live lease and f due; beta: h whose lease lapsed, and i due.
    assert demand == {"alpha": 2, "beta": 2}


async def test_stats_and_demand_equal_the_memory_drivers(target: Target) -> None:
    """The same script answers the same stats and demand on the memory driver."""
    clock: Clock | None = ManualClock(target.clock.now()) if target.clock else None
    reference = MemoryDriver(clock)

    async def advance_both(ms: int) -> None:
        if isinstance(clock, ManualClock):
            clock.advance(ms)
        await target.advance(ms)

    try:
        stats, demand = await _script(target.driver, target.advance)
        ref_stats, ref_demand = await _script(reference, advance_both)
    finally:
        await reference.close()
    assert _without_age(stats) == _without_age(ref_stats)
    assert demand == ref_demand


async def test_paused_queues_count_only_running_rows_in_demand(target: Target) -> None:
    """Demand leaves out a paused queue's due rows but keeps its leased ones."""
    introspect = target.require("introspect")
    driver = target.driver
    await driver.enqueue_many([request(k, queue="alpha") for k in "abc"])
    await claim(driver, "alpha", limit=1)
    assert await driver.demand() == {"alpha": 3}
    await introspect.pause_queue("alpha")
    assert await driver.demand() == {"alpha": 1}
    await introspect.resume_queue("alpha")
    assert await driver.demand() == {"alpha": 3}
