"""Stopping a pg worker cannot hang, wherever the stop lands (issue 14 item 6).

A stop landing a few milliseconds after the start catches the wake listener dialling, sending
LISTEN or its first probe: on Python 3.11 a cancel that lands while ``wait_for``'s inner call
completes is swallowed, and an unbounded ``await`` of the listener then never returned.
"""

from __future__ import annotations

import asyncio
import random
import time

from jobs_core import JobRegistry, Worker
from jobs_pg import PostgresDriver

WORKERS = 200
STOP_WITHIN_S = 2.0


async def test_workers_stopped_0_to_10_ms_after_they_start_each_stop_within_2_s(
    driver: PostgresDriver,
) -> None:
    rng = random.Random(14)
    hung: list[tuple[int, float]] = []
    slowest = 0.0
    for n in range(WORKERS):
        worker = Worker(driver, queues=["stops"], registry=JobRegistry(), poll_interval="5ms")
        running = asyncio.create_task(worker.run())
        offset = rng.uniform(0, 0.010)
        await asyncio.sleep(offset)
        began = time.monotonic()
        try:
            async with asyncio.timeout(STOP_WITHIN_S):
                await worker.stop()
                await running
        except TimeoutError:
            hung.append((n, offset))
            running.cancel()
        slowest = max(slowest, time.monotonic() - began)
    print(f"\n{WORKERS} start+stop: slowest stop {slowest * 1000:.0f} ms, {len(hung)} hung")
    assert hung == []
    # The listener of the last worker is gone: nothing is left running on the driver.
    assert driver.wake.backend_pid is None
