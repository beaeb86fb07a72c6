"""Declaring cron tasks: :func:`task`, the handle it answers, and :func:`next_task_run`.

A task names *when* (a cron expression in an IANA zone, resolved by
:class:`~jobs_core.cron.CronSchedule`) and *what* (``enqueue(occurrence)``, a synchronous, pure
function answering ``(job, input)`` pairs). The :class:`~jobs_core.scheduler.Scheduler` fires it;
this module only declares, describes and builds the requests one occurrence enqueues.

Every declaration problem is raised at declaration (import time), all at once, as for jobs.

The default name
----------------
The name is the durable key of the task's watermark and pause: set ``name=`` to pin it. Without
it, a task whose ``enqueue`` is a named function is named like a job, ``module.qualname`` of that
function; one whose ``enqueue`` is a lambda is named ``module:cron@tz`` (a lambda has no name of
its own), so editing the cron or zone of such a task starts it afresh, from "now".

Job ids of a scheduled fire
---------------------------
The requests of a scheduled occurrence carry job ids derived from ``(task, occurrence, entry
index)``: UUIDv7 values whose time is the occurrence and whose other bits hash the three. An
enqueue whose id names an existing row inserts nothing (``10-core.md`` §1), so even a fire that
somehow repeated would meet the first one's rows; this is the "unique on (schedule, instant)"
guard of FIELD-FAILURES C18, independent of the watermark's compare-and-set. A manual
:meth:`TaskHandle.enqueue` mints fresh ids: "run it now" is a new run.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias, get_args
from uuid import UUID

from jobs_core._current import call_driver, run_sync
from jobs_core.cron import CronSchedule
from jobs_core.errors import (
    EnqueueBatchTooLargeError,
    JobDeclarationInvalidError,
    JobDuplicateError,
)
from jobs_core.job import JobHandle
from jobs_core.types import MAX_ENQUEUE_BATCH, EnqueueRequest, EnqueueResult

__all__ = [
    "TASK_REGISTRY",
    "CatchUp",
    "TaskHandle",
    "TaskRegistry",
    "next_task_run",
    "task",
]

CatchUp: TypeAlias = Literal["skip", "run-once", "run-all"]
"""What a task fires for the occurrences it missed (downtime, a pause, a lost leadership)."""

Entry: TypeAlias = tuple[JobHandle[Any, Any], Any]
"""One ``(job, input)`` pair an occurrence enqueues."""

_log = logging.getLogger("jobs.task")

_NUL = "\x00"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_DESCRIBE_FROM = datetime(2000, 1, 1, tzinfo=UTC)
"""``describe`` reads the job names from the first occurrence after this fixed instant, so the
descriptor never depends on the clock."""


class TaskRegistry:
    """The tasks this process knows, by durable name."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._tasks: dict[str, TaskHandle] = {}

    def register(self, handle: TaskHandle) -> None:
        """Add ``handle``.

        Re-declaring from the same place (same ``enqueue`` function, file and line, as a module
        reload does) replaces the old handle.

        Raises:
            JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
        """
        existing = self._tasks.get(handle.name)
        if existing is not None and _origin(existing.enqueue_fn) != _origin(handle.enqueue_fn):
            raise JobDuplicateError(
                f"two tasks are named {handle.name!r}: {_origin(existing.enqueue_fn)[0]} and "
                f"{_origin(handle.enqueue_fn)[0]}; give one of them another name=",
                name=handle.name,
                kind="task",
            )
        self._tasks[handle.name] = handle

    def unregister(self, name: str) -> None:
        """Forget the task named ``name`` (no-op if unknown)."""
        self._tasks.pop(name, None)

    def get(self, name: str) -> TaskHandle | None:
        """Answer the task named ``name``, or ``None``."""
        return self._tasks.get(name)

    def all(self) -> list[TaskHandle]:
        """Answer every task, sorted by name."""
        return [self._tasks[name] for name in sorted(self._tasks)]


TASK_REGISTRY = TaskRegistry()
"""The process-wide registry every :func:`task` declaration joins."""


def _origin(fn: Callable[..., Any]) -> tuple[str, str, int]:
    code = getattr(fn, "__code__", None)
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
    return (where, code.co_filename if code else "", code.co_firstlineno if code else 0)


