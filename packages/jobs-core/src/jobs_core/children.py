"""Child jobs: ``step.invoke`` and ``step.gather`` start other jobs and wait for their results.

A parent's step enqueues its children with ids derived from the parent's run id, the step name
and the child's position (:func:`child_ids`), and an idempotency key derived the same way
(:func:`child_key`), so a replay of the step meets the rows it already queued and never enqueues
twice. The step then writes a ``waiting`` record for the :data:`CHILD_SETTLED` event matching its
run, reads its children's rows and, while one is live, parks the run like an event wait: the row
is handed back ``suspended`` (no worker slot held) until the long backstop.

A child's settle wakes it: the worker that settles a row carrying ``parent_run_id`` publishes
:data:`CHILD_SETTLED` (:func:`publish_settled`), and a bus that wakes waiters makes the parked
parent due in the same statement, so pg and redis never poll. The woken parent replays to the
step, reads the rows again (the rows, not the events, are the truth: a publish lost to a crash
between the settle and the publish only costs the backstop), and completes the step with the
results once every child is ``done``, or fails it with
:class:`~jobs_core.errors.ChildJobFailedError`.

Cancelling a parent cancels its live children (``cancel_children=True``, the default), through
:func:`cancel_children_of`, which :func:`jobs_core.introspect.cancel` calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid5

from jobs_core import faults
from jobs_core.driver import ChildJobs, EventBus, Introspector, JobDriver, PublishRequest
from jobs_core.errors import (
    ChildJobFailedError,
    JobNotCancellableError,
    JobNotFoundError,
    JobOptionsInvalidError,
    JobsError,
    NotImplementedByDriverError,
)
from jobs_core.types import (
    DEFAULT_EVENT_POLL_MS,
    WAKING_EVENT_POLL_MS,
    JobInfo,
    JobState,
    JSONValue,
    StepRecord,
)

if TYPE_CHECKING:
    from jobs_core.job import JobHandle
    from jobs_core.steps import StepRunner

CHILD_SETTLED = "jobs.child.settled"
"""The event a child's settle publishes; payload ``{"parent_run_id", "job_id", "state"}``."""

CHILD_SETTLED_TTL_MS = 24 * 3_600_000
"""How long a settle event stays matchable (it only wakes the parent; the row holds the result)."""

SETTLED: frozenset[JobState] = frozenset(
    {JobState.DONE, JobState.FAILED, JobState.DEAD, JobState.CANCELLED}
)
"""The states in which a child has ended."""

ENQUEUE_OPTIONS: frozenset[str] = frozenset({"run_at", "delay", "queue", "tenant_id"})
"""The enqueue options ``invoke``/``gather`` pass on to the children's requests."""

_log = logging.getLogger("jobs.children")


@dataclass(frozen=True, slots=True)
class Children:
    """What a run needs to start and await children: the driver and its stores.

    Attributes:
        driver: the driver the children are enqueued on.
        store: its ``children`` capability.
        bus: its event bus (the wake).
        introspect: its operator surface (``fail_fast`` cancels live siblings through it).
    """

    driver: JobDriver
    store: ChildJobs
    bus: EventBus
    introspect: Introspector | None


def child_ids(run_id: UUID, step: str, index: int) -> tuple[UUID, UUID]:
    """Answer the ``(job id, run id)`` of child ``index`` of ``step`` in run ``run_id``.

    Derived (UUID5 in the run's namespace), so every replay of the step names the same rows.
    """
    return uuid5(run_id, f"child:{step}#{index}"), uuid5(run_id, f"child-run:{step}#{index}")


def child_key(run_id: UUID, step: str, index: int) -> str:
    """Answer the idempotency key of child ``index`` of ``step`` in run ``run_id``."""
    return f"child:{run_id}:{step}#{index}"


