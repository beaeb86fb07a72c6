"""Retention (where declared): old settled rows go with their steps, in bounded calls.

Live rows and rows settled after the instant stay.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core.driver import RetentionStore
from jobs_core.errors import JobsError
from jobs_core.types import (
    JobState,
    NackOptions,
    RetentionRequest,
    Settle,
    StepRecord,
    StepWrite,
)

FINISHED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


def _store(target: Target) -> RetentionStore:
    store: RetentionStore = target.require("retention")
    return store


async def _settle(target: Target, keys: list[str], *, dead: bool = False) -> list[UUID]:
    """Enqueue, claim, write one step for and settle a row per key (done, or dead)."""
    driver = target.driver
    for key in keys:
        await driver.enqueue(request(key))
    held = await claim(driver, limit=len(keys))
    assert len(held) == len(keys)
    for job in held:
        record = StepRecord("s", "completed", output={"k": job.idempotency_key})
        assert await driver.steps.write(StepWrite(job.id, job.fence, job.run_id, record))
        if dead:
            assert await driver.nack(job.id, NackOptions(job.fence, dead_letter=True))
        else:
            assert await driver.ack(job.id, Settle(job.fence))
    return [job.run_id for job in held]


async def test_settled_rows_older_than_the_cutoff_go_with_their_steps(target: Target) -> None:
    """Rows settled before ``before`` are deleted with their steps; newer and live rows stay."""
    driver = target.driver
    store = _store(target)
    old_runs = await _settle(target, ["a", "b", "c"])
    await target.advance(600)
    cutoff = await driver.steps.now()
    await target.advance(50)
    await _settle(target, ["d"])
    await driver.enqueue(request("live"))
    assert await store.purge_settled(RetentionRequest(FINISHED, cutoff)) == 3
    counts = state_counts(await driver.stats())
    assert counts.get("ready") == 1, counts
    for run in old_runs:
        assert await driver.steps.load(run) == []
    assert await store.purge_settled(RetentionRequest(FINISHED, cutoff)) == 0
    later = await driver.steps.now() + timedelta(seconds=1)
    assert await store.purge_settled(RetentionRequest(FINISHED, later)) == 1, "the newer row"


async def test_a_purge_deletes_at_most_limit_rows_per_call(target: Target) -> None:
    """A call deletes at most ``limit``; calling until fewer come back empties the backlog."""
    driver = target.driver
    store = _store(target)
    await _settle(target, [f"k{i}" for i in range(7)])
    await target.advance(50)
    before = await driver.steps.now()
    found = [await store.purge_settled(RetentionRequest(FINISHED, before, 3)) for _ in range(4)]
    assert found == [3, 3, 1, 0]


async def test_only_the_states_named_are_purged(target: Target) -> None:
    """Dead rows stay under a done-only purge and go under a dead one."""
    driver = target.driver
    store = _store(target)
    await _settle(target, ["ok"])
    await _settle(target, ["bad"], dead=True)
    await target.advance(50)
    before = await driver.steps.now()
    assert await store.purge_settled(RetentionRequest(frozenset({JobState.DONE}), before)) == 1
    dead = RetentionRequest(frozenset({JobState.DEAD}), before)
    assert await store.purge_settled(dead) == 1
    assert await store.purge_settled(dead) == 0


async def test_bad_retention_requests_are_refused(target: Target) -> None:
    """A live or empty state set, a naive instant, or a limit outside 1..10,000 is refused."""
    store = _store(target)
    now = await target.driver.steps.now()
    for req in (
        RetentionRequest(frozenset(), now),
        RetentionRequest(frozenset({JobState.READY}), now),
        RetentionRequest(FINISHED, now.replace(tzinfo=None)),
        RetentionRequest(FINISHED, now, 0),
        RetentionRequest(FINISHED, now, 10_001),
    ):
        with pytest.raises(JobsError):
            await store.purge_settled(req)