class TaskHandle:
    """A declared cron task: describe it, build an occurrence's requests, fire it by hand.

    Built by :func:`task`, which validates.

    Attributes:
        name: the durable name (key of the watermark and of a pause).
        cron: the cron expression.
        tz: the IANA zone it is evaluated in.
        catch_up: ``"skip"``, ``"run-once"`` or ``"run-all"``.
        max_catch_up: how many missed occurrences ``run-all`` fires per scheduler round.
        schedule: the resolver (:class:`~jobs_core.cron.CronSchedule`) the scheduler and
            :func:`next_task_run` both use.
        enqueue_fn: the declared ``enqueue(occurrence)`` function.
        registry: the registry it joined.
    """

    def __init__(
        self,
        *,
        name: str,
        schedule: CronSchedule,
        catch_up: CatchUp,
        max_catch_up: int,
        enqueue_fn: Callable[[datetime], Iterable[Entry]],
        registry: TaskRegistry,
    ) -> None:
        """Hold a validated declaration (use :func:`task`, which validates)."""
        self.name = name
        self.schedule = schedule
        self.cron = schedule.expr
        self.tz = schedule.tz
        self.catch_up: CatchUp = catch_up
        self.max_catch_up = max_catch_up
        self.enqueue_fn = enqueue_fn
        self.registry = registry

    def __repr__(self) -> str:
        """Show the task's name, cron and zone."""
        return f"<task {self.name} cron={self.cron!r} tz={self.tz}>"

    def entries(self, occurrence: datetime) -> list[Entry]:
        """Answer the ``(job, input)`` pairs one occurrence enqueues, in declared order.

        Args:
            occurrence: the occurrence's instant, aware (handed to ``enqueue_fn`` in UTC).

        Raises:
            ValueError: ``occurrence`` is naive.
            JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` when ``enqueue_fn``
                answers something other than an iterable of ``(job handle, input)`` pairs
                (``meta["index"]`` names the first bad item).
            EnqueueBatchTooLargeError: ``X_JOB_ENQUEUE_BATCH_TOO_LARGE`` above
                ``MAX_ENQUEUE_BATCH`` (10,000) pairs: fan out per row from a job instead.
        """
        at = _aware_utc(occurrence, "occurrence")
        answered = self.enqueue_fn(at)
        if isinstance(answered, str | bytes | dict) or not isinstance(answered, Iterable):
            raise JobDeclarationInvalidError(
                f"task {self.name!r}: enqueue(occurrence) must answer a list of (job, input) "
                f"pairs, got {type(answered).__name__}",
                task=self.name,
            )
        pairs: list[Entry] = []
        for index, item in enumerate(answered):
            if (
                not isinstance(item, tuple | list)
                or len(item) != 2
                or not isinstance(item[0], JobHandle)
            ):
                raise JobDeclarationInvalidError(
                    f"task {self.name!r}: enqueue(occurrence) item {index} is not a "
                    "(job handle, input) pair",
                    task=self.name,
                    index=index,
                )
            pairs.append((item[0], item[1]))
            if len(pairs) > MAX_ENQUEUE_BATCH:
                raise EnqueueBatchTooLargeError(
                    f"task {self.name!r} answered more than {MAX_ENQUEUE_BATCH} entries for one "
                    "occurrence; enqueue one fan-out job that enqueues the children in steps",
                    task=self.name,
                )
        return pairs

    def requests(self, occurrence: datetime) -> list[EnqueueRequest]:
        """Validate one scheduled occurrence's entries and answer its requests; writes nothing.

        Each request carries the job id derived from ``(task, occurrence, index)`` (see the
        module docstring), so a repeated fire of the same occurrence inserts no second row.

        Args:
            occurrence: the occurrence's instant, aware.

        Raises:
            JobsError: any error of :meth:`entries`, or of
                :meth:`~jobs_core.job.JobHandle.build_request` (``X_JOB_INPUT_INVALID``,
                ``X_IDEMPOTENCY_REQUIRED``, ``X_JOB_TENANT_MISMATCH``, ...) with
                ``meta["task"]`` and ``meta["index"]`` added.
        """
        at = _aware_utc(occurrence, "occurrence")
        built: list[EnqueueRequest] = []
        for index, (handle, value) in enumerate(self.entries(at)):
            built.append(
                self._build(handle, value, index, job_id=_occurrence_id(self.name, at, index))
            )
        return built

    async def enqueue(self, occurrence: datetime | None = None) -> list[EnqueueResult]:
        """Fire this task's entries now, through the normal enqueue path of each job.

        Every entry is validated before anything is written; the entries of one job go in one
        :meth:`~jobs_core.job.JobHandle.enqueue_many`. The watermark is not touched: the
        scheduler's next occurrence fires as planned. Fresh job ids are minted (a manual run is
        a new run; live idempotency keys still dedupe).

        Args:
            occurrence: the instant handed to ``enqueue(occurrence)``, aware; default the
                installed driver's own now (``driver.steps.now()``).

        Returns:
            One ``EnqueueResult`` per entry, in entry order.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when no driver is installed.
            JobsError: any error of :meth:`requests` (nothing written).
        """
        if occurrence is None:
            at = await call_driver(lambda driver: driver.steps.now())
        else:
            at = occurrence
        pairs = self.entries(at)
        groups: dict[int, tuple[JobHandle[Any, Any], list[int]]] = {}
        for index, (handle, value) in enumerate(pairs):
            self._build(handle, value, index)
            groups.setdefault(id(handle), (handle, []))[1].append(index)
        answered: dict[int, EnqueueResult] = {}
        for handle, indexes in groups.values():
            results = await handle.enqueue_many([pairs[i][1] for i in indexes])
            answered.update(zip(indexes, results, strict=True))
        return [answered[index] for index in range(len(pairs))]

    def enqueue_sync(self, occurrence: datetime | None = None) -> list[EnqueueResult]:
        """:meth:`enqueue` for synchronous code, run on the portal loop (:mod:`jobs_core.portal`).

        Raises:
            SyncCallInLoopError: ``X_SYNC_IN_LOOP`` on a thread running an event loop.
            JobsError: as :meth:`enqueue`.
        """
        return run_sync(self.enqueue(occurrence))

    def describe(self) -> dict[str, Any]:
        """Answer a JSON-able descriptor (for ``jobsctl manifest``).

        ``jobs`` lists the job names the entries of one occurrence name (the first after
        2000-01-01 UTC, so the answer does not depend on the clock), sorted, without repeats.
        """
        sample = self.entries(self.schedule.next_after(_DESCRIBE_FROM))
        return {
            "kind": "task",
            "name": self.name,
            "cron": self.cron,
            "tz": self.tz,
            "catch_up": self.catch_up,
            "max_catch_up": self.max_catch_up,
            "jobs": sorted({handle.name for handle, _ in sample}),
        }

    def _build(
        self, handle: JobHandle[Any, Any], value: Any, index: int, job_id: UUID | None = None
    ) -> EnqueueRequest:
        try:
            return handle.build_request(value, job_id=job_id)
        except Exception as exc:
            if hasattr(exc, "meta"):
                exc.meta["task"] = self.name
                exc.meta["index"] = index
            raise


