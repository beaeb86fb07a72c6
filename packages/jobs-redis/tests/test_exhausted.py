"""Rows whose attempts ran out, read back through the Redis operator surface (issue 14 item 9).

The conformance suite checks the error text through ``introspect``, which this driver does not
declare; ``RedisOperator.get`` answers the same row fields.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, job, use_driver
from jobs_core.testing import run_jobs
from jobs_redis import RedisDriver


class Item(BaseModel):
    key: str


class _Boom(Exception):
    code = "X_REDIS_BOOM"


async def test_an_exhausted_row_carries_x_job_max_attempts(driver: RedisDriver) -> None:
    registry = JobRegistry()

    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name="redis.exhaust",
        registry=registry,
        retry=Retry(attempts=2, delay="50ms"),
    )
    async def flaky(input: Item, step: Any, ctx: Any) -> None:
        raise _Boom(f"gateway down on attempt {ctx.attempt}")

    with use_driver(driver):
        result = await flaky.enqueue(Item(key="a"))
    await run_jobs(driver, registry=registry, timeout="20s")
    row = await driver.operator.get(result.id)
    assert row is not None
    assert (row.state, row.attempt, row.last_error_code) == (JobState.DEAD, 2, "X_JOB_MAX_ATTEMPTS")
    assert row.last_error is not None
    assert "X_REDIS_BOOM: gateway down on attempt 2" in row.last_error
