"""Test helpers: a controllable clock, a context-local driver, and a worker run to idle.

``run_jobs`` runs a REAL :class:`~jobs_core.worker.Worker` (the same claim, execute and settle
paths production uses) until the driver holds no live row, advancing a :class:`ManualClock` past
delays, retries and sleeps when nothing else is due, so tests need not wait them out.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from jobs_core._crash import CrashReport, crash_proof
from jobs_core._current import use_driver
from jobs_core._durations import Duration, parse_duration
from jobs_core.driver import JobDriver
from jobs_core.job import REGISTRY, JobRegistry
from jobs_core.limits import Limits
from jobs_core.worker import Worker, WorkerStats

__all__ = ["CrashReport", "ManualClock", "crash_proof", "live_count", "run_jobs", "use_driver"]


class ManualClock:
    """A clock that moves only when told to.

    ``now()`` starts at ``start`` (default 2030-01-01 UTC) and moves with :meth:`advance` /
    :meth:`set`; ``monotonic()`` is the real monotonic clock plus every advance, so intervals
    measured across an advance see it.
    """

    def __init__(self, start: datetime | None = None) -> None:
        """Start at ``start`` (aware) or 2030-01-01T00:00:00Z."""
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("start: must be an aware datetime")
        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """Answer the current (manual) instant, UTC."""
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        """Answer real monotonic seconds plus every advance."""
        with self._lock:
            return time.monotonic() + self._offset

    def advance(self, by: Duration) -> datetime:
        """Move forward by a duration (``"5s"``, ``timedelta``, int ms); answer the new now."""
        ms = parse_duration(by, field="by", allow_zero=True)
        with self._lock:
            self._now += timedelta(milliseconds=ms)
            self._offset += ms / 1000
            return self._now

    def set(self, instant: datetime) -> None:
        """Jump to ``instant`` (aware; never backwards)."""
        with self._lock:
            if instant < self._now:
                raise ValueError("ManualClock.set: time never goes backwards")
            self._offset += (instant - self._now).total_seconds()
            self._now = instant


async def live_count(driver: JobDriver) -> int:
    """Answer how many rows are live (ready, delayed, running, suspended) per ``driver.stats()``."""
    return sum(s.ready + s.delayed + s.running + s.suspended for s in await driver.stats())


async def run_jobs(
    driver: JobDriver,
    *,
    timeout: Duration = "30s",
    clock: ManualClock | None = None,
    queues: Sequence[str] | None = None,
    concurrency: int | Mapping[str, int] = 8,
    limits: Limits | None = None,
    registry: JobRegistry | None = None,
    visibility_timeout: Duration = "30s",
) -> WorkerStats:
    """Run a real worker on ``driver`` until no row is live; answer its stats.

    With a :class:`ManualClock` (the driver's own), whenever nothing runs and nothing is due the
    clock jumps to the next due instant (``driver.next_due_at()``), so delays, backoffs, sleeps and
    event timeouts pass instantly. Without one they are waited out in real time.

    Args:
        driver: the driver (a memory driver built with the same ``clock`` to use jumps).
        timeout: real time allowed (``"30s"``).
        clock: the controllable clock to advance.
        queues: queues to serve (default: every queue of a declared job or with rows).
        concurrency: worker slots.
        limits: in-process limits.
        registry: the jobs to run (default: every declared job).
        visibility_timeout: the worker's lease.

    Raises:
        TimeoutError: rows are still live after ``timeout`` (the message says how many).
    """
    reg = registry or REGISTRY
    served = (
        list(queues)
        if queues
        else sorted(
            {h.queue for h in reg.all()} | {s.queue for s in await driver.stats()} or {"default"}
        )
    )
    worker = Worker(
        driver,
        queues=served,
        concurrency=concurrency,
        poll_interval="2ms",
        idle_poll_max="20ms",
        visibility_timeout=visibility_timeout,
        limits=limits,
        registry=reg,
        clock=clock,
        drain_timeout="1s",
    )
    budget = parse_duration(timeout, field="timeout") / 1000
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    running = loop.create_task(worker.run())
    timed_out = False
    try:
        while True:
            if running.done():
                running.result()
            stats = await driver.stats()
            live = sum(s.ready + s.delayed + s.running + s.suspended for s in stats)
            if live == 0 and worker.stats().in_flight == 0:
                break
            if loop.time() > deadline:
                timed_out = True
                raise TimeoutError(f"run_jobs: {live} live row(s) left after {budget:.1f} s")
            due_or_running = sum(s.ready + s.running for s in stats)
            if clock is not None and due_or_running == 0 and worker.stats().in_flight == 0:
                next_due = getattr(driver, "next_due_at", None)
                when = next_due() if callable(next_due) else None
                if inspect.isawaitable(when):
                    # A database-backed driver answers it with a query (jobs-pg).
                    when = await when
                # Checked again with no await before the jump: a claim that landed while the
                # query ran holds a lease the jump would lapse.
                if isinstance(when, datetime) and when > clock.now() and not worker.busy:
                    clock.set(when)
            await asyncio.sleep(0.002)
    finally:
        if timed_out:
            # A body that never ends must not hang the test: cancel it and give up its lease,
            # leaving the driver open for the test's own checks.
            await worker.drain(close_driver=False)
        else:
            await worker.stop()
        await running
    return worker.stats()