def task(
    *,
    cron: str,
    tz: str,
    enqueue: Callable[[datetime], Iterable[Entry]],
    catch_up: CatchUp = "skip",
    max_catch_up: int = 10,
    name: str | None = None,
    registry: TaskRegistry | None = None,
) -> TaskHandle:
    """Declare a cron task.

    Example:
        >>> nightly = task(
        ...     cron="0 3 * * *",
        ...     tz="Europe/Paris",
        ...     enqueue=lambda occurrence: [(send_digest, DigestInput(at=occurrence))],
        ... )  # doctest: +SKIP

    Args:
        cron: a 5-field cron expression (minute hour day-of-month month day-of-week). When both
            day fields are restricted POSIX OR applies (``0 0 1 * 1`` fires on the 1st **and**
            every Monday) and a warning is logged here.
        tz: an IANA zone name (``"Europe/Paris"``), required. A wall time DST skips fires once
            at the first instant after the gap; a repeated wall time fires once, on its first
            pass (crons that cover every hour fire on both passes so they never fall silent).
        enqueue: ``(occurrence) -> [(job, input), ...]``: synchronous and pure (reads nothing);
            ``occurrence`` is an aware UTC ``datetime``. Fan-out per database row belongs in a
            fan-out job.
        catch_up: after missed occurrences, ``"skip"`` fires only the latest, ``"run-once"``
            the earliest (its watermark moving past the rest in the same write), ``"run-all"``
            each, in order, at most ``max_catch_up`` per scheduler round.
        max_catch_up: ``int >= 1`` (default 10).
        name: the durable name; default ``module.qualname`` of ``enqueue``, or ``module:cron@tz``
            when ``enqueue`` is a lambda (see the module docstring).
        registry: the registry to join (default :data:`TASK_REGISTRY`).

    Returns:
        The :class:`TaskHandle`.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` naming every bad field at once
            (``cron``, ``tz`` such as ``"Bogota"``, ``catch_up``, ``max_catch_up``, ``enqueue``,
            ``name``) in its message and ``meta["problems"]``.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds the name.
    """
    problems: list[str] = []
    schedule: CronSchedule | None = None
    try:
        schedule = CronSchedule(cron, tz)
    except JobDeclarationInvalidError as exc:
        problems.extend(f"{field}: {text}" for field, text in exc.meta["problems"].items())
    if catch_up not in get_args(CatchUp):
        problems.append(f"catch_up: must be 'skip', 'run-once' or 'run-all', got {catch_up!r}")
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
        problems.append(f"max_catch_up: must be an int >= 1, got {max_catch_up!r}")
    enqueue_problem = _enqueue_problem(enqueue)
    if enqueue_problem is not None:
        problems.append(enqueue_problem)
    task_name = name if name is not None else _default_name(enqueue, cron, tz)
    if not isinstance(task_name, str) or not task_name.strip() or _NUL in task_name:
        problems.append("name: must be non-empty text without U+0000 (NUL)")
    if problems:
        raise JobDeclarationInvalidError(
            f"task {task_name!r} is declared wrong: " + "; ".join(problems),
            task=task_name if isinstance(task_name, str) else repr(task_name),
            problems=problems,
        )
    assert schedule is not None  # no problems: the schedule was built
    if schedule.restricts_both_days:
        _log.warning(
            "jobs.task.posix-or",
            extra={
                "event": "jobs.task.posix-or",
                "task": task_name,
                "cron": cron,
                "detail": "day-of-month and day-of-week are both restricted: it fires on days "
                "matching EITHER (POSIX cron), not both",
            },
        )
    handle = TaskHandle(
        name=task_name,
        schedule=schedule,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        enqueue_fn=enqueue,
        registry=registry or TASK_REGISTRY,
    )
    handle.registry.register(handle)
    return handle


