"""The driver's capability stores: steps, operator surface, leases, events, scheduler, counters.

Each store is a thin layer over named blocks of ``queries.sql``: validation in Python, one
statement per call (a transaction where a call needs two), answers built from the rows. The
semantics are the memory driver's, which the conformance suite compares against.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from jobs_core.driver import (
    EventQuery,
    LeaseRequest,
    PublishRequest,
    StepResolution,
    check_task_name,
    check_watermark_forward,
)
from jobs_core.errors import (
    DriverRequestInvalidError,
    JobCancelledError,
    JobDuplicateError,
    JobNotCancellableError,
    JobNotFoundError,
    JobNotPromotableError,
    JobNotRemovableError,
    JobNotRequeueableError,
    JobPageInvalidError,
    StepNotResolvableError,
)
from jobs_core.ids import new_id
from jobs_core.types import (
    COUNTER_TIERS,
    LIVE_STATES,
    MAX_COUNTER_ROWS,
    MAX_JOB_PAGE,
    BulkResult,
    CounterBucket,
    CounterTier,
    EnqueueRequest,
    EnqueueResult,
    Fence,
    JobFilter,
    JobInfo,
    JobPage,
    JobState,
    JSONValue,
    StepRecord,
    StepWrite,
    StoredEvent,
    TaskFire,
    TaskFireRecord,
    WorkerInfo,
)
from jobs_pg._db import Db, Row, utc
from jobs_pg._outbox import ambient_connection, on_caller_connection
from jobs_pg._records import (
    aware,
    cursor,
    cursor_position,
    job_info,
    json_text,
    request_arrays,
    step_record,
    text_value,
)

EnqueueOn = Callable[[Any, Sequence[EnqueueRequest]], Awaitable[list[EnqueueResult]]]

LEASE_LOCK_NAMESPACE = "jobs-pg.lease"
"""The first key of a lease's advisory lock (the second is the lease key)."""

_TIERS: tuple[tuple[CounterTier, CounterTier | None, int, int], ...] = tuple(
    # tier, the tier it folds into, the width of a bucket there (s), how long the tier is kept (s)
    (
        spec.tier,
        parent.tier if parent is not None else None,
        (parent or spec).width_ms // 1000,
        spec.kept_ms // 1000,
    )
    for spec, parent in zip(COUNTER_TIERS, (*COUNTER_TIERS[1:], None), strict=True)
)


def _filter(flt: JobFilter) -> dict[str, Any]:
    """Answer the ``job_filter`` block's parameters for ``flt``.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
            ``created_from``/``created_to``.
    """
    return {
        "f_queue": flt.queue,
        "f_name": flt.name,
        "f_state": None if flt.state is None else str(flt.state),
        "f_tenant": flt.tenant_id,
        "f_prefix": None if flt.id_prefix is None else flt.id_prefix.lower(),
        "f_from": None if flt.created_from is None else aware(flt.created_from, "created_from"),
        "f_to": None if flt.created_to is None else aware(flt.created_to, "created_to"),
    }


