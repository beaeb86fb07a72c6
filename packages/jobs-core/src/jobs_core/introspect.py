"""The operator surface: jobs, queues, tasks, workers, counters and queue stats.

List, show, retry, cancel, remove and promote jobs; pause and resume queues and cron tasks; read
workers, counters and queue stats.

Every function takes a driver and reaches the store it needs through
:func:`~jobs_core.driver.require_capability`, so a driver without it answers
``X_NOT_IMPLEMENTED`` the same way everywhere. The ``jobsctl`` CLI is a thin layer over these
functions, and so is any admin page an application builds. Each change an operator makes is
logged (``jobs.operator.*``, with ids and never the payload).

Paging: a listing answers at most ``MAX_JOB_PAGE`` (200) rows, newest first, with ``next`` and
``prev`` cursors. Cursors are issued by the driver and opaque: pass one back as ``after=`` (older
rows) or ``before=`` (newer rows) to the same driver; anything else is ``X_JOB_PAGE_INVALID``. A
core ``job_cursor(row)`` computing one encoding for every backend was rejected: each driver pages
on its own index (a keyset on Postgres, a score on Redis) and must be free to encode that.

Redaction: what an operator sees of a job never shows a secret. :func:`redact_job` replaces with
``"[redacted]"`` every input field the job's declared input type marks sensitive (a pydantic
``SecretStr``/``SecretBytes``, or ``Field(json_schema_extra={"sensitive": True})``), at any depth
(nested models, lists, dicts, unions), and then every value, in the input, the result, the
progress and the step outputs, whose key is in ``redact_keys`` (default :data:`REDACT_KEYS`; keys
compare case-insensitively with ``-`` read as ``_``). A job whose declaration this process does
not know shows its input as ``"[redacted]"`` whole, and so does one whose input type has no JSON
schema to read the marks from. The marks are read from the JSON schema of the input type rather
than by walking model classes, so dataclasses, TypedDicts and generic containers are covered by
one walk.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import Enum
from typing import Any, TypedDict, Unpack
from uuid import UUID

from jobs_core.children import cancel_children_of
from jobs_core.driver import (
    ChildJobs,
    CounterStore,
    Introspector,
    JobDriver,
    SchedulerState,
    StepResolution,
    WorkerRegistry,
    capability,
    demand_when_busy,
    require_capability,
)
from jobs_core.errors import DriverRequestInvalidError, JobNotFoundError, JobNotRequeueableError
from jobs_core.job import REGISTRY, JobHandle, JobRegistry
from jobs_core.steps import COMPENSATE_PREFIX, UNWINDING
from jobs_core.types import (
    BulkResult,
    CounterBucket,
    JobFilter,
    JobInfo,
    JobPage,
    JobState,
    JSONValue,
    QueueStats,
    TaskFireRecord,
    WorkerInfo,
)

__all__ = [
    "REDACTED",
    "REDACT_KEYS",
    "JobQuery",
    "JobView",
    "QueueOverview",
    "TaskOverview",
    "as_json",
    "cancel",
    "children",
    "counter_totals",
    "counters",
    "get_job",
    "list_jobs",
    "pause_queue",
    "pause_task",
    "paused_queues",
    "paused_tasks",
    "promote",
    "promote_many",
    "redact_job",
    "remove",
    "remove_many",
    "requeue",
    "requeue_many",
    "resolve_step",
    "resume_queue",
    "resume_task",
    "rollup_counters",
    "stats",
    "tasks",
    "workers",
]

_log = logging.getLogger("jobs.operator")

REDACTED = "[redacted]"
"""What a masked value shows."""

REDACT_KEYS: frozenset[str] = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "client_secret",
        "token",
        "access_token",
        "refresh_token",
        "api_key",
        "apikey",
        "authorization",
        "private_key",
        "cookie",
        "card_number",
        "cvc",
        "cvv",
        "ssn",
    }
)
"""Keys whose values are masked wherever they appear, unless a caller passes its own set."""

_MAX_REF_HOPS = 32
"""How many ``$ref`` hops a schema walk follows in a row before it stops (no pydantic schema
comes close; it bounds a hand-written cyclic one)."""


class JobQuery(TypedDict, total=False):
    """The filters of a listing or a bulk call; every key is optional and they combine with AND.

    Attributes:
        queue: only this queue.
        name: only this job name.
        state: only this state (a :class:`~jobs_core.types.JobState` or its value).
        tenant_id: only this tenant.
        id_prefix: only ids whose text starts with this.
        created_from: created at or after (aware).
        created_to: created before (aware).
    """

    queue: str
    name: str
    state: JobState | str
    tenant_id: str
    id_prefix: str
    created_from: datetime
    created_to: datetime


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """One job as an operator may see it.

    Attributes:
        job: the row, its input, result, progress and step outputs redacted (see the module
            docstring).
        declared: whether this process knows the job's declaration; when not, the input shows
            ``"[redacted]"`` whole.
    """

    job: JobInfo
    declared: bool


@dataclasses.dataclass(frozen=True, slots=True)
class QueueOverview:
    """One queue's counts, demand and pause state.

    Attributes:
        stats: the driver's counts (``ready`` is due work, ``delayed`` waits on ``run_at``).
        demand: rows running under a live lease plus rows due and claimable.
        paused: whether workers skip the queue; ``None`` when the driver cannot say.
    """

    stats: QueueStats
    demand: int
    paused: bool | None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskOverview:
    """One cron task as the scheduler state knows it.

    Attributes:
        task: the task name.
        watermark: up to where its occurrences are settled (UTC), if it ever fired or advanced.
        last_fire: its last fire, if any.
        paused: whether the scheduler skips it.
    """

    task: str
    watermark: datetime | None
    last_fire: TaskFireRecord | None
    paused: bool


def _introspector(driver: JobDriver) -> Introspector:
    store: Introspector = require_capability(driver, "introspect")
    return store


def _job_id(job_id: UUID | str) -> UUID:
    """Answer ``job_id`` as a UUID.

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND`` for text that is not a UUID (no job has it).
    """
    if isinstance(job_id, UUID):
        return job_id
    try:
        return UUID(job_id)
    except (TypeError, ValueError):
        raise JobNotFoundError(
            f"no job has id {job_id!r}: not a job id", job_id=str(job_id)
        ) from None


def _filter(query: Mapping[str, Any], **paging: Any) -> JobFilter:
    """Build a :class:`~jobs_core.types.JobFilter` from a :class:`JobQuery` and paging fields.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown filter or state.
    """
    fields = dict(query)
    state = fields.get("state")
    if state is not None and not isinstance(state, JobState):
        try:
            fields["state"] = JobState(state)
        except ValueError:
            raise DriverRequestInvalidError(
                f"state must be one of {', '.join(s.value for s in JobState)}, got {state!r}",
                state=str(state),
            ) from None
    try:
        return JobFilter(**fields, **paging)
    except TypeError as exc:
        raise DriverRequestInvalidError(f"unknown job filter: {exc}") from None


def _logged(event: str, **fields: Any) -> None:
    _log.info(event, extra={"event": event, **fields})


# --- reading jobs ----------------------------------------------------------------------------


async def list_jobs(
    driver: JobDriver,
    *,
    limit: int = 100,
    after: str | None = None,
    before: str | None = None,
    registry: JobRegistry | None = None,
    redact_keys: Iterable[str] | None = None,
    **query: Unpack[JobQuery],
) -> JobPage:
    """Answer one page of jobs, newest first, inputs redacted as :func:`redact_job` does.

    Args:
        driver: any driver carrying ``introspect``.
        limit: rows per page, 1..200.
        after: a page's ``next`` cursor: the page of older rows.
        before: a page's ``prev`` cursor: the page of newer rows.
        registry: the declarations redaction reads (default: every declared job).
        redact_keys: keys masked anywhere (default :data:`REDACT_KEYS`).
        **query: the filters (:class:`JobQuery`).

    Returns:
        The page; rows carry no step traces. ``next``/``prev`` are ``None`` at either end.

    Raises:
        JobPageInvalidError: ``X_JOB_PAGE_INVALID`` for ``limit`` outside 1..200, both cursors,
            or a cursor this driver's listing did not issue.
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown filter or state.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    flt = _filter(query, limit=limit, after=after, before=before)
    page = await _introspector(driver).list(flt)
    rows = tuple(
        redact_job(row, registry=registry, redact_keys=redact_keys).job for row in page.rows
    )
    return dataclasses.replace(page, rows=rows)


