"""The factories on Redis: a backfill is refused (no ledger) naming the fix; the retention sweep
deletes settled rows with their steps."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, backfill, job, purge, retention_targets, use_driver
from jobs_core.errors import NotImplementedByDriverError
from jobs_core.testing import run_jobs
from jobs_core.types import RetentionRequest
from jobs_redis import RedisDriver


async def test_a_backfill_on_redis_is_refused_with_x_not_implemented_naming_the_fix(
    driver: RedisDriver,
) -> None:
    registry = JobRegistry()
    bf = backfill(
        name="redis.bf",
        tenant="none",
        pages=lambda cursor, cancel, input: ([], None),
        handle=lambda rows, cancel: None,
        registry=registry,
    )
    with use_driver(driver), pytest.raises(NotImplementedByDriverError) as refused:
        await bf.enqueue()
    assert refused.value.code == "X_NOT_IMPLEMENTED"
    assert "redis driver keeps no backfill ledger" in str(refused.value)
    assert "postgresql://" in str(refused.value)
    assert "backfills" in driver.describe()["not_applicable"]


class Item(BaseModel):
    n: int


async def test_the_retention_sweep_deletes_settled_rows_with_their_steps(
    driver: RedisDriver,
) -> None:
    registry = JobRegistry()

    @job(
        input=Item,
        idempotency_key=lambda i: str(i.n),
        tenant="none",
        name="redis.work",
        registry=registry,
    )
    async def work(item: Item, step: Any, ctx: Any) -> None:
        await step.run("one", lambda: item.n)

    with use_driver(driver):
        queued = await work.enqueue_many([Item(n=n) for n in range(5)])
        await run_jobs(driver, registry=registry, timeout="20s")
        now = await driver.steps.now()
        # The sweep's own instant, a second ahead: every row settled above is "older".
        sweep = purge(
            name="redis.sweep",
            targets=[
                t
                for t in retention_targets("1ms", "1ms", driver=driver, batch=2)
                if t.name != "events"
            ],
            registry=registry,
        )
        ran = await sweep.enqueue({})
        await run_jobs(driver, registry=registry, timeout="20s")
        info = await driver.operator.get(ran.id)
    assert info is not None and info.state == JobState.DONE
    assert info.result["removed"]["jobs.done"] == 5
    for result in queued:
        assert await driver.operator.get(result.id) is None
        assert await driver.steps.load(result.run_id) == []
    later = RetentionRequest(frozenset({JobState.DONE}), now + timedelta(hours=1))
    assert await driver.retention.purge_settled(later) == 1, "the sweep's own row"
