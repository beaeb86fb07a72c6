"""Debounced enqueues (the ``debounce`` capability): a burst of one key makes one run."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_conformance.target import Target, claim, request
from jobs_core import JobRegistry, job, use_driver
from jobs_core.driver import JobDriver
from jobs_core.types import Settle
from jobs_core.worker import Worker


async def test_a_later_enqueue_replaces_the_input_and_pushes_the_run_out(target: Target) -> None:
    """The waiting row takes the last input and runs ``debounce`` after the last enqueue."""
    target.require_flag("debounce")
    driver = target.driver
    first = await driver.enqueue(request("k", payload={"v": 1}, debounce_ms=400))
    assert not first.deduped
    await target.advance(200)
    second = await driver.enqueue(request("k", payload={"v": 2}, debounce_ms=400))
    assert (second.id, second.run_id, second.deduped) == (first.id, first.run_id, True)
    await target.advance(300)  # 500 ms after the first enqueue, 300 after the last
    assert await claim(driver) == []
    await target.advance(250)
    [job] = await claim(driver)
    assert (job.id, job.input) == (first.id, {"v": 2})
    assert await claim(driver) == []


async def test_debounce_max_caps_the_total_wait(target: Target) -> None:
    """With ``debounce_max`` the row runs by its first enqueue plus the cap, however busy."""
    target.require_flag("debounce")
    driver = target.driver
    first = await driver.enqueue(
        request("k", payload={"v": 0}, debounce_ms=400, debounce_max_ms=700)
    )
    for v in (1, 2, 3):
        await target.advance(200)
        again = await driver.enqueue(
            request("k", payload={"v": v}, debounce_ms=400, debounce_max_ms=700)
        )
        assert again.id == first.id
    # 600 ms after the first enqueue: the last push (to 1,000 ms) was capped at 700 ms.
    assert await claim(driver) == []
    await target.advance(250)
    [job] = await claim(driver)
    assert (job.id, job.input) == (first.id, {"v": 3})


async def test_once_claimed_the_next_enqueue_makes_a_new_row(target: Target) -> None:
    """A claimed debounced row frees its key: the next burst is a new row, debounced anew."""
    target.require_flag("debounce")
    driver = target.driver
    first = await driver.enqueue(request("k", payload={"v": 1}, debounce_ms=200))
    await target.advance(300)
    [running] = await claim(driver)
    assert running.id == first.id
    second = await driver.enqueue(request("k", payload={"v": 2}, debounce_ms=200))
    assert not second.deduped and second.id != first.id
    third = await driver.enqueue(request("k", payload={"v": 3}, debounce_ms=200))
    assert (third.id, third.deduped) == (second.id, True)
    assert await claim(driver) == []
    assert await driver.ack(running.id, Settle(running.fence))
    await target.advance(300)
    [job] = await claim(driver)
    assert (job.id, job.input) == (second.id, {"v": 3})


async def test_a_plain_enqueue_meets_the_waiting_row_unchanged(target: Target) -> None:
    """Without ``debounce`` an enqueue of the key is an ordinary dedupe: input and time stay."""
    target.require_flag("debounce")
    driver = target.driver
    first = await driver.enqueue(request("k", payload={"v": 1}, debounce_ms=300))
    plain = await driver.enqueue(request("k", payload={"v": 2}))
    assert (plain.id, plain.deduped) == (first.id, True)
    await target.advance(400)
    [job] = await claim(driver)
    assert job.input == {"v": 1}


async def test_debounce_takes_over_a_waiting_plain_row(target: Target) -> None:
    """A debounced enqueue meeting a never-claimed plain row debounces that row."""
    target.require_flag("debounce")
    driver = target.driver
    plain = await driver.enqueue(request("k", payload={"v": 1}))
    again = await driver.enqueue(request("k", payload={"v": 2}, debounce_ms=300))
    assert (again.id, again.deduped) == (plain.id, True)
    assert await claim(driver) == []
    await target.advance(400)
    [job] = await claim(driver)
    assert (job.id, job.input) == (plain.id, {"v": 2})


class Edit(BaseModel):
    """The burst test's input: which edit of the document this is."""

    doc: str
    v: int


@pytest.mark.slow
async def test_a_burst_of_100_edits_makes_one_run_with_the_last(target: Target) -> None:
    """100 enqueues over 10 s with ``debounce="2s"``: one run, the last input, ~2 s after it.

    A real worker (default polling; the driver's wake where it has one) on the real clock runs
    the job; the start must come within 2.1 s of the last enqueue (and not before 2 s).
    """
    target.require_flag("debounce")
    driver = await target.real_time()
    if target.manual and driver is target.driver:
        pytest.skip(
            "NOT APPLICABLE: the target has no real-clock driver over its backend and this test "
            "measures real time (jobs-core's test_priority_debounce.py runs it on a real-clock "
            "memory driver)"
        )
    await burst_of_edits(driver, target.release)


async def burst_of_edits(
    driver: JobDriver, release: Callable[[JobDriver], Awaitable[None]]
) -> float:
    """Run the 100-edit burst on ``driver`` (then ``release`` it); answer the delay in seconds.

    Raises:
        AssertionError: not one run, not the last input, or a start outside 1.95..2.1 s after
            the last enqueue.
    """
    registry = JobRegistry()
    runs: list[tuple[int, float]] = []
    ran = asyncio.Event()

    @job(
        input=Edit,
        idempotency_key=lambda i: f"doc:{i.doc}",
        tenant="none",
        name="conformance.debounced",
        registry=registry,
    )
    async def save(input: Edit, step: Any, ctx: Any) -> None:
        runs.append((input.v, time.time()))
        ran.set()

    worker = Worker(driver, concurrency=4, registry=registry, drain_timeout="2s")
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        ids = set()
        with use_driver(driver):
            start = time.monotonic()
            for v in range(100):
                await asyncio.sleep(max(0.0, start + v * 0.1 - time.monotonic()))
                result = await save.enqueue(Edit(doc="d1", v=v), debounce="2s")
                last = time.time()
                ids.add(result.id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ran.wait(), 5)
        await asyncio.sleep(0.5)  # a second run, if any, would start by now
    finally:
        await worker.drain(close_driver=False)
        await task
        await release(driver)
    assert len(ids) == 1, "every enqueue of the burst met the one waiting row"
    assert len(runs) == 1 and runs[0][0] == 99, runs
    delay = runs[0][1] - last
    print(f"\n{driver.name}: debounced run started {delay * 1000:.0f} ms after the last enqueue")
    assert 1.95 <= delay <= 2.1, delay
    return delay