async def get_job(
    driver: JobDriver,
    job_id: UUID | str,
    *,
    registry: JobRegistry | None = None,
    redact_keys: Iterable[str] | None = None,
) -> JobView:
    """Answer one job with its steps, progress, last error and stack, redacted.

    Args:
        driver: any driver carrying ``introspect``.
        job_id: the job id (a UUID or its text).
        registry: the declarations redaction reads (default: every declared job).
        redact_keys: keys masked anywhere (default :data:`REDACT_KEYS`).

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND`` for an unknown or malformed id.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    found = await _introspector(driver).get(_job_id(job_id))
    if found is None:
        raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
    return redact_job(found, registry=registry, redact_keys=redact_keys)


# --- changing jobs ---------------------------------------------------------------------------


async def requeue(
    driver: JobDriver, job_id: UUID | str, *, from_step: str | None = None
) -> JobInfo:
    """Queue a finished job (``dead``, ``cancelled``, ``done``, ``failed``) again, due now.

    The run keeps its id; ``attempt`` starts over. Without ``from_step`` every step record is
    kept (a replay answers them from storage); with it, that step and every later one are
    deleted in the same write, so the run replays from there.

    Returns:
        The requeued row (not redacted; pass it to :func:`redact_job` before showing it).

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND``.
        JobNotRequeueableError: ``X_JOB_NOT_REQUEUEABLE`` for a live row.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another live row holds its key.
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a step the run never wrote.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.

    A run that unwound stays unwound: requeued as it is, it replays to its unwinding, finds every
    compensator recorded and settles ``dead`` again. To run it afresh, requeue ``from_step`` the
    first step that was compensated (or an earlier one); a ``from_step`` after it is refused
    (``X_JOB_NOT_REQUEUEABLE``), because the steps it would keep were undone.
    """
    introspector = _introspector(driver)
    if from_step is not None:
        row = await introspector.get(_job_id(job_id))
        if row is not None:
            _check_unwound_from_step(row, from_step)
    requeued = await introspector.requeue(_job_id(job_id), from_step)
    _logged("jobs.operator.requeued", job_id=str(requeued.id), from_step=from_step)
    return requeued


def _check_unwound_from_step(row: JobInfo, from_step: str) -> None:
    seq = {step.name: step.seq for step in row.steps}
    if UNWINDING not in seq or from_step not in seq:
        return
    undone = [
        seq[name[len(COMPENSATE_PREFIX) :]]
        for name in seq
        if name.startswith(COMPENSATE_PREFIX) and name[len(COMPENSATE_PREFIX) :] in seq
    ]
    if undone and seq[from_step] > min(undone):
        first = next(name for name, at in seq.items() if at == min(undone))
        raise JobNotRequeueableError(
            f"steps before {from_step!r} were compensated when the run unwound; requeue from "
            f"{first!r} (or earlier) so they run again",
            job_id=str(row.id),
            from_step=from_step,
            earliest=first,
        )


async def cancel(
    driver: JobDriver, job_id: UUID | str, reason: str = "cancelled by an operator"
) -> JobInfo:
    """Stop a live job.

    A queued one is ``cancelled`` now; a running one too, and its body's cancel signal fires at
    the worker's next heartbeat. Its live child jobs (``step.invoke``/``step.gather`` declared
    ``cancel_children=True``, the default) are cancelled too, theirs in turn; a cancelled child
    wakes its parent, whose step then fails with the child's ``X_JOB_CANCELLED``.

    Returns:
        The cancelled row (not redacted).

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND``.
        JobNotCancellableError: ``X_JOB_NOT_CANCELLABLE`` for a finished row.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    cancelled = await _introspector(driver).cancel(_job_id(job_id), reason)
    _logged("jobs.operator.cancelled", job_id=str(cancelled.id))
    why = f"its parent {cancelled.id} was cancelled"
    cascaded = await cancel_children_of(driver, cancelled, why)
    if cascaded:
        _logged(
            "jobs.operator.cancelled-children",
            job_id=str(cancelled.id),
            children=[str(c) for c in cascaded],
        )
    return cancelled


