"""Builders shared by the pg tests (test data goes through the driver, never raw SQL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from jobs_core.ids import new_id
from jobs_core.types import ClaimedJob, ClaimRequest, EnqueueRequest, JobInfo
from jobs_pg import PostgresDriver


def request(
    key: str = "k",
    *,
    name: str = "job",
    queue: str = "default",
    tenant: str | None = "t1",
    max_attempts: int = 3,
    run_at: datetime | None = None,
    delay_ms: int = 0,
    payload: Any = None,
    job_id: UUID | None = None,
    run_id: UUID | None = None,
) -> EnqueueRequest:
    return EnqueueRequest(
        name=name,
        queue=queue,
        input={"key": key} if payload is None else payload,
        idempotency_key=key,
        tenant_id=tenant,
        max_attempts=max_attempts,
        id=job_id or new_id(),
        run_id=run_id or new_id(),
        run_at=run_at,
        delay_ms=delay_ms,
        traceparent="00-trace-span-01",
        enqueued_by="user-1",
    )


async def claim(
    driver: PostgresDriver,
    *queues: str,
    limit: int = 10,
    vt: int = 30_000,
    worker: str = "w1",
    drop_exhausted: frozenset[str] = frozenset(),
    on_exhausted: Any = None,
) -> list[ClaimedJob]:
    return await driver.claim(
        ClaimRequest(
            queues=list(queues or ("default",)),
            limit=limit,
            visibility_timeout_ms=vt,
            worker_id=worker,
            drop_exhausted=drop_exhausted,
            on_exhausted=on_exhausted,
        )
    )


async def info(driver: PostgresDriver, job_id: UUID) -> JobInfo:
    found = await driver.introspect.get(job_id)
    assert found is not None
    return found


async def until(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float = 30.0,
    every: float = 0.05,
) -> None:
    """Wait until ``check()`` holds (it may be async); fail with a TimeoutError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)
