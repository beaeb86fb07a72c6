"""Issue 14 item 11: a lapsed lease is always re-claimed on Redis.

A worker process is SIGKILLed 1 s into a job whose lease is 2 s while a standby worker runs; the
standby must run the job again within the lease plus its idle poll. Seen once in four runs
before: a job left un-restarted for more than 30 s. Repeated ``JOBS_LAPSE_RUNS`` times (50 by
default; slow, so outside the default suite).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "apps"))

from jobs_core import JobRegistry, JobState, Worker
from jobs_core.ids import new_id
from jobs_core.types import EnqueueRequest
from jobs_redis import RedisDriver
from test_processes import spawn, stop

RUNS = int(os.environ.get("JOBS_LAPSE_RUNS", "50"))


def held(n: int, hold_ms: int) -> EnqueueRequest:
    return EnqueueRequest(
        name="hold.sleep",
        queue="default",
        input={"n": n, "hold_ms": hold_ms},
        idempotency_key=f"h{n}",
        tenant_id=None,
        max_attempts=5,
        id=new_id(),
        run_id=new_id(),
    )


@pytest.mark.slow
@pytest.mark.timeout(RUNS * 60)
async def test_a_worker_killed_inside_a_two_second_lease_is_always_replaced(
    redis_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import redis_hold_app  # the standby runs the same job in this process

    registry = JobRegistry()
    registry.register(redis_hold_app.hold)
    driver = await RedisDriver.connect(redis_url, prefix=prefix)
    took: list[float] = []
    try:
        for n in range(RUNS):
            proc = spawn(redis_url, prefix, "redis_hold_app", "--visibility-timeout", "2s")
            job_id = (await driver.enqueue(held(n, 1_500))).id
            deadline = time.monotonic() + 30
            while True:
                row = await driver.introspect.get(job_id)
                assert row is not None
                if row.state is JobState.RUNNING:
                    break
                assert time.monotonic() < deadline, "the worker process never claimed the job"
                await asyncio.sleep(0.02)
            standby = Worker(
                driver, registry=registry, visibility_timeout="2s", poll_interval="100ms"
            )
            running = asyncio.create_task(standby.run())
            await asyncio.sleep(1.0)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
            while True:
                row = await driver.introspect.get(job_id)
                assert row is not None
                if row.state is JobState.DONE:
                    break
                waited = time.monotonic() - killed
                assert waited < 15, f"run {n}: not re-run {waited:.1f} s after the kill ({row})"
                await asyncio.sleep(0.05)
            took.append(time.monotonic() - killed)
            await standby.stop()
            await running
            stop([proc])
    finally:
        await driver.close()
    with capsys.disabled():
        print(
            f"\n{len(took)} kills: re-run and done {min(took):.2f}..{max(took):.2f} s after the "
            f"kill (median {sorted(took)[len(took) // 2]:.2f} s)"
        )
