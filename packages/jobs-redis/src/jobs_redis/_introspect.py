"""The operator surface on Redis (the ``introspect`` capability): ``operate.lua`` and friends.

Design notes (the alternatives that were rejected):

* **One listing index per queue and state** (``<base>x:<queue>:<state>``), a sorted set whose
  scores are all 0 and whose members are ``<created µs, 16 digits>:<id>``. Lexicographic order is
  then exactly the listing order ``(created_at, id)`` (a UUID's lowercase text sorts as its
  integer), so a cursor is an exclusive ``ZRANGE … BYLEX`` bound and ``created_from``/
  ``created_to`` are bounds too. Scoring by ``created_at`` was rejected: the rows of one
  ``enqueue_many`` share a microsecond, and a score range cannot start inside a tie. Per-state
  and per-queue sets on their own were rejected: a row in four sets costs four entries, and a
  ``--state dead --queue q`` listing is one set here.
* **The index moves in the script that moves the state** (enqueue, claim, ack, nack, cancel,
  retention and ``operate.lua`` itself), so no reader sees a row in a set of another state. A
  ``done`` row that its ``done_ttl`` expired leaves its member behind: ``ack.lua`` drops the oldest
  such members of each queue it settles in, and a walk drops any it meets.
* **Walks are bounded per call** (:data:`WALK_BUDGET` members): a filter on ``name`` or
  ``tenant_id`` reads rows, and one script call over a million of them would stall the server for
  everyone. The Python side calls again from where the last call stopped.
"""

from __future__ import annotations

import base64
import builtins
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from uuid import UUID

from jobs_core.driver import StepResolution
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
from jobs_core.types import (
    BULK_LIMIT,
    MAX_JOB_PAGE,
    BulkResult,
    Fence,
    JobFilter,
    JobInfo,
    JobPage,
    JobState,
    JSONValue,
    StepRecord,
)
from jobs_redis._codec import encode, from_us, opt, to_us, unopt
from jobs_redis._records import decode_record, decode_steps, pairs, record_text

if TYPE_CHECKING:
    from jobs_redis._driver import _Shared

WALK_BUDGET = 10_000
"""The most index members one ``operate.lua`` walk looks at per call."""

