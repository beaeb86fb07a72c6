"""``purge()``: a retention sweep over named targets, one durable step per target.

A pass reads the clock once (step ``now``, the store's own clock, persisted so a retried pass
hands every target the same instant), then runs each target as step ``target:<name>`` and
answers how many rows each removed. Target names are the step names, so two targets of one name
are refused before anything is deleted: at declaration for a list, at the pass for a function.

The ready targets: :func:`retention_targets` deletes each driver's settled rows and their steps
older than a retention, in bounded batches through the driver's ``retention`` capability (one
``purge_settled`` call per :data:`RETENTION_BATCH` rows, so a purge on Postgres is many short
``DELETE`` statements, never one over millions of rows), and the events bus's expired events.
With ``task(cron=DEFAULT_PURGE_CRON, tz="UTC", ...)`` it is the nightly retention sweep::

    sweep = purge(name="jobs.retention", targets=retention_targets())
    nightly = task(cron=DEFAULT_PURGE_CRON, tz="UTC", enqueue=lambda at: [(sweep, {})])
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from jobs_core._current import current_driver
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core.context import JobContext
from jobs_core.driver import EventBus, JobDriver, RetentionStore, capability, require_capability
from jobs_core.errors import JobDeclarationInvalidError
from jobs_core.factories._shared import arity, call, declare_singleton, store_now
from jobs_core.job import JobHandle, JobRegistry, declaration_site
from jobs_core.retry import Retry
from jobs_core.steps import Step
from jobs_core.types import JobState, RetentionRequest

__all__ = [
    "DEFAULT_DEAD_RETENTION",
    "DEFAULT_DONE_RETENTION",
    "DEFAULT_PURGE_CRON",
    "RETENTION_BATCH",
    "PurgeJob",
    "PurgeTarget",
    "Purgeable",
    "purge",
    "retention_targets",
]

DEFAULT_PURGE_CRON = "17 3 * * *"
"""The retention sweep's schedule: daily at 03:17 (off the hour, where other crons pile up)."""

DEFAULT_DONE_RETENTION = "7d"
"""How long ``done``, ``failed`` and ``cancelled`` rows are kept by :func:`retention_targets`."""

DEFAULT_DEAD_RETENTION = "30d"
"""How long ``dead`` rows (the dead-letter queue an operator acts on) are kept."""

RETENTION_BATCH = 1_000
"""Rows one ``purge_settled`` call deletes."""

DONE_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
"""What ``done_retention`` applies to: rows nobody needs to act on (``failed`` is a row its job
declared ``dead_letter=False`` for)."""

DEAD_STATES = frozenset({JobState.DEAD})
"""What ``dead_retention`` applies to."""


@runtime_checkable
class Purgeable(Protocol):
    """A purge target: a name (its step's) and ``purge(now) -> rows removed`` (sync or async).

    :class:`PurgeTarget` is the plain one; :func:`jobs_core.events_purge_target` answers one too.
    """

    @property
    def name(self) -> str:
        """The target's name, unique in its sweep (its step is ``target:<name>``)."""
        ...

    def purge(self, now: datetime) -> int | Awaitable[int]:
        """Remove what expired by ``now`` (the pass's one clock reading, UTC); answer how many."""
        ...


@dataclass(frozen=True, slots=True)
class PurgeTarget:
    """A named purge function: ``PurgeTarget("sessions", purge_expired_sessions)``.

    Attributes:
        name: the target's name, unique in its sweep (its step is ``target:<name>``).
        fn: ``(now) -> rows removed`` or ``() -> rows removed``, sync or async; ``now`` is the
            pass's one clock reading (UTC).
    """

    name: str
    fn: Callable[..., int | Awaitable[int]]

    async def purge(self, now: datetime) -> int:
        """Call ``fn`` with the pass's instant (when it takes one); answer its count."""
        args = () if arity(self.fn) == 0 else (now,)
        return int(await call(self.fn, *args))


class PurgeRun(BaseModel):
    """A purge pass takes no input (``{}``)."""

    model_config = ConfigDict(extra="forbid")


class PurgeJob(JobHandle[Any, Any]):
    """A declared purge: an ordinary job handle (built by :func:`purge`)."""

    targets: Sequence[Purgeable] | Callable[[], Sequence[Purgeable]]

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the sweep's target names (when declared as a list)."""
        listed = None if callable(self.targets) else [t.name for t in self.targets]
        return {**super().describe(), "factory": "purge", "targets": listed}


def _target_problems(targets: object) -> list[str]:
    """Answer what is wrong with a list of targets: not targets, empty names, duplicates."""
    if isinstance(targets, str | bytes) or not isinstance(targets, Sequence):
        return ["targets: must be a list of purge targets, or a function answering one"]
    problems = []
    seen: set[str] = set()
    for index, target in enumerate(targets):
        name = getattr(target, "name", None)
        if not isinstance(target, Purgeable) or not isinstance(name, str) or not name:
            problems.append(f"targets[{index}]: not a purge target with a name and purge(now)")
        elif name in seen:
            problems.append(f"targets[{index}]: a second target named {name!r}")
        else:
            seen.add(name)
    return problems