def next_task_run(task: TaskHandle, after: datetime) -> datetime:
    """Answer ``task``'s first occurrence strictly after ``after``.

    It is the scheduler's own resolver (``task.schedule``), so the answer is the instant the
    scheduler fires, DST rules included.

    Args:
        task: a declared task.
        after: an aware instant, any zone.

    Returns:
        An aware UTC ``datetime`` later than ``after``.

    Raises:
        ValueError: ``after`` is naive.
    """
    return task.schedule.next_after(after)


def _enqueue_problem(enqueue: object) -> str | None:
    if not callable(enqueue):
        return "enqueue: required, a function (occurrence) -> [(job, input), ...]"
    if inspect.iscoroutinefunction(enqueue):
        return (
            "enqueue: must be a plain (synchronous, pure) function, not async; it only names "
            "(job, input) pairs"
        )
    try:
        inspect.signature(enqueue).bind(None)
    except TypeError:
        return "enqueue: must accept one positional argument, the occurrence"
    except ValueError:
        return None  # no introspectable signature (a builtin): trust it
    return None


def _default_name(enqueue: object, cron: object, tz: object) -> str:
    module = getattr(enqueue, "__module__", None) or "main"
    qualname = getattr(enqueue, "__qualname__", None)
    if isinstance(qualname, str) and not qualname.endswith("<lambda>"):
        return f"{module}.{qualname}"
    return f"{module}:{cron}@{tz}"


def _aware_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _occurrence_id(task: str, occurrence: datetime, index: int) -> UUID:
    """Answer the job id of entry ``index`` of ``task``'s ``occurrence`` (a UUIDv7 layout).

    48 bits of the occurrence's Unix milliseconds, then version, 12 hash bits, variant and 62
    hash bits, the hash being SHA-256 of the three: equal inputs answer equal ids, and ids sort
    by occurrence like the ids :func:`~jobs_core.ids.new_id` mints.
    """
    ms = (occurrence - _EPOCH) // _ONE_MS
    digest = hashlib.sha256(f"{task}\x00{occurrence.isoformat()}\x00{index}".encode()).digest()
    bits = int.from_bytes(digest[:10], "big")
    rand_a = bits >> 68 & 0xFFF
    rand_b = bits & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return UUID(int=value)