_CURSOR = re.compile(r"rds1\|(\d{16}:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


def _cursor(member: str) -> str:
    """Encode an index member as an opaque cursor."""
    return base64.urlsafe_b64encode(f"rds1|{member}".encode("ascii")).decode("ascii").rstrip("=")


def _member(cursor: str) -> str:
    """Decode a cursor from :func:`_cursor` into its index member.

    Raises:
        JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for anything this driver did not issue.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
    except ValueError:
        raw = ""
    found = _CURSOR.fullmatch(raw)
    if found is None:
        raise JobPageInvalidError(
            "the cursor was not issued by this listing; pass back a page's next or prev",
            driver="redis",
        )
    return found[1]


def _stamp(us: int) -> str:
    """Answer an instant (µs) as the 16-digit text index members start with (clamped at 0)."""
    return f"{max(us, 0):016d}"


def _row_member(row: JobInfo) -> str:
    return f"{_stamp(to_us(row.created_at, 'created_at'))}:{row.id}"


def _job_info(row: dict[str, str], steps: list[StepRecord]) -> JobInfo:
    """Decode a row hash (and its steps) as the operator surface shows it."""
    return JobInfo(
        id=UUID(row["id"]),
        run_id=UUID(row["run"]),
        name=row["name"],
        queue=row["queue"],
        state=JobState(row["state"]),
        attempt=int(row["att"]),
        max_attempts=int(row["max"]),
        claim=int(row["claim"]),
        tenant_id=unopt(row["tenant"]),
        idempotency_key=row["key"],
        input=json.loads(row["input"]),
        run_at=from_us(row["run_at"]),
        created_at=from_us(row["created"]),
        updated_at=from_us(row["updated"]),
        claimed_by=unopt(row["by"]),
        last_error=unopt(row["err"]),
        last_error_code=unopt(row["errc"]),
        last_error_stack=unopt(row["errs"]),
        result=json.loads(row["result"]),
        enqueued_by=unopt(row["eb"]),
        traceparent=unopt(row["tp"]),
        progress=json.loads(row.get("prog", "null")),
        steps=tuple(steps),
        priority=int(row.get("pri") or 0),
        parent_run_id=UUID(row["par"][1:]) if row.get("par") else None,
    )


class RedisChildJobs:
    """The Redis :class:`~jobs_core.driver.ChildJobs`: each parent run's children in a sorted set.

    An enqueue carrying ``parent_run_id`` adds the row to ``<base>c:<parent run id>`` in the same
    script (``enqueue.lua``); ``children.lua`` reads the rows and drops members whose row is gone.

    Args:
        shared: the driver's connection and key names.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    async def children(self, run_id: UUID, ids: Sequence[UUID] | None = None) -> list[JobInfo]:
        """Answer run ``run_id``'s child rows (only ``ids`` when given), in enqueue order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        if ids is not None and not ids:
            return []
        base = self._s.keys.base
        args = [base, *(str(i) for i in ids or ())]
        rows = await self._s.run("children", [f"{base}c:{run_id}"], args)
        return [_job_info(pairs(row), []) for row in rows]


class RedisIntrospector:
    """The Redis :class:`~jobs_core.driver.Introspector`: the operator surface over the index.

    Listings and bulk calls walk the listing index (one sorted set per queue and state, members
    ``<created µs>:<id>``, kept by the same scripts that change a row's state), never ``KEYS`` or
    ``SCAN``. Each script call looks at most :data:`WALK_BUDGET` index members, so a filter that
    matches few rows of a large set takes several short calls rather than one long one.

    Args:
        shared: the driver's connection and keys.
    """

    def __init__(self, shared: _Shared) -> None:
        """Serve ``shared`` (the arguments are described in the class docstring)."""
        self._s = shared

    async def _read(self, job_id: UUID) -> tuple[dict[str, str], dict[str, str]] | None:
        found = await self._s.run("get", [self._s.keys.job(job_id)], [self._s.keys.base])
        if not found:
            return None
        return pairs(found[0]), pairs(found[1])

    async def get(self, job_id: UUID) -> JobInfo | None:
        """Answer one job with its step trace (in ``seq`` order), or ``None`` for an unknown id.

        ``state`` is the stored state (a ``delayed`` row whose ``run_at`` passed shows
        ``delayed`` until claimed); ``attempt`` is the attempts spent so far. A ``done`` row is
        unknown once ``done_ttl`` passed.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        found = await self._read(job_id)
        if found is None:
            return None
        row, steps = found
        return _job_info(row, decode_steps(steps))

    async def cancel(self, job_id: UUID, reason: str) -> JobInfo:
        """Cancel a live job: it is ``cancelled`` now and frees its idempotency key.

        A running row's next ack, nack, heartbeat or step write answers ``False``, so the worker
        fires the body's cancel signal. ``last_error`` becomes ``reason`` and
        ``last_error_code`` ``X_JOB_CANCELLED``.

        Returns:
            The cancelled job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotCancellableError: ``X_JOB_NOT_CANCELLABLE`` for a finished row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        answer = await self._s.run(
            "cancel",
            [self._s.keys.job(job_id)],
            [self._s.keys.base, opt(reason), opt(JobCancelledError.code)],
        )
        if answer == "missing":
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        if answer != "ok":
            raise JobNotCancellableError(
                f"job {job_id} already finished ({answer})", job_id=str(job_id), state=answer
            )
        info = await self.get(job_id)
        if info is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        return info

    async def resolve_step(self, job_id: UUID, step: str, resolution: StepResolution) -> None:
        """Settle a ``once`` step left ``started``: ``ran`` completes it, else it is deleted.

        A completed step gets ``resolution.output`` and ``completed_at`` the server's now; a
        deleted step leaves the other steps' ``seq`` unchanged, so the next attempt runs it again.
        The write is a compare-and-set on the record read, so a concurrent change is refused.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            StepNotResolvableError: ``X_STEP_NOT_RESOLVABLE`` unless the step is a ``once`` step
                in ``started``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an output that is not
                JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        output = encode(resolution.output, "step output")
        found = await self._read(job_id)
        if found is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        steps = found[1]
        seen = steps.get("r:" + step)
        status = steps.get("k:" + step)
        if seen is None or status != "started!":
            raise StepNotResolvableError(
                f"step {step!r} of job {job_id} is not a once step left started",
                job_id=str(job_id),
                step=step,
                status=None if status is None else status.rstrip("!"),
            )
        text = ""
        if resolution.ran:
            old = decode_record(step, seen, 0)
            done = replace(old, status="completed", completed_at=await self._s.now())
            text = record_text(done, output, None if old.match is None else json.dumps(old.match))
        answer = await self._s.run(
            "resolve_step", [self._s.keys.job(job_id)], [self._s.keys.base, step, seen, text]
        )
        if answer == "missing":
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        if answer != "ok":
            raise StepNotResolvableError(
                f"step {step!r} of job {job_id} changed while it was being resolved",
                job_id=str(job_id),
                step=step,
            )

    async def pause_queue(self, queue: str) -> None:
        """Stop every claim from ``queue`` from its next call on; enqueues still land.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._s.run("pause", [self._s.keys.paused], [queue])

    async def resume_queue(self, queue: str) -> None:
        """Let claims take rows from ``queue`` again, and wake subscribers for it.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._s.run("resume", [self._s.keys.paused], [queue, self._s.keys.wake])

    async def paused_queues(self) -> builtins.list[str]:
        """Answer the paused queues, sorted.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        members = await self._s.conn.call(lambda client: client.smembers(self._s.keys.paused))
        return sorted(str(m) for m in members)

    async def record_progress(self, job_id: UUID, fence: Fence, progress: JSONValue) -> bool:
        """Store a running job's progress (JSON); fenced like an ack.

        Returns:
            ``True`` when stored; ``False`` when the row is not ``running`` under ``fence``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a value that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        text = encode(progress, "progress")
        args = [fence.worker_id, str(fence.claim), text]
        return bool(await self._s.run("progress", [self._s.keys.job(job_id)], args))

    async def _one(self, op: str, job_id: UUID, from_step: str | None = None) -> str:
        answer = str(
            await self._s.run(
                "operate",
                [self._s.keys.queues],
                [self._s.keys.base, "one", op, str(job_id), from_step or ""],
            )
        )
        ids = {"job_id": str(job_id)}
        if answer == "missing":
            raise JobNotFoundError(f"no job has id {job_id}", **ids)
        if answer.startswith("live:"):
            state = answer[5:]
            raise JobNotRequeueableError(
                f"job {job_id} is still live ({state}); cancel it first to requeue it",
                state=state,
                **ids,
            )
        if answer.startswith("dup:"):
            raise JobDuplicateError(
                f"job {answer[4:]} is live with the same key; cancel or finish it first",
                holder=answer[4:],
                **ids,
            )
        if answer == "nostep":
            raise DriverRequestInvalidError(
                f"job {job_id} has no step named {from_step!r}", step=from_step, **ids
            )
        if answer == "running":
            raise JobNotRemovableError(f"job {job_id} is running; cancel it first", **ids)
        if answer.startswith("waiting:"):
            raise JobNotPromotableError(
                f"job {job_id} is not waiting on run_at ({answer[8:]})", state=answer[8:], **ids
            )
        return answer

    async def _info(self, job_id: UUID) -> JobInfo:
        info = await self.get(job_id)
        if info is None:
            raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
        return info

    async def requeue(self, job_id: UUID, from_step: str | None = None) -> JobInfo:
        """Queue a finished job again: ``ready`` now, ``attempt`` 0, same run and claim ordinal.

        Its result and progress are cleared, its last error kept; a ``done`` row stops expiring.
        Without ``from_step`` every step record is kept; with it, that step and every later one
        (by ``seq``) are deleted in the same script as the state change.

        Returns:
            The requeued job, with its remaining steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a ``from_step`` the run
                has no record of (nothing changes).
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._one("requeue", job_id, from_step)
        return await self._info(job_id)

    async def remove(self, job_id: UUID) -> None:
        """Delete a job that is not running, with its run's steps; a live one frees its key.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotRemovableError: ``X_JOB_NOT_REMOVABLE`` for a ``running`` row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._one("remove", job_id)

    async def promote(self, job_id: UUID) -> JobInfo:
        """Make a ``delayed`` or ``suspended`` row whose ``run_at`` is ahead due now.

        A ``delayed`` row becomes ``ready``; a ``suspended`` one stays ``suspended`` and is
        claimed at once.

        Returns:
            The promoted job, with its steps.

        Raises:
            JobNotFoundError: ``X_JOB_NOT_FOUND``.
            JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` for any other row.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        await self._one("promote", job_id)
        return await self._info(job_id)

    @staticmethod
    def _filters(flt: JobFilter) -> tuple[str, str, str, str, str, str, str]:
        """Answer ``(older-from, older-stop, newer-from, newer-stop, name, tenant, prefix)``.

        The bounds are ``ZRANGE BYLEX`` bounds from ``created_from``/``created_to`` alone.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive instant.
        """
        hi = "+" if flt.created_to is None else "(" + _stamp(to_us(flt.created_to, "created_to"))
        lo = (
            "-"
            if flt.created_from is None
            else "[" + _stamp(to_us(flt.created_from, "created_from"))
        )
        name = "" if flt.name is None else "=" + flt.name
        return hi, lo, lo, hi, name, opt(flt.tenant_id), (flt.id_prefix or "").lower()

    async def _walk(
        self, op: str, flt: JobFilter, older: bool, start: str, stop: str, want: int
    ) -> Any:
        """Walk the index from ``start`` to ``stop`` until ``want`` rows are found or it ends.

        Returns:
            The rows found (``op`` ``list``: one flat HGETALL reply each) or the count of rows
            matched or changed (the other ops).
        """
        _, _, _, _, name, tenant, prefix = self._filters(flt)
        rows: list[Any] = []
        total = 0
        while True:
            found, resume = await self._s.run(
                "operate",
                [self._s.keys.queues],
                [
                    self._s.keys.base,
                    "walk",
                    op,
                    "older" if older else "newer",
                    start,
                    stop,
                    flt.queue or "",
                    "" if flt.state is None else str(flt.state),
                    name,
                    tenant,
                    prefix,
                    want - (len(rows) if op == "list" else total),
                    WALK_BUDGET,
                ],
            )
            if op == "list":
                rows.extend(found)
            else:
                total += int(found)
            if not resume:
                return rows if op == "list" else total
            start = resume

    async def _bulk(self, op: str, flt: JobFilter) -> BulkResult:
        hi, lo, _, _, _, _, _ = self._filters(flt)
        affected = int(await self._walk(op, flt, True, hi, lo, BULK_LIMIT))
        remaining = int(await self._walk("count:" + op, flt, True, hi, lo, 2**53))
        return BulkResult(affected=affected, remaining=remaining)

    async def requeue_many(self, flt: JobFilter) -> BulkResult:
        """Requeue up to ``BULK_LIMIT`` finished rows matching ``flt``, newest first.

        Each as :meth:`requeue` without ``from_step``; a row whose key a live row holds stays and
        is not counted in ``remaining``. ``flt.limit``, ``flt.after`` and ``flt.before`` are
        ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._bulk("requeue", flt)

    async def remove_many(self, flt: JobFilter) -> BulkResult:
        """Remove up to ``BULK_LIMIT`` rows matching ``flt`` that are not running, newest first.

        As :meth:`remove` for each; ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._bulk("remove", flt)

    async def promote_many(self, flt: JobFilter) -> BulkResult:
        """Promote up to ``BULK_LIMIT`` waiting rows matching ``flt``, newest first.

        As :meth:`promote` for each; ``flt.limit``, ``flt.after`` and ``flt.before`` are ignored.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        return await self._bulk("promote", flt)

    # Last in the class: inside this class body ``list`` names this method.
    async def list(self, flt: JobFilter) -> JobPage:
        """Answer one page of jobs, newest first by ``(created_at, id)``, without step traces.

        Filters combine with AND; ``id_prefix`` is compared with the id's lowercase text and
        ``created_to`` is exclusive. ``after=`` answers rows older than the cursor's position and
        ``before=`` rows newer than it (the page is still newest first). A cursor is a position,
        not a row, so it stays valid whatever happens to the row it came from.

        Returns:
            The page; ``next`` is the last row's cursor when older rows match, ``prev`` the first
            row's cursor when newer rows match (both ``None`` for an empty page).

        Raises:
            JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for ``limit`` outside 1..200, a cursor
                this driver did not issue, or both ``after`` and ``before``.
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive
                ``created_from``/``created_to``.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        limit = flt.limit
        if not 1 <= limit <= MAX_JOB_PAGE:
            raise JobPageInvalidError(
                f"limit must be 1..{MAX_JOB_PAGE}, got {limit}", limit=limit, max=MAX_JOB_PAGE
            )
        if flt.after is not None and flt.before is not None:
            raise JobPageInvalidError("pass after= or before=, not both")
        after = None if flt.after is None else _member(flt.after)
        before = None if flt.before is None else _member(flt.before)
        old_from, old_stop, new_from, new_stop, _, _, _ = self._filters(flt)

        def older_than(member: str) -> str:
            bound = "(" + member
            return bound if old_from == "+" or bound < old_from else old_from

        def newer_than(member: str) -> str:
            bound = "(" + member
            return bound if new_from == "-" or member >= new_from[1:] else new_from

        async def rows(older: bool, start: str, stop: str, want: int) -> builtins.list[JobInfo]:
            found = await self._walk("list", flt, older, start, stop, want)
            return [_job_info(pairs(flat), []) for flat in found]

        if before is not None:
            found = await rows(False, newer_than(before), new_stop, limit + 1)
            more_newer = len(found) > limit
            page = found[:limit][::-1]
            more_older = bool(page) and bool(
                await rows(True, older_than(_row_member(page[-1])), old_stop, 1)
            )
        else:
            start = old_from if after is None else older_than(after)
            found = await rows(True, start, old_stop, limit + 1)
            more_older = len(found) > limit
            page = found[:limit]
            more_newer = (
                after is not None
                and bool(page)
                and bool(await rows(False, newer_than(_row_member(page[0])), new_stop, 1))
            )
        return JobPage(
            rows=tuple(page),
            next=_cursor(_row_member(page[-1])) if more_older else None,
            prev=_cursor(_row_member(page[0])) if more_newer else None,
        )