async def children(
    driver: JobDriver,
    job_id: UUID | str,
    *,
    registry: JobRegistry | None = None,
    redact_keys: Iterable[str] | None = None,
) -> list[JobView]:
    """Answer the child jobs a job's run enqueued (``step.invoke``/``step.gather``), redacted.

    Oldest first, without step traces; empty for a job that started none.

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND`` for an unknown or malformed id.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect`` or
            ``children``.
    """
    found = await _introspector(driver).get(_job_id(job_id))
    if found is None:
        raise JobNotFoundError(f"no job has id {job_id}", job_id=str(job_id))
    store: ChildJobs = require_capability(driver, "children")
    rows = await store.children(found.run_id)
    return [redact_job(row, registry=registry, redact_keys=redact_keys) for row in rows]


async def remove(driver: JobDriver, job_id: UUID | str) -> None:
    """Delete a job that is not running, with its steps.

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND``.
        JobNotRemovableError: ``X_JOB_NOT_REMOVABLE`` for a running row (cancel it first).
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    uid = _job_id(job_id)
    await _introspector(driver).remove(uid)
    _logged("jobs.operator.removed", job_id=str(uid))


async def promote(driver: JobDriver, job_id: UUID | str) -> JobInfo:
    """Make a job waiting on ``run_at`` (``delayed`` or ``suspended``) due now.

    Returns:
        The promoted row (not redacted).

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND``.
        JobNotPromotableError: ``X_JOB_NOT_PROMOTABLE`` for a row that is due, running or
            finished.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    promoted = await _introspector(driver).promote(_job_id(job_id))
    _logged("jobs.operator.promoted", job_id=str(promoted.id))
    return promoted


