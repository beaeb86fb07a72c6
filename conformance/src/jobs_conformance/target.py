"""The driver under test, as every suite test sees it: the driver, its time, its capabilities.

Drivers decide "due" and "lapsed" on their own clock (Postgres on the database's ``now()``), so
the suite never reads a clock to predict them. A driver whose factory takes ``clock=`` runs on a
:class:`~jobs_core.testing.ManualClock` and :meth:`Target.advance` moves it; any other driver runs
in real time and :meth:`Target.advance` sleeps. Every duration the suite uses is short (hundreds
of milliseconds) and every check sits well clear of the instant it tests, so both ways agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import pytest

from jobs_core.clock import Clock
from jobs_core.driver import JobDriver, capability
from jobs_core.ids import new_id
from jobs_core.job import JobRegistry
from jobs_core.testing import ManualClock
from jobs_core.types import (
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    JobState,
    JSONValue,
    QueueStats,
)
from jobs_core.worker import Worker

__all__ = [
    "DriverFactory",
    "Target",
    "claim",
    "eventually",
    "outcome",
    "request",
    "running_worker",
    "state_counts",
]


class DriverFactory(Protocol):
    """What a driver package's ``driver_factory`` fixture answers.

    Each call answers a driver over the test's backend (fresh and empty when the test starts).
    A factory that also accepts a keyword ``clock`` is called with one, and its driver must
    decide every "due" and "lapsed" on it.
    """

    def __call__(self) -> Awaitable[JobDriver]:
        """Answer a driver over the test's backend."""
        ...


class Target:
    """The driver under test for one test.

    Attributes:
        driver: the driver (the first one the factory answered).
        clock: the manual clock the driver runs on, or ``None`` for a real-time driver.
    """

    def __init__(
        self,
        factory: Callable[..., Awaitable[JobDriver]],
        driver: JobDriver,
        clock: ManualClock | None,
    ) -> None:
        """Wrap ``driver`` (use :meth:`open`)."""
        self._factory = factory
        self.driver = driver
        self.clock = clock

    @classmethod
    async def open(
        cls, factory: Callable[..., Awaitable[JobDriver]], *, accepts_clock: bool
    ) -> Target:
        """Open the first driver of a test from the driver package's factory.

        Args:
            factory: the ``driver_factory`` fixture's value.
            accepts_clock: whether ``factory`` takes ``clock=`` (then a manual clock is used).
        """
        clock = ManualClock() if accepts_clock else None
        driver = await (factory(clock=clock) if accepts_clock else factory())
        return cls(factory, driver, clock)

    @property
    def manual(self) -> bool:
        """Whether time moves only when :meth:`advance` says so."""
        return self.clock is not None

    @property
    def time(self) -> Clock | None:
        """The clock to hand to workers and reference drivers (``None``: the real clock)."""
        return self.clock

    async def advance(self, ms: int) -> None:
        """Let ``ms`` milliseconds pass on the driver's clock (advance it, or sleep)."""
        if self.clock is not None:
            self.clock.advance(ms)
        else:
            await asyncio.sleep(ms / 1000)

    async def another(self) -> JobDriver:
        """Open one more driver over the same backend (call it on the loop that will use it).

        The suite closes it with :meth:`release` unless it is :attr:`driver` itself.
        """
        if self.clock is not None:
            return await self._factory(clock=self.clock)
        return await self._factory()

    async def real_time(self) -> JobDriver:
        """Open one more driver over the same backend on the real clock; close it with release.

        Worker subprocesses cannot share a manual clock, so the driver watching them must not
        run on one either (or the rows it enqueues would be due when the manual clock says).
        """
        return await self._factory()

    async def release(self, driver: JobDriver) -> None:
        """Close a driver from :meth:`another`, unless it is the shared :attr:`driver`."""
        if driver is not self.driver:
            await driver.close()

    def require(self, capability: str) -> Any:
        """Answer the store of an optional capability, or report the test NOT APPLICABLE.

        A driver that does not declare ``capability`` must say so in ``describe()`` too; the
        test is then skipped with a reason starting ``NOT APPLICABLE`` (never counted as
        passed).
        """
        if capability in self.driver.capabilities:
            store = getattr(self.driver, capability, None)
            assert store is not None, (
                f"{self.driver.name} declares {capability!r} but carries no {capability} store"
            )
            return store
        described = self.driver.describe()
        assert capability not in described.get("capabilities", ()), (
            f"{self.driver.name}: describe() lists {capability!r} but capabilities does not"
        )
        pytest.skip(
            f"NOT APPLICABLE: the {self.driver.name} driver does not declare the "
            f"{capability!r} capability (describe() lists it as missing)"
        )

    def require_flag(self, capability: str) -> None:
        """Report the test NOT APPLICABLE unless the driver declares flag ``capability``.

        A flag (``priority``, ``debounce``: :data:`jobs_core.driver.FLAG_CAPABILITIES`) is
        behaviour of ``enqueue``/``claim``, not a store, so nothing else is checked.
        """
        if capability in self.driver.capabilities:
            return
        described = self.driver.describe()
        assert capability not in described.get("capabilities", ()), (
            f"{self.driver.name}: describe() lists {capability!r} but capabilities does not"
        )
        pytest.skip(
            f"NOT APPLICABLE: the {self.driver.name} driver does not declare the "
            f"{capability!r} capability (describe() lists it as missing)"
        )

    async def close(self) -> None:
        """Close the driver (drivers from :meth:`another` are closed by :meth:`release`)."""
        await self.driver.close()