def _failure(step: str, index: int, child_id: UUID, row: JobInfo | None) -> ChildJobFailedError:
    if row is None:
        return ChildJobFailedError(
            f"step {step!r}: child #{index} ({child_id}) is gone (removed before it settled)",
            child_code=JobNotFoundError.code,
            step=step,
            child=str(child_id),
            child_state=None,
        )
    code = row.last_error_code
    if row.state is JobState.CANCELLED and code is None:
        code = "X_JOB_CANCELLED"
    why = f"{code}: {row.last_error}" if code else (row.last_error or "no error recorded")
    return ChildJobFailedError(
        f"step {step!r}: child #{index} {row.name} ({row.id}) ended {row.state}: {why}"[:2_000],
        child_code=code,
        step=step,
        child=str(row.id),
        child_state=str(row.state),
    )


async def await_children(
    runner: StepRunner,
    name: str,
    calls: Sequence[tuple[JobHandle[Any, Any], Any]],
    *,
    single: bool,
    fail_fast: bool,
    cancel_children: bool,
    options: Mapping[str, Any],
) -> JSONValue:
    """The body of ``step.invoke`` (``single``) and ``step.gather``; see :class:`StepRunner`."""
    from jobs_core.steps import UnwindReached

    runner._claim_name(name)
    record = runner._records.get(name)
    if record is not None and record.status == "completed":
        return record.output
    if runner.unwinding:
        raise UnwindReached(name)
    kids = runner._children
    if kids is None:
        raise NotImplementedByDriverError(
            f"step {name!r}: invoke/gather needs a driver with the 'children' and 'events' "
            "capabilities",
            step=name,
            capability="children",
        )
    unknown = sorted(set(options) - ENQUEUE_OPTIONS)
    if unknown:
        raise JobOptionsInvalidError(
            f"step {name!r}: {', '.join(unknown)} cannot be passed to a child enqueue (ids, run "
            "ids and keys are derived from the parent); accepted: "
            + ", ".join(sorted(ENQUEUE_OPTIONS)),
            option=unknown[0],
            step=name,
        )
    run_id = runner._run_id
    ids = [child_ids(run_id, name, i) for i in range(len(calls))]
    now = await kids.bus.now()
    if record is None or record.status != "waiting":
        reqs = []
        for i, (handle, value) in enumerate(calls):
            job_id, child_run = ids[i]
            req = handle.build_request(value, job_id=job_id, run_id=child_run, **options)
            reqs.append(
                replace(req, idempotency_key=child_key(run_id, name, i), parent_run_id=run_id)
            )
        if faults.hooked():
            await runner._boundary("before", name)
        # Explicit ids: a replay (a crash after this enqueue) answers the same rows, deduped.
        if reqs:
            await kids.driver.enqueue_many(reqs)
        record = StepRecord(
            name,
            "waiting",
            started_at=now,
            event=CHILD_SETTLED,
            match={"parent_run_id": str(run_id)},
            output={
                "children": [str(job_id) for job_id, _ in ids],
                "cancel_children": cancel_children,
            },
        )
        await runner._write(record)
        if faults.hooked():
            await runner._boundary("persisted", name)
    rows = {row.id: row for row in await kids.store.children(run_id, [j for j, _ in ids])}
    failure: ChildJobFailedError | None = None
    live: list[UUID] = []
    for i, (job_id, _) in enumerate(ids):
        row = rows.get(job_id)
        if row is not None and row.state not in SETTLED:
            live.append(job_id)
        elif (row is None or row.state is not JobState.DONE) and failure is None:
            failure = _failure(name, i, job_id, row)
    if failure is not None and (fail_fast or not live):
        if live and cancel_children and kids.introspect is not None:
            await _cancel_all(kids, live, f"a sibling of step {name!r} failed")
        await runner._record_failure(name, record.attempts, failure.message, now)
        raise failure
    if live:
        poll = runner._event_poll_ms or (
            WAKING_EVENT_POLL_MS if kids.bus.wakes_waiters else DEFAULT_EVENT_POLL_MS
        )
        raise runner._suspend(now + timedelta(milliseconds=poll), name)
    results: list[JSONValue] = [rows[job_id].result for job_id, _ in ids]
    output: JSONValue = results[0] if single else results
    if faults.hooked():
        await runner._boundary("before", name)
    await runner._write(
        replace(record, status="completed", output=output, completed_at=await kids.bus.now())
    )
    if faults.hooked():
        await runner._boundary("persisted", name)
    return output


