"""Jobs the process tests run in ``jobsctl worker`` subprocesses; every execution is recorded.

Each process appends lines to ``$PG_WORKLOAD_LOG/<pid>.log`` (``O_APPEND`` writes of one line
are atomic), so a test reads back who ran what, when, on which attempt.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pydantic import BaseModel

from jobs_core import Retry, job


def record(*fields: Any) -> None:
    """Append one line ``pid field...`` to this process's log."""
    line = " ".join(str(f) for f in (os.getpid(), *fields)) + "\n"
    with open(os.path.join(os.environ["PG_WORKLOAD_LOG"], f"{os.getpid()}.log"), "a") as log:
        log.write(line)


class Item(BaseModel):
    n: int
    sleep_ms: int = 0


@job(
    input=Item,
    idempotency_key=lambda i: f"count:{i.n}",
    tenant="none",
    queue="count",
    retry=Retry(attempts=5, delay="100ms"),
)
async def count(input: Item, step: Any, ctx: Any) -> int:
    """Record the execution; optionally take a little time."""
    record("run", ctx.job_id, ctx.attempt, time.time())
    if input.sleep_ms:
        await asyncio.sleep(input.sleep_ms / 1000)
    return input.n


@job(
    input=Item,
    idempotency_key=lambda i: f"sleepy:{i.n}",
    tenant="none",
    queue="sleepy",
    retry=Retry(attempts=3, delay="100ms"),
)
async def sleepy(input: Item, step: Any, ctx: Any) -> int:
    """Hang on the first attempt (the test kills the process meanwhile); finish on the next."""
    record("start", ctx.job_id, ctx.attempt)
    if ctx.attempt == 1:
        await asyncio.sleep(60)
    record("end", ctx.job_id, ctx.attempt)
    return ctx.attempt


@job(input=Item, idempotency_key=lambda i: f"stall:{i.n}", tenant="none", queue="stall")
async def stall(input: Item, step: Any, ctx: Any) -> int:
    """Write a step, pause (the test SIGSTOPs the process here), write another."""
    await step.run("first", os.getpid)
    record("paused", ctx.job_id, ctx.attempt)
    await asyncio.sleep(1.5)
    record("resumed", ctx.job_id, ctx.attempt)
    pid: int = await step.run("second", os.getpid)
    return pid


@job(
    input=Item,
    idempotency_key=lambda i: f"limited:{i.n}",
    tenant="none",
    queue="limited",
    concurrency=1,
)
async def limited(input: Item, step: Any, ctx: Any) -> None:
    """Fleet-wide at most one at a time: record the start and end instants."""
    started = time.time()
    await asyncio.sleep(input.sleep_ms / 1000)
    record("span", ctx.job_id, started, time.time())


@job(
    input=Item,
    idempotency_key=lambda i: f"gate:{i.n}",
    tenant="none",
    queue="gate",
    concurrency=1,
    retry=Retry(attempts=3, delay="100ms"),
)
async def gate(input: Item, step: Any, ctx: Any) -> int:
    """Fleet-wide one at a time; item 0 hangs on its first attempt (the test kills it)."""
    record("gate", ctx.job_id, input.n, ctx.attempt)
    if input.n == 0 and ctx.attempt == 1:
        await asyncio.sleep(60)
    return input.n