class PgStepStore:
    """Step records in ``job_steps``, fenced on the job row's claim.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def load(self, run_id: UUID) -> list[StepRecord]:
        """Answer every step of a run in ``seq`` order (empty for a new run).

        The first load of a run this driver just claimed without step records, and has written
        none to since, is answered without a query (the claim statement said so): only the
        run's claimant writes its steps.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if self._db.stepless.pop(run_id, ...) is None:
            return []
        rows = await self._db.rows("steps_load", {"run_id": run_id})
        return [step_record(row) for row in rows]

    async def write(self, write: StepWrite) -> bool:
        """Insert or replace one step record (by ``run_id`` and name) in one statement.

        A write carrying ``job_id`` and ``fence`` lands only while that row is ``running`` under
        the fence and belongs to ``write.run_id`` (the row is share-locked for the write, so a
        re-claim cannot slip in between); one carrying neither (``run_inline``) always lands. A
        first insert gets ``seq`` one past the run's highest; a replacement keeps it.

        Returns:
            ``True`` when written; ``False``, writing nothing, when the fence does not hold.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a write carrying only one
                of ``job_id`` and ``fence``, or an output or match that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if (write.job_id is None) != (write.fence is None):
            raise DriverRequestInvalidError(
                "a step write carries both job_id and fence, or neither (run_inline)",
                job_id=None if write.job_id is None else str(write.job_id),
            )
        record = write.record
        fence = write.fence
        self._db.stepless.pop(write.run_id, None)
        landed = await self._db.row(
            "step_write",
            {
                "job_id": write.job_id,
                "worker": None if fence is None else fence.worker_id,
                "claim": None if fence is None else fence.claim,
                "unfenced": fence is None,
                "run_id": write.run_id,
                "name": text_value(record.name, "step name"),
                "status": record.status,
                "output": json_text(record.output, "step output"),
                "started_at": record.started_at,
                "completed_at": record.completed_at,
                "wake_at": record.wake_at,
                "event": text_value(record.event, "step event"),
                "match": None
                if record.match is None
                else json_text(dict(record.match), "step match"),
                "attempts": record.attempts,
                "error": text_value(record.error, "step error"),
                "once": record.once,
            },
        )
        return landed is not None

    async def now(self) -> datetime:
        """Answer the database's current instant (or the injected clock's), UTC."""
        injected = self._db.now()
        if injected is not None:
            return injected
        return utc(await self._db.value("now", {}))


class PgIntrospector:
    """The operator surface (``40-operator.md``) over the jobs table.

    ``JobInfo.attempt`` is the number of attempts spent so far; ``JobInfo.state`` is the stored
    state (a ``delayed`` row whose ``run_at`` passed shows ``delayed`` until claimed).

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def get(self, job_id: UUID) -> JobInfo | None:
        """Answer one job with its step trace, or ``None`` for an unknown id.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        async with self._db.connection() as conn:
            row = await self._db.row("job_get", {"id": job_id}, conn)
            if row is None:
                return None
            steps = await self._db.rows("steps_load", {"run_id": row[1]}, conn)
        return job_info(row, [step_record(step) for step in steps])

    async def _get(self, job_id: UUID) -> JobInfo:
        found = await self.get(job_id)
        if found is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        return found

    async def _state(self, job_id: UUID) -> JobState:
        """Answer a row's state, or raise ``X_JOB_NOT_FOUND``."""
        state = await self._db.value("job_state", {"id": job_id})
        if state is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        return JobState(state)

    async def cancel(self, job_id: UUID, reason: str) -> JobInfo:
        """Cancel a live job: ``cancelled`` now, its key freed.

        A running row's next ack, nack, heartbeat, progress or step write answers ``False``.
        ``last_error`` becomes ``reason`` and ``last_error_code`` ``X_JOB_CANCELLED``.

        Returns:
            The cancelled job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotCancellableError: ``X_JOB_NOT_CANCELLABLE`` for a finished row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        done = await self._db.row(
            "cancel",
            {"id": job_id, "reason": text_value(reason, "reason"), "code": JobCancelledError.code},
        )
        if done is None:
            state = await self._state(job_id)
            raise JobNotCancellableError(
                f"job {job_id} already finished ({state})", job_id=str(job_id), state=str(state)
            )
        return await self._get(job_id)

    async def resolve_step(self, job_id: UUID, step: str, resolution: StepResolution) -> None:
        """Settle a ``once`` step left ``started``: ``ran`` completes it, else it is deleted.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            StepNotResolvableError: ``X_STEP_NOT_RESOLVABLE`` unless the step is a ``once`` step
                in ``started``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an output that is not
                JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if resolution.ran:
            output = json_text(resolution.output, "step output")
            done = await self._db.row(
                "resolve_step_ran", {"id": job_id, "step": step, "output": output}
            )
        else:
            done = await self._db.row("resolve_step_not_ran", {"id": job_id, "step": step})
        if done is None:
            await self._state(job_id)
            status = await self._db.value("step_status", {"id": job_id, "step": step})
            raise StepNotResolvableError(
                f"step {step!r} of job {job_id} is not a once step left started",
                job_id=str(job_id),
                step=step,
                status=status,
            )

    async def record_progress(self, job_id: UUID, fence: Fence, progress: JSONValue) -> bool:
        """Store a running job's progress (JSON); fenced like an ack.

        Returns:
            ``True`` when stored; ``False`` when the row is not ``running`` under ``fence``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a value that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        done = await self._db.row(
            "record_progress",
            {
                "id": job_id,
                "worker": fence.worker_id,
                "claim": fence.claim,
                "progress": json_text(progress, "progress"),
            },
        )
        return done is not None

    async def pause_queue(self, queue: str) -> None:
        """Stop every claim from ``queue`` from its next statement on; enqueues still land.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("pause_queue", {"queue": text_value(queue, "queue")})

    async def resume_queue(self, queue: str) -> None:
        """Let claims take rows from ``queue`` again, waking its workers in the same statement.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("resume_queue", {"queue": text_value(queue, "queue")})

    async def paused_queues(self) -> builtins.list[str]:
        """Answer the paused queues, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return [row[0] for row in await self._db.rows("paused_queues", {})]

    async def requeue(self, job_id: UUID, from_step: str | None = None) -> JobInfo:
        """Queue a finished job again: ``ready`` now, ``attempt`` 0, same run and claim ordinal.

        Its result and progress are cleared; its last error is kept. With ``from_step``, that
        step and every later one (by ``seq``) are deleted in the same statement.

        Returns:
            The requeued job, with its remaining steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a ``from_step`` the run
                has no record of (nothing changes).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        try:
            done = await self._db.row("requeue", {"id": job_id, "from_step": from_step})
        except psycopg.errors.UniqueViolation:
            raise JobDuplicateError(
                f"another live job holds the key of job {job_id}", job_id=str(job_id)
            ) from None
        if done is None or done[0] == 0:
            state = await self._state(job_id)
            if state in LIVE_STATES:
                raise JobNotRequeueableError(
                    f"job {job_id} is still live ({state}); cancel it first to requeue it",
                    job_id=str(job_id),
                    state=str(state),
                )
            raise DriverRequestInvalidError(
                f"job {job_id} has no step named {from_step!r}", job_id=str(job_id), step=from_step
            )
        return await self._get(job_id)

    async def remove(self, job_id: UUID) -> None:
        """Delete a job that is not running, with its run's steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRemovableError: ``X_JOB_NOT_REMOVABLE`` for a ``running`` row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if await self._db.value("remove", {"id": job_id}) == 0:
            await self._state(job_id)
            raise JobNotRemovableError(
                f"job {job_id} is running; cancel it first", job_id=str(job_id)
            )

    async def promote(self, job_id: UUID) -> JobInfo:
        """Make a ``delayed`` or ``suspended`` row whose ``run_at`` is ahead due now.

        A ``delayed`` row becomes ``ready``; a ``suspended`` one stays ``suspended`` and is
        claimed at once. Its queue is woken in the same statement.

        Returns:
            The promoted job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` for any other row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if await self._db.value("promote", {"id": job_id}) == 0:
            state = await self._state(job_id)
            raise JobNotPromotableError(
                f"job {job_id} is not waiting on run_at ({state})",
                job_id=str(job_id),
                state=str(state),
            )
        return await self._get(job_id)

    async def _bulk(self, block: str, flt: JobFilter) -> BulkResult:
        row = await self._db.row(block, _filter(flt))
        assert row is not None  # an aggregate always answers one row
        return BulkResult(affected=int(row[0]), remaining=int(row[1]))

    async def requeue_many(self, flt: JobFilter) -> BulkResult:
        """Requeue up to ``BULK_LIMIT`` finished rows matching ``flt``, newest first.

        Each is requeued as :meth:`requeue` without ``from_step``; a row whose key a live row
        holds (one requeued earlier in this call included) stays and is not counted in
        ``remaining``. ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return await self._bulk("requeue_many", flt)

    async def remove_many(self, flt: JobFilter) -> BulkResult:
        """Remove up to ``BULK_LIMIT`` rows matching ``flt`` that are not running, newest first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return await self._bulk("remove_many", flt)

    async def promote_many(self, flt: JobFilter) -> BulkResult:
        """Promote up to ``BULK_LIMIT`` waiting rows matching ``flt``, newest first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return await self._bulk("promote_many", flt)

    # Last in the class: inside this class body ``list`` names this method.
    async def list(self, flt: JobFilter) -> JobPage:
        """Answer one page of jobs, newest first by ``(created_at, id)``, without step traces.

        ``after=`` answers rows older than the cursor's position and ``before=`` rows newer than
        it (the page is still newest first). A cursor is a position, not a row.

        Returns:
            The page; ``next`` is the last row's cursor when older rows match, ``prev`` the first
            row's cursor when newer rows match.

        Raises:
            JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for ``limit`` outside 1..200, a cursor
                this driver did not issue, or both ``after`` and ``before``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        limit = flt.limit
        if not 1 <= limit <= MAX_JOB_PAGE:
            raise JobPageInvalidError(
                f"limit must be 1..{MAX_JOB_PAGE}, got {limit}", limit=limit, max=MAX_JOB_PAGE
            )
        if flt.after is not None and flt.before is not None:
            raise JobPageInvalidError("pass after= or before=, not both")
        after = None if flt.after is None else cursor_position(flt.after)
        before = None if flt.before is None else cursor_position(flt.before)
        params = _filter(flt)

        def at(position: tuple[datetime, UUID] | None, n: int) -> dict[str, Any]:
            return params | {
                "at": None if position is None else position[0],
                "at_id": None if position is None else position[1],
                "limit": n,
            }

        async with self._db.connection() as conn:
            if before is not None:
                found = await self._db.rows(
                    "list_newer", at(before, limit + 1), conn, prepare=False
                )
                more_newer = len(found) > limit
                page = found[:limit][::-1]
                more_older = bool(page) and bool(
                    await self._db.rows(
                        "list_older", at(_position(page[-1]), 1), conn, prepare=False
                    )
                )
            else:
                found = await self._db.rows("list_older", at(after, limit + 1), conn, prepare=False)
                more_older = len(found) > limit
                page = found[:limit]
                more_newer = (
                    after is not None
                    and bool(page)
                    and bool(
                        await self._db.rows(
                            "list_newer", at(_position(page[0]), 1), conn, prepare=False
                        )
                    )
                )
        return JobPage(
            rows=tuple(job_info(row) for row in page),
            next=cursor(*_position(page[-1])) if more_older else None,
            prev=cursor(*_position(page[0])) if more_newer else None,
        )


def _position(row: Row) -> tuple[datetime, UUID]:
    """A listing row's ``(created_at, id)``."""
    return (row[12], row[0])


