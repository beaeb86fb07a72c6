"""Settles that outlive a blip: retry an ack, nack, park or step write while the lease can hold.

A finished attempt whose ack meets ``X_DRIVER_UNAVAILABLE`` (a server restarting, a read-only
window, a failover, a stale pooled connection) used to be dropped at once: the lease then lapsed
and the row ran again although its body had finished. Every settle is fenced on the attempt's
claim, so sending it again is safe: it lands once, or is refused because someone else owns the
row now. :class:`SettleRetry` therefore retries it with a jittered, doubling back-off for as long
as the attempt's lease can still be valid (the worker's heartbeat keeps renewing it meanwhile),
and only once the lease is surely gone drops the result, logged ``jobs.settle.abandoned``.

Rejected: retrying inside each driver. A driver cannot know the attempt's lease, and the same
policy would have to be written once per backend.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from jobs_core.driver import StepStore
from jobs_core.errors import DriverUnavailableError
from jobs_core.types import ClaimedJob, StepRecord, StepWrite

_log = logging.getLogger("jobs.worker")

T = TypeVar("T")

FIRST_DELAY_MS = 50
"""The first back-off before a refused settle is sent again (ms); it doubles from there."""

MAX_DELAY_MS = 2_000
"""The longest back-off between two tries of one settle (ms)."""


class SettleAbandonedError(Exception):
    """A settle kept meeting ``X_DRIVER_UNAVAILABLE`` until the attempt's lease was surely gone.

    Internal to the worker: its attempt ends with outcome ``lost`` (the row is re-claimed once
    its lease lapses), already logged ``jobs.settle.abandoned``.
    """


class SettleRetry:
    """Retries one worker's settles while each attempt's lease can still be valid.

    Args:
        lease_left: answers, for a claimed row, how many seconds its lease may still be valid
            (the worker's view: the last renewal that landed plus the visibility timeout, ``0``
            or less once it is surely gone or lost).
        first_delay_ms: the first back-off (ms).
        max_delay_ms: the longest back-off (ms).
    """

    def __init__(
        self,
        lease_left: Callable[[ClaimedJob], float],
        *,
        first_delay_ms: int = FIRST_DELAY_MS,
        max_delay_ms: int = MAX_DELAY_MS,
    ) -> None:
        """Keep the lease view and the back-off bounds."""
        self._lease_left = lease_left
        self._first_s = first_delay_ms / 1000
        self._max_s = max_delay_ms / 1000

    async def run(self, job: ClaimedJob, outcome: str, call: Callable[[], Awaitable[T]]) -> T:
        """Answer ``call()``'s result, sending it again after each ``X_DRIVER_UNAVAILABLE``.

        Each wait is drawn between half and all of the current back-off (so the settles of many
        attempts refused together do not come back together), and never outlasts the lease.

        Args:
            job: the claimed row the settle is for.
            outcome: what the settle records (``completed``, ``retried``, ``step`` ...), logged.
            call: sends the settle once (a fenced driver call).

        Raises:
            SettleAbandonedError: the lease was surely gone while the driver still refused
                (logged ``jobs.settle.abandoned`` with the job id and outcome).
            JobsError: any other failure of ``call``, at once.
        """
        delay = self._first_s
        tries = 0
        while True:
            try:
                return await call()
            except DriverUnavailableError as exc:
                tries += 1
                left = self._lease_left(job)
                if left <= 0:
                    _log.error(
                        "jobs.settle.abandoned",
                        extra={
                            "event": "jobs.settle.abandoned",
                            "job": job.name,
                            "job_id": str(job.id),
                            "outcome": outcome,
                            "tries": tries,
                            "error": str(exc),
                        },
                    )
                    raise SettleAbandonedError(
                        f"the {outcome} settle of {job.name} was refused until its lease lapsed"
                    ) from exc
                if tries == 1:
                    _log.warning(
                        "jobs.settle.retrying",
                        extra={
                            "event": "jobs.settle.retrying",
                            "job": job.name,
                            "job_id": str(job.id),
                            "outcome": outcome,
                            "error": str(exc),
                        },
                    )
                await asyncio.sleep(min(left, delay * (0.5 + random.random() / 2)))
                delay = min(delay * 2, self._max_s)

    def steps(self, store: StepStore, job: ClaimedJob) -> StepStore:
        """Answer ``store`` with its writes for ``job`` retried like a settle."""
        return _RetriedSteps(store, self, job)


class _RetriedSteps:
    """A :class:`~jobs_core.driver.StepStore` whose fenced writes go through a settle retry."""

    __slots__ = ("_job", "_retry", "_store")

    def __init__(self, store: StepStore, retry: SettleRetry, job: ClaimedJob) -> None:
        self._store = store
        self._retry = retry
        self._job = job

    async def load(self, run_id: UUID) -> list[StepRecord]:
        """Load the run's step records (not retried: the attempt has not begun)."""
        return await self._store.load(run_id)

    async def write(self, write: StepWrite) -> bool:
        """Write one step record, retried while the lease can hold."""
        return await self._retry.run(self._job, "step", lambda: self._store.write(write))

    async def now(self) -> datetime:
        """Answer the store's clock, asked again like a settle (a park needs it to land)."""
        return await self._retry.run(self._job, "step", self._store.now)