def purge(
    *,
    name: str,
    targets: Sequence[Purgeable] | Callable[[], Sequence[Purgeable]],
    tenant: Literal["none"] = "none",
    queue: str = "default",
    retry: Retry | None = None,
    registry: JobRegistry | None = None,
) -> PurgeJob:
    """Declare a retention sweep: one step per target, one clock reading per pass.

    Example:
        >>> sweep = purge(name="jobs.retention", targets=retention_targets())  # doctest: +SKIP

    Args:
        name: the durable name; one live pass at a time (the idempotency key is the name).
        targets: the targets, or ``() -> targets`` resolved at each pass (for targets built from
            the running driver).
        tenant: ``"none"``: a sweep belongs to no tenant.
        queue: the queue passes run on.
        retry: attempts and backoff (the core's default: 3 attempts).
        registry: the job registry to join (default the process-wide one).

    Returns:
        The :class:`PurgeJob`: ``await sweep.enqueue({})``.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` naming every bad field, two
            targets of one name among them.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.
    """
    site = declaration_site()
    problems = [] if callable(targets) else _target_problems(targets)
    if tenant != "none":
        problems.append('tenant: a purge belongs to no tenant, tenant="none"')
    if problems:
        raise JobDeclarationInvalidError(
            f"purge {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )

    async def run(_run: PurgeRun, step: Step, ctx: JobContext) -> dict[str, Any]:
        found = list(targets() if callable(targets) else targets)
        refused = _target_problems(found)
        if refused:
            # Before any delete: a repeated name would be one step run twice under one key.
            raise JobDeclarationInvalidError(
                f"purge {name!r}: its targets are wrong: " + "; ".join(refused),
                job=name,
                problems=refused,
            )
        now = datetime.fromisoformat(await step.run("now", store_now))
        removed = {}
        for target in found:
            ctx.cancel.raise_if_cancelled()
            removed[target.name] = await step.run(f"target:{target.name}", _purge_one, target, now)
        return {"at": now.isoformat(), "removed": removed}

    made = declare_singleton(
        PurgeJob,
        run,
        name=name,
        input=PurgeRun,
        key=name,
        site=site,
        queue=queue,
        retry=retry,
        registry=registry,
    )
    made.targets = targets
    return made


async def _purge_one(target: Purgeable, now: datetime) -> int:
    removed = await call(target.purge, now)
    return int(removed)


@dataclass(frozen=True, slots=True)
class _SettledRows:
    """Settled rows of some states older than a retention, on the running (or given) driver."""

    name: str
    states: frozenset[JobState]
    keep_ms: int
    driver: JobDriver | None
    batch: int

    async def purge(self, now: datetime) -> int:
        store: RetentionStore = require_capability(self.driver or current_driver(), "retention")
        before = now - timedelta(milliseconds=self.keep_ms)
        total = 0
        while True:
            gone = await store.purge_settled(RetentionRequest(self.states, before, self.batch))
            total += gone
            if gone < self.batch:
                return total


@dataclass(frozen=True, slots=True)
class _ExpiredEvents:
    """The running driver's stored events past their expiry (none without an event bus)."""

    driver: JobDriver | None
    name: str = "events"

    async def purge(self, now: datetime) -> int:
        bus: EventBus | None = capability(self.driver or current_driver(), "events")
        return 0 if bus is None else await bus.purge_expired()


def retention_targets(
    done_retention: Duration = DEFAULT_DONE_RETENTION,
    dead_retention: Duration = DEFAULT_DEAD_RETENTION,
    *,
    events: bool = True,
    driver: JobDriver | None = None,
    batch: int = RETENTION_BATCH,
) -> list[Purgeable]:
    """Answer the ready targets of a retention sweep over a driver's own stores.

    * ``jobs.done``: ``done``, ``failed`` and ``cancelled`` rows settled more than
      ``done_retention`` ago, with their steps;
    * ``jobs.dead``: ``dead`` rows settled more than ``dead_retention`` ago, with their steps;
    * ``events`` (with ``events=True``): expired events of the driver's bus.

    Each deletes in batches of ``batch`` rows through the driver's ``retention`` capability.

    Args:
        done_retention: how long finished rows are kept (``"7d"``).
        dead_retention: how long dead-lettered rows are kept (``"30d"``).
        events: include the events target.
        driver: the driver swept (default the one running the pass).
        batch: rows per ``purge_settled`` call (1..10,000).

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` for a bad duration or batch.
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED``, at the pass, on a driver without the
            ``retention`` capability.
    """
    problems = []
    for what, value in (("done_retention", done_retention), ("dead_retention", dead_retention)):
        problem = duration_problem(value)
        if problem is not None:
            problems.append(f"{what}: {problem}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        problems.append(f"batch: must be an int 1..10,000, got {batch!r}")
    if problems:
        raise JobDeclarationInvalidError(
            "retention_targets is declared wrong: " + "; ".join(problems), problems=problems
        )
    found: list[Purgeable] = [
        _SettledRows(
            "jobs.done", DONE_STATES, parse_duration(done_retention, field="done"), driver, batch
        ),
        _SettledRows(
            "jobs.dead", DEAD_STATES, parse_duration(dead_retention, field="dead"), driver, batch
        ),
    ]
    if events:
        found.append(_ExpiredEvents(driver))
    return found