class PgChildJobs:
    """Child jobs (the ``children`` capability) on the ``jobs_parent_run`` index (0011).

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def children(self, run_id: UUID, ids: Sequence[UUID] | None = None) -> list[JobInfo]:
        """Answer run ``run_id``'s child rows (only ``ids`` when given), oldest first.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        params = {"run_id": run_id, "ids": None if ids is None else list(ids)}
        return [job_info(row) for row in await self._db.rows("children", params)]


class PgLeaseStore:
    """Fleet-wide concurrency slots in ``leases``: ``(key, slot)`` rows with an expiry.

    An acquire runs under a transaction-level advisory lock on its key, so two acquirers never
    both see a free slot and both take it (FIELD-FAILURES C28); an expired row is a free slot, so
    a crashed holder never blocks the key past its TTL.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def acquire(self, req: LeaseRequest) -> bool:
        """Take a slot of ``req.key`` for ``req.holder`` until now plus ``req.ttl_ms``.

        A holder that already holds a live slot has it renewed (always ``True``).

        Returns:
            ``True`` when held; ``False`` when ``req.limit`` other holders hold live slots.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``limit`` or ``ttl_ms``
                below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if req.limit < 1 or req.ttl_ms < 1:
            raise DriverRequestInvalidError(
                "a lease needs limit >= 1 and ttl_ms >= 1", limit=req.limit, ttl_ms=req.ttl_ms
            )
        params = {
            "namespace": f"{LEASE_LOCK_NAMESPACE}:{self._db.schema}",
            "key": text_value(req.key, "key"),
            "holder": text_value(req.holder, "holder"),
            "limit": req.limit,
            "ttl_ms": req.ttl_ms,
        }
        async with self._db.connection() as conn, conn.transaction():
            await self._db.rows("lease_lock", params, conn)
            return bool(await self._db.value("lease_acquire", params, conn))

    async def renew(self, req: LeaseRequest) -> bool:
        """Extend ``req.holder``'s live slot of ``req.key`` to now plus ``req.ttl_ms``.

        Returns:
            ``True`` when renewed; ``False`` when it holds no live slot.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if req.ttl_ms < 1:
            raise DriverRequestInvalidError("a lease needs ttl_ms >= 1", ttl_ms=req.ttl_ms)
        renewed = await self._db.row(
            "lease_renew", {"key": req.key, "holder": req.holder, "ttl_ms": req.ttl_ms}
        )
        return renewed is not None

    async def release(self, key: str, holder: str) -> None:
        """Free ``holder``'s slot of ``key`` (nothing happens if it holds none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("lease_release", {"key": key, "holder": holder})

    async def holders(self, key: str) -> list[str]:
        """Answer the holders of ``key``'s live slots, in acquisition order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return [row[0] for row in await self._db.rows("lease_holders", {"key": key})]


class PgEventBus:
    """The stored event bus; a publish wakes its waiting runs in the same statement.

    Inside ``jobs_pg.transaction(conn)`` a publish runs on that connection, so it commits and
    rolls back with the app's rows; ``published_at`` is then that statement's time, so a wait
    that begins between the publish and its commit does not match it.

    Attributes:
        wakes_waiters: always ``True``.

    Args:
        db: the driver's connection plumbing.
    """

    wakes_waiters: bool = True

    def __init__(self, db: Db) -> None:
        self._db = db

    async def publish(self, req: PublishRequest) -> StoredEvent:
        """Store an event, matchable until now plus ``req.ttl_ms``, and wake its waiting runs.

        Every ``suspended`` row whose run has a ``waiting`` step for ``req.name`` whose match the
        payload satisfies is made due now, and its queue notified, in the same statement.

        Returns:
            The stored event (``published_at`` is the database's now).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a payload that is not JSON
                or a ``ttl_ms`` out of range.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        params = {
            "id": new_id(),
            "name": text_value(req.name, "name"),
            "payload": json_text(req.payload, "payload"),
            "correlation_key": text_value(req.correlation_key, "correlation_key"),
            "ttl_ms": req.ttl_ms,
        }
        conn = ambient_connection()
        if conn is not None:
            row = await on_caller_connection(self._db, conn, "event_publish", params)
        else:
            row = await self._db.row("event_publish", params)
        assert row is not None  # the INSERT … RETURNING always answers its row
        return _event(row)

    async def find(self, query: EventQuery) -> StoredEvent | None:
        """Answer the earliest unexpired event matching ``query``, or ``None``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since`` or a
                match that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        row = await self._db.row(
            "event_find",
            {
                "name": query.name,
                "since": aware(query.since, "since"),
                "correlation_key": query.correlation_key,
                "match": json_text(dict(query.match or {}), "match"),
            },
        )
        return None if row is None else _event(row)

    async def now(self) -> datetime:
        """Answer the database's current instant (or the injected clock's): the bus's clock."""
        injected = self._db.now()
        if injected is not None:
            return injected
        return utc(await self._db.value("now", {}))

    async def purge_expired(self) -> int:
        """Delete every expired event; answer how many.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return int(await self._db.value("event_purge", {}))

    async def reset(self) -> int:
        """Delete every event, expired or not; answer how many (``reset_event_bus``'s seam).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return int(await self._db.value("event_reset", {}))


def _event(row: Row) -> StoredEvent:
    return StoredEvent(
        id=row[0],
        name=row[1],
        payload=row[2],
        correlation_key=row[3],
        published_at=utc(row[4]),
        expires_at=utc(row[5]),
    )


def _task_name(task: str) -> str:
    text_value(check_task_name(task), "task")
    return task


def _forward(task: str, expected: datetime | None, to: datetime, what: str) -> datetime:
    """Answer ``to`` in UTC, refusing a move that is not past ``expected``."""
    moved = aware(to, what)
    check_watermark_forward(
        task, None if expected is None else aware(expected, "expected"), moved, what
    )
    return moved


class PgSchedulerState:
    """Cron watermarks, fires and paused tasks.

    A fire is one transaction: the watermark's compare-and-set, the ``enqueue`` statement(s) and
    the ``task_fires`` record; its NOTIFYs are delivered at commit. A second scheduler firing the
    same occurrence waits on the watermark row, then finds it moved and writes nothing.

    Args:
        db: the driver's connection plumbing.
        enqueue_on: the driver's enqueue on a given connection.
    """

    def __init__(self, db: Db, enqueue_on: EnqueueOn) -> None:
        self._db = db
        self._enqueue_on = enqueue_on

    async def watermarks(self) -> dict[str, datetime]:
        """Answer every task's watermark (UTC) by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return {row[0]: utc(row[1]) for row in await self._db.rows("watermarks", {})}

    async def fire(self, fire: TaskFire) -> list[EnqueueResult] | None:
        """Enqueue ``fire.requests`` and move the watermark, only if it is ``fire.expected``.

        Returns:
            The enqueue results in request order; ``None``, writing nothing, when the stored
            watermark is not ``fire.expected``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID``, writing nothing, for an empty
                task name, a naive instant, an occurrence not after ``fire.expected``, a
                ``fire.watermark`` before the occurrence, or a request the enqueue refuses.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        task = _task_name(fire.task)
        occurrence = _forward(task, fire.expected, fire.occurrence, "occurrence")
        watermark = occurrence if fire.watermark is None else aware(fire.watermark, "watermark")
        if watermark < occurrence:
            raise DriverRequestInvalidError(
                f"task {task!r}: the watermark {watermark.isoformat()} is before the occurrence "
                f"{occurrence.isoformat()} it fires",
                task=task,
            )
        request_arrays(fire.requests)
        async with self._db.connection() as conn, conn.transaction():
            moved = await self._db.value(
                "watermark_move",
                {"task": task, "expected": fire.expected, "to": watermark},
                conn,
            )
            if not moved:
                return None
            results = await self._enqueue_on(conn, fire.requests) if fire.requests else []
            await self._db.rows(
                "task_fire_record",
                {
                    "task": task,
                    "occurrence": occurrence,
                    "watermark": watermark,
                    "job_ids": [result.id for result in results],
                    "cron": fire.cron,
                    "tz": fire.tz,
                },
                conn,
            )
            return results

    async def advance(self, task: str, expected: datetime | None, to: datetime) -> bool:
        """Move ``task``'s watermark to ``to`` without firing, only if it is ``expected``.

        Returns:
            ``True`` when moved; ``False``, writing nothing, when it is not ``expected``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name, a
                naive ``to``, or a ``to`` not after ``expected``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        name = _task_name(task)
        moved = _forward(name, expected, to, "to")
        return bool(
            await self._db.value(
                "watermark_move", {"task": name, "expected": expected, "to": moved}
            )
        )

    async def task_fires(self) -> list[TaskFireRecord]:
        """Answer the last fire of every task that ever fired, sorted by task name.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return [
            TaskFireRecord(
                task=row[0],
                occurrence=utc(row[1]),
                watermark=utc(row[2]),
                fired_at=utc(row[3]),
                job_ids=tuple(row[4]),
                cron=row[5],
                tz=row[6],
            )
            for row in await self._db.rows("task_fires", {})
        ]

    async def paused_tasks(self) -> list[str]:
        """Answer the paused tasks, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return [row[0] for row in await self._db.rows("paused_tasks", {})]

    async def pause_task(self, task: str) -> None:
        """Stop dispatching ``task`` (pausing twice is fine).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("pause_task", {"task": _task_name(task)})

    async def resume_task(self, task: str) -> None:
        """Dispatch ``task`` again; its catch-up policy decides what it missed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty task name.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("resume_task", {"task": _task_name(task)})


class PgLeaderLease:
    """A leader lease: one ``scheduler_leader`` row with a holder and an expiry on ``now()``.

    Args:
        db: the driver's connection plumbing.
        name: the lease's row (``scheduler``; the outbox's relay lease is ``outbox-relay``).
    """

    def __init__(self, db: Db, name: str = "scheduler") -> None:
        self._db = db
        self._name = name

    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """Take the lease for ``holder`` until now plus ``ttl_ms``, or renew it.

        Returns:
            ``True`` when ``holder`` holds it now; ``False`` when another holder's lease is
            unexpired.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty holder or
                ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if not isinstance(holder, str) or not holder or ttl_ms < 1:
            raise DriverRequestInvalidError(
                "the leader lease needs a non-empty holder and ttl_ms >= 1", ttl_ms=ttl_ms
            )
        held = await self._db.row(
            "leader_acquire",
            {"name": self._name, "holder": text_value(holder, "holder"), "ttl_ms": ttl_ms},
        )
        return held is not None

    async def release(self, holder: str) -> None:
        """Free the lease if ``holder`` holds it (nothing happens otherwise).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("leader_release", {"name": self._name, "holder": holder})

    async def holder(self) -> str | None:
        """Answer the unexpired holder, or ``None``.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        found: str | None = await self._db.value("leader_holder", {"name": self._name})
        return found