def request(
    key: str = "k",
    *,
    name: str = "conformance.job",
    queue: str = "default",
    tenant: str | None = "t1",
    max_attempts: int = 3,
    run_at: datetime | None = None,
    delay_ms: int = 0,
    payload: JSONValue = None,
    job_id: UUID | None = None,
    run_id: UUID | None = None,
    priority: int = 0,
    debounce_ms: int | None = None,
    debounce_max_ms: int | None = None,
) -> EnqueueRequest:
    """Answer an enqueue request with fresh ids unless given (the input defaults to the key).

    Args:
        key: the idempotency key.
        name: the job name.
        queue: the queue.
        tenant: the tenant (``None`` for none).
        max_attempts: the attempt budget.
        run_at: the earliest instant it may run.
        delay_ms: the delay from the driver's now.
        payload: the input (default ``{"key": key}``).
        job_id: an explicit job id.
        run_id: an explicit run id.
        priority: the claim priority (lower first).
        debounce_ms: debounce window (a debounced enqueue).
        debounce_max_ms: cap of a debounced row's total wait.
    """
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
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        enqueued_by="conformance",
        priority=priority,
        debounce_ms=debounce_ms,
        debounce_max_ms=debounce_max_ms,
    )


async def claim(
    driver: JobDriver,
    *queues: str,
    limit: int = 10,
    vt: int = 30_000,
    worker: str = "w1",
    drop_exhausted: frozenset[str] = frozenset(),
    on_exhausted: Callable[..., None] | None = None,
) -> list[ClaimedJob]:
    """Claim from ``queues`` (default ``["default"]``) with a ``vt`` ms lease for ``worker``."""
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


def state_counts(stats: Sequence[QueueStats], queue: str = "default") -> dict[str, int]:
    """Answer one queue's non-zero counts by state name (``oldest_ready_ms`` left out)."""
    for row in stats:
        if row.queue == queue:
            counts = {
                state.value: getattr(row, state.value)
                for state in JobState
                if getattr(row, state.value)
            }
            return counts
    return {}


async def outcome(
    driver: JobDriver, job_id: UUID, queue: str = "default"
) -> tuple[str, str | None]:
    """Answer a row's ``(state, last_error_code)``.

    With ``introspect`` the row is read; without it the state is the only non-zero count of
    ``queue`` (the test keeps one row there) and the code is ``None``.
    """
    introspect = capability(driver, "introspect")
    if introspect is not None:
        info = await introspect.get(job_id)
        assert info is not None, f"no row {job_id}"
        return (str(info.state), info.last_error_code)
    counts = state_counts(await driver.stats(), queue)
    assert len(counts) == 1 and sum(counts.values()) == 1, counts
    return (next(iter(counts)), None)


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, what: str = "condition"
) -> None:
    """Poll ``check`` every few milliseconds until it answers ``True``.

    Raises:
        AssertionError: it did not within ``timeout`` seconds (real time).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


@asynccontextmanager
async def running_worker(
    target: Target,
    registry: JobRegistry,
    *,
    queues: Sequence[str] = ("default",),
    visibility_timeout: str = "30s",
    concurrency: int = 4,
) -> AsyncIterator[Worker]:
    """Run a real :class:`~jobs_core.worker.Worker` on the target for the ``async with`` body."""
    worker = Worker(
        target.driver,
        queues=queues,
        concurrency=concurrency,
        poll_interval="5ms",
        idle_poll_max="20ms",
        visibility_timeout=visibility_timeout,
        registry=registry,
        clock=target.clock,
    )
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop()
        await task