async def requeue_many(driver: JobDriver, **query: Unpack[JobQuery]) -> BulkResult:
    """Requeue up to 1,000 finished jobs matching ``query`` (as :func:`requeue`, all steps kept).

    Rows whose key a live row holds stay and are not counted in ``remaining``, so calling until
    ``remaining`` is 0 terminates.

    Returns:
        ``affected`` (this call) and ``remaining`` (still matching and requeueable).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown filter or state.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    result = await _introspector(driver).requeue_many(_filter(query))
    _logged("jobs.operator.requeued-many", affected=result.affected, remaining=result.remaining)
    return result


async def remove_many(driver: JobDriver, **query: Unpack[JobQuery]) -> BulkResult:
    """Remove up to 1,000 jobs matching ``query`` that are not running.

    Returns:
        ``affected`` (this call) and ``remaining`` (still matching and removable).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown filter or state.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    result = await _introspector(driver).remove_many(_filter(query))
    _logged("jobs.operator.removed-many", affected=result.affected, remaining=result.remaining)
    return result


async def promote_many(driver: JobDriver, **query: Unpack[JobQuery]) -> BulkResult:
    """Make up to 1,000 jobs matching ``query`` that wait on ``run_at`` due now.

    Returns:
        ``affected`` (this call) and ``remaining`` (still matching and waiting).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an unknown filter or state.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    result = await _introspector(driver).promote_many(_filter(query))
    _logged("jobs.operator.promoted-many", affected=result.affected, remaining=result.remaining)
    return result


async def resolve_step(
    driver: JobDriver, job_id: UUID | str, step: str, *, ran: bool, output: JSONValue = None
) -> None:
    """Settle a ``once`` step whose outcome is unknown (``X_STEP_OUTCOME_UNKNOWN``).

    Args:
        driver: any driver carrying ``introspect``.
        job_id: the job.
        step: the step name.
        ran: whether its effect happened; ``True`` records it completed with ``output``,
            ``False`` deletes it so the next attempt runs it.
        output: the step's output in JSON form (when ``ran``).

    Raises:
        JobNotFoundError: ``X_JOB_NOT_FOUND``.
        StepNotResolvableError: ``X_STEP_NOT_RESOLVABLE`` unless it is a ``once`` step left
            ``started``.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    uid = _job_id(job_id)
    await _introspector(driver).resolve_step(uid, step, StepResolution(ran=ran, output=output))
    _logged("jobs.operator.step-resolved", job_id=str(uid), step=step, ran=ran)


# --- queues and tasks ------------------------------------------------------------------------