class PgWorkerRegistry:
    """Live workers; a row expires ``ttl_ms`` after its last beat.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def beat(self, info: WorkerInfo, ttl_ms: int) -> None:
        """Insert or replace ``info.id``'s row, expiring ``ttl_ms`` after now.

        The stored ``last_heartbeat`` is the database's now; ``in_flight`` is cut to 100 ids.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for ``ttl_ms`` below 1.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if ttl_ms < 1:
            raise DriverRequestInvalidError("a worker row needs ttl_ms >= 1", ttl_ms=ttl_ms)
        await self._db.rows(
            "worker_beat",
            {
                "id": text_value(info.id, "id"),
                "host": text_value(info.host, "host"),
                "build": text_value(info.build, "build"),
                "started_at": aware(info.started_at, "started_at"),
                "queues": list(info.queues),
                "slots": info.slots,
                "in_flight": list(info.in_flight[:100]),
                "draining_at": None
                if info.draining_at is None
                else aware(info.draining_at, "draining_at"),
                "ttl_ms": ttl_ms,
            },
        )

    async def remove(self, worker_id: str) -> None:
        """Delete a worker's row (nothing happens if it has none).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        await self._db.rows("worker_remove", {"id": worker_id})

    # Last in the class: inside this class body ``list`` names this method.
    async def list(self) -> builtins.list[WorkerInfo]:
        """Answer the unexpired rows sorted by id.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        return [
            WorkerInfo(
                id=row[0],
                host=row[1],
                build=row[2],
                started_at=utc(row[3]),
                queues=tuple(row[4]),
                slots=row[5],
                in_flight=tuple(row[6]),
                last_heartbeat=utc(row[7]),
                draining_at=None if row[8] is None else utc(row[8]),
            )
            for row in await self._db.rows("workers", {})
        ]