async def _cancel_all(kids: Children, ids: Sequence[UUID], reason: str) -> None:
    """Cancel the live rows ``ids`` and, through :func:`cancel_children_of`, their children."""
    assert kids.introspect is not None
    for job_id in ids:
        try:
            child = await kids.introspect.cancel(job_id, reason)
        except (JobNotCancellableError, JobNotFoundError):
            continue
        await cancel_children_of(kids.driver, child, reason)


async def publish_settled(bus: EventBus, parent_run_id: UUID, job_id: UUID, state: str) -> None:
    """Publish :data:`CHILD_SETTLED` for a child that ended, waking its parent.

    Never raises: a publish that fails is logged ``jobs.child.publish-failed``; the parent then
    finds the ended row at its backstop.
    """
    payload: JSONValue = {
        "parent_run_id": str(parent_run_id),
        "job_id": str(job_id),
        "state": state,
    }
    try:
        await bus.publish(PublishRequest(CHILD_SETTLED, payload, None, CHILD_SETTLED_TTL_MS))
    except Exception as exc:
        _log.warning(
            "jobs.child.publish-failed",
            extra={
                "event": "jobs.child.publish-failed",
                "job_id": str(job_id),
                "parent_run_id": str(parent_run_id),
                "error": f"{type(exc).__name__}: {exc}",
            },
        )


def waited_children(steps: Sequence[StepRecord], *, cancelling: bool = False) -> list[UUID]:
    """Answer the child job ids a run's step records wait for (or waited for), in step order.

    Args:
        steps: the run's step records.
        cancelling: only the children of steps declared ``cancel_children=True``.
    """
    found: list[UUID] = []
    for record in steps:
        if record.event != CHILD_SETTLED or not isinstance(record.output, dict):
            continue
        if cancelling and record.output.get("cancel_children") is not True:
            continue
        children = record.output.get("children")
        if isinstance(children, list):
            found.extend(UUID(str(c)) for c in children)
    return found


async def cancel_children_of(driver: JobDriver, parent: JobInfo, reason: str) -> list[UUID]:
    """Cancel the live children (and their live children) of a cancelled ``parent``.

    Only children of steps declared ``cancel_children=True`` (the default) are cancelled. A
    cancelled row that is itself a child wakes its own parent (:func:`publish_settled`).

    Returns:
        The ids of the rows cancelled here, parents before their children.
    """
    from jobs_core.driver import capability

    store: ChildJobs | None = capability(driver, "children")
    introspect: Introspector | None = capability(driver, "introspect")
    bus: EventBus | None = capability(driver, "events")
    cancelled: list[UUID] = []
    if bus is not None and parent.parent_run_id is not None:
        await publish_settled(bus, parent.parent_run_id, parent.id, str(parent.state))
    if store is None or introspect is None:
        return cancelled
    info = parent if parent.steps else await introspect.get(parent.id)
    if info is None:
        return cancelled
    ids = waited_children(info.steps, cancelling=True)
    if not ids:
        return cancelled
    for row in await store.children(info.run_id, ids):
        if row.state in SETTLED:
            continue
        try:
            child = await introspect.cancel(row.id, reason)
        except (JobNotCancellableError, JobNotFoundError):
            continue
        cancelled.append(child.id)
        try:
            cancelled.extend(await cancel_children_of(driver, child, reason))
        except JobsError as exc:
            _log.warning(
                "jobs.child.cancel-failed",
                extra={
                    "event": "jobs.child.cancel-failed",
                    "job_id": str(child.id),
                    "error": str(exc),
                },
            )
    return cancelled