async def pause_queue(driver: JobDriver, queue: str) -> None:
    """Stop every worker claiming from ``queue`` from its next claim on; enqueues still land.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    await _introspector(driver).pause_queue(queue)
    _logged("jobs.operator.queue-paused", queue=queue)


async def resume_queue(driver: JobDriver, queue: str) -> None:
    """Let workers claim from ``queue`` again (idle workers are woken where the driver can).

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    await _introspector(driver).resume_queue(queue)
    _logged("jobs.operator.queue-resumed", queue=queue)


async def paused_queues(driver: JobDriver) -> list[str]:
    """Answer the paused queues, sorted.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``introspect``.
    """
    return await _introspector(driver).paused_queues()


def _scheduler_state(driver: JobDriver) -> SchedulerState:
    store: SchedulerState = require_capability(driver, "scheduler_state")
    return store


async def pause_task(driver: JobDriver, task: str) -> None:
    """Stop dispatching the cron task named ``task`` (its watermark stays where it is).

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``scheduler_state``.
    """
    await _scheduler_state(driver).pause_task(task)
    _logged("jobs.operator.task-paused", task=task)


async def resume_task(driver: JobDriver, task: str) -> None:
    """Dispatch ``task`` again; its catch-up policy decides what happens to missed occurrences.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``scheduler_state``.
    """
    await _scheduler_state(driver).resume_task(task)
    _logged("jobs.operator.task-resumed", task=task)


async def paused_tasks(driver: JobDriver) -> list[str]:
    """Answer the paused tasks, sorted.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``scheduler_state``.
    """
    return await _scheduler_state(driver).paused_tasks()


async def tasks(driver: JobDriver) -> list[TaskOverview]:
    """Answer every task the scheduler state knows (a watermark, a fire or a pause), by name.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``scheduler_state``.
    """
    state = _scheduler_state(driver)
    watermarks = await state.watermarks()
    fires = {fire.task: fire for fire in await state.task_fires()}
    paused = set(await state.paused_tasks())
    return [
        TaskOverview(
            task=name,
            watermark=watermarks.get(name),
            last_fire=fires.get(name),
            paused=name in paused,
        )
        for name in sorted(set(watermarks) | set(fires) | paused)
    ]


async def stats(driver: JobDriver) -> list[QueueOverview]:
    """Answer every queue's counts, demand and pause state, sorted by queue.

    A queue appears when it has rows or is paused. ``paused`` is ``None`` on a driver without
    ``introspect`` (counts and demand are part of every driver).
    """
    stats_rows = await driver.stats()
    counts = {s.queue: s for s in stats_rows}
    demand = await demand_when_busy(driver, stats_rows)
    introspect: Introspector | None = capability(driver, "introspect")
    paused = None if introspect is None else set(await introspect.paused_queues())
    names = sorted(set(counts) | set(demand) | (paused or set()))
    return [
        QueueOverview(
            stats=counts.get(name, QueueStats(queue=name)),
            demand=demand.get(name, 0),
            paused=None if paused is None else name in paused,
        )
        for name in names
    ]


# --- workers and counters --------------------------------------------------------------------


async def workers(driver: JobDriver) -> list[WorkerInfo]:
    """Answer the live workers (a row expires one visibility timeout after its last beat).

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``workers``.
    """
    registry: WorkerRegistry = require_capability(driver, "workers")
    return await registry.list()


def _counters(driver: JobDriver) -> CounterStore:
    store: CounterStore = require_capability(driver, "counters")
    return store


async def counters(driver: JobDriver, name: str, *, since: datetime) -> list[CounterBucket]:
    """Answer one job's outcome buckets from ``since`` (aware) on, oldest first.

    Recent history comes in 1-minute buckets, older in 5-minute and hour buckets (at most 4,176
    per job name).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``counters``.
    """
    return await _counters(driver).counters(name, since)


async def counter_totals(driver: JobDriver, *, since: datetime) -> dict[str, CounterBucket]:
    """Answer, per job name, the outcome sums from ``since`` (aware) on.

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a naive ``since``.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``counters``.
    """
    return await _counters(driver).totals(since)


async def rollup_counters(driver: JobDriver) -> int:
    """Fold aged counter buckets into coarser tiers and drop expired ones; answer how many.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` without ``counters``.
    """
    return await _counters(driver).rollup()


# --- redaction -------------------------------------------------------------------------------


