"""Stops that cannot go wrong: a second stop signal ends a drain, a sync body ignoring a cancel."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, Worker, job, use_driver
from jobs_core.drivers.memory import MemoryDriver


class Item(BaseModel):
    key: str


def item_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


async def _until(check: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def _state(driver: MemoryDriver, job_id: UUID) -> tuple[JobState, int]:
    row = await driver.introspect.get(job_id)
    assert row is not None
    return row.state, row.attempt


async def test_a_second_sigterm_ends_the_drain_at_once(
    registry: JobRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """Bodies ignoring the drain (async and sync): a second SIGTERM hands both back uncounted."""
    driver = MemoryDriver()
    release = threading.Event()
    started: list[str] = []

    @item_job(registry, "stops.async", retry=Retry(attempts=1))
    async def stubborn(input: Item, step: Any, ctx: Any) -> None:
        started.append("async")
        await asyncio.sleep(60)

    @item_job(registry, "stops.sync", retry=Retry(attempts=1))
    def blocking(input: Item, step: Any, ctx: Any) -> None:
        started.append("sync")
        release.wait(30)

    with use_driver(driver):
        a = await stubborn.enqueue(Item(key="a"))
        b = await blocking.enqueue(Item(key="b"))
    worker = Worker(driver, registry=registry, poll_interval="5ms", drain_timeout="30s")
    worker.install_signal_handlers()
    loop = asyncio.get_running_loop()
    running = asyncio.create_task(worker.run())
    try:

        async def both_started() -> bool:
            return sorted(started) == ["async", "sync"]

        await _until(both_started)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert not running.done(), "the drain waits for bodies after one signal"
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(running, 2)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
        release.set()
    assert await _state(driver, a.id) == (JobState.READY, 0)
    assert await _state(driver, b.id) == (JobState.READY, 0)
    assert worker.stats().outcomes == {"interrupted": 2}
    assert any(getattr(r, "event", None) == "jobs.worker.drain-forced" for r in caplog.records)
    assert not any(
        getattr(r, "event", None) == "jobs.worker.drain-abandoned" for r in caplog.records
    )


async def test_a_sync_body_ignoring_a_cancel_is_logged_once_as_still_running(
    registry: JobRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync body runs on past the grace: one warning, and its end counts as ``cancelled``."""
    driver = MemoryDriver()
    release = threading.Event()
    started = threading.Event()

    @item_job(registry, "stops.deaf", retry=Retry(attempts=3))
    def deaf(input: Item, step: Any, ctx: Any) -> str:
        started.set()
        release.wait(30)
        return "finished anyway"

    with use_driver(driver):
        result = await deaf.enqueue(Item(key="a"))
    worker = Worker(
        driver,
        registry=registry,
        poll_interval="5ms",
        visibility_timeout="300ms",
        cancel_grace="100ms",
    )
    caplog.set_level(logging.INFO, logger="jobs")
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(started.wait, 5)
        await driver.introspect.cancel(result.id, "stopped by the test")

        def still_running() -> list[logging.LogRecord]:
            return [
                r
                for r in caplog.records
                if getattr(r, "event", None) == "jobs.cancel.still-running"
            ]

        async def warned() -> bool:
            return bool(still_running())

        await _until(warned)
        await asyncio.sleep(0.5)
        assert len(still_running()) == 1
        release.set()

        async def counted() -> bool:
            return worker.stats().outcomes.get("cancelled", 0) == 1

        await _until(counted)
    finally:
        release.set()
        await worker.stop()
        await running
    assert worker.stats().outcomes == {"cancelled": 1}
    assert await _state(driver, result.id) == (JobState.CANCELLED, 1)
    assert not any(getattr(r, "event", None) == "jobs.settle.fenced" for r in caplog.records)