class PgCounterStore:
    """Per-job outcome counters: 1-minute buckets kept 24 h, 5-minute 7 d, 1-hour 30 d.

    Settles add to the current 1-minute bucket in the settle statement itself, on a shard chosen
    by the connection (so settles on different connections never wait on one row); reads sum the
    shards. Buckets are aligned on the Unix epoch.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def counters(self, name: str, since: datetime) -> list[CounterBucket]:
        """Answer ``name``'s buckets that end after ``since``, oldest first (the newest 4,176).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        rows = await self._db.rows(
            "counters",
            {"name": name, "since": aware(since, "since"), "limit": MAX_COUNTER_ROWS},
        )
        return [
            CounterBucket(
                name=name,
                tier=row[0],
                bucket=utc(row[1]),
                done=int(row[2]),
                retried=int(row[3]),
                failed=int(row[4]),
                dead=int(row[5]),
                duration_ms=float(row[6]),
            )
            for row in rows
        ]

    async def totals(self, since: datetime) -> dict[str, CounterBucket]:
        """Answer, per job name with a bucket ending after ``since``, the sum of those buckets.

        Each total's ``bucket`` is ``since`` and its ``tier`` the coarsest tier summed.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        start = aware(since, "since")
        return {
            row[0]: CounterBucket(
                name=row[0],
                tier=row[6],
                bucket=start,
                done=int(row[1]),
                retried=int(row[2]),
                failed=int(row[3]),
                dead=int(row[4]),
                duration_ms=float(row[5]),
            )
            for row in await self._db.rows("counter_totals", {"since": start})
        }

    async def rollup(self) -> int:
        """Fold aged buckets into the next tier and drop expired hour buckets.

        A bucket ages once its whole parent bucket ended more than its tier's retention ago; one
        call catches up however long it was since the last (the tiers fold in order).

        Returns:
            How many buckets were folded or dropped.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        changed = 0
        for tier, parent, parent_s, kept_s in _TIERS:
            changed += int(
                await self._db.value(
                    "counter_fold",
                    {"tier": tier, "parent": parent, "parent_s": parent_s, "kept_s": kept_s},
                )
            )
        return changed