def redact_job(
    job: JobInfo,
    *,
    registry: JobRegistry | None = None,
    redact_keys: Iterable[str] | None = None,
) -> JobView:
    """Answer ``job`` as an operator may see it (the rules are in the module docstring).

    Args:
        job: a row as a driver answered it.
        registry: the declarations whose input types mark sensitive fields (default: every
            declared job).
        redact_keys: keys masked anywhere (default :data:`REDACT_KEYS`).
    """
    keys = frozenset(_key(k) for k in (REDACT_KEYS if redact_keys is None else redact_keys))
    handle = (registry or REGISTRY).get(job.name)
    shown: JSONValue = REDACTED
    if handle is not None:
        masked = _mask_declared(job.input, handle)
        shown = REDACTED if masked is _UNREADABLE else _mask_keys(masked, keys)
    steps = tuple(
        dataclasses.replace(
            step,
            output=_mask_keys(step.output, keys),
            match=None if step.match is None else _mask_keys(dict(step.match), keys),
        )
        for step in job.steps
    )
    redacted = dataclasses.replace(
        job,
        input=shown,
        result=_mask_keys(job.result, keys),
        progress=_mask_keys(job.progress, keys),
        steps=steps,
    )
    return JobView(job=redacted, declared=handle is not None)


_UNREADABLE: Any = object()
"""What :func:`_mask_declared` answers when the input type yields no JSON schema."""


def _key(key: str) -> str:
    return key.lower().replace("-", "_")


def _mask_keys(value: JSONValue, keys: frozenset[str]) -> JSONValue:
    """Mask every value whose key is in ``keys``, at any depth."""
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _key(k) in keys else _mask_keys(v, keys)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_mask_keys(v, keys) for v in value]
    return value


def _mask_declared(value: JSONValue, handle: JobHandle[Any, Any]) -> JSONValue:
    """Mask what ``handle``'s input type marks sensitive, reading its JSON schemas.

    Both the field-name and the alias schema are walked, since the stored form uses one or the
    other depending on the model's ``serialize_by_alias``.
    """
    try:
        schemas = [
            handle.adapter.json_schema(mode="serialization", by_alias=by_alias)
            for by_alias in (False, True)
        ]
    except Exception:
        # No schema (an arbitrary type): nothing says which fields are safe to show.
        return _UNREADABLE
    for schema in schemas:
        value = _mask_schema(value, schema, schema.get("$defs", {}))
    return value


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow ``$ref`` to ``$defs`` (siblings of the reference override the target's keys)."""
    for _ in range(_MAX_REF_HOPS):
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            return schema
        target = defs.get(ref.removeprefix("#/$defs/"), {})
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _marked(schema: Mapping[str, Any]) -> bool:
    return schema.get("sensitive") is True or schema.get("writeOnly") is True


def _mask_schema(value: JSONValue, schema: Any, defs: Mapping[str, Any]) -> JSONValue:
    """Mask the parts of ``value`` that ``schema`` marks sensitive.

    A union's branches are all applied (a value is masked if any branch says so); ``null`` is
    shown as it is, since whether a secret was given is not itself a secret.
    """
    if value is None or not isinstance(schema, Mapping):
        return value
    schema = _resolve(schema, defs)
    if _marked(schema):
        return REDACTED
    for combinator in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(combinator, ()):
            value = _mask_schema(value, branch, defs)
            if value == REDACTED:
                return value
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {k: _mask_schema(v, properties.get(k, extra), defs) for k, v in value.items()}
    if isinstance(value, list):
        prefix = schema.get("prefixItems") or []
        items = schema.get("items")
        return [
            _mask_schema(v, prefix[i] if i < len(prefix) else items, defs)
            for i, v in enumerate(value)
        ]
    return value


# --- JSON ------------------------------------------------------------------------------------


def as_json(value: Any) -> JSONValue:
    """Answer the JSON form of an operator record (for ``--json`` and admin APIs).

    Dataclasses (``JobInfo``, ``JobPage``, ``JobView``, ``QueueOverview``, ``WorkerInfo``,
    ``CounterBucket``, ``BulkResult``, ...) become objects of their fields, datetimes ISO 8601
    text, UUIDs text, enums their value, tuples and sets lists.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return as_json(value.value)
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [as_json(v) for v in items]
    return value
