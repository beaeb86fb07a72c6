"""``backfill()``: one pass over every row a source matches, one durable step per page.

A pass is an ordinary job whose body reads a page (``source`` keyset, or ``pages`` for a remote
cursor), hands it to ``handle`` and checkpoints ``{cursor, rows}`` as the output of step
``batch:<n>``. A killed pass replays its completed pages from storage (neither reading nor
handling them again) and resumes at the page it stopped on; the page in flight at the kill is
handled again, which is why ``handle`` must write idempotently (at least once per page).

Rules and why:

* **The checkpoint is the cursor, never the page**: a step's output is kept for the whole run,
  and a million rows would be kept a thousand at a time.
* **``rate`` always throttles** (pages per second, default 5): a pass shares its database with
  the requests the app still serves; to go faster raise the number. The pause is spent inside
  the page's step (after the page, up to ``1 / rate`` seconds since it began), so a replay of
  500 completed pages re-pays none of them; it ends early when the attempt is cancelled (a
  drain), and the page's checkpoint still lands.
* **The ledger** (the driver's ``backfills`` capability) holds one row per pass: name, scope,
  checksum of the declaration, status, app version (``JOBS_BUILD``), rows, last cursor, started,
  completed. A completed pass of ``(name, scope)`` makes a later enqueue a no-op pass that
  answers ``skipped``; ``force=True`` runs a new pass. A driver without a ledger (Redis) refuses
  a backfill with ``X_NOT_IMPLEMENTED``: a pass that cannot record it ran would run again at
  every deploy.
* **``count``** answers the rows still to do: it is the progress total, and a count above zero
  after the last page is ``X_BACKFILL_STALLED`` (the handler did not change what the source
  matches). **``environments``** (against ``JOBS_ENV``) and **``requires``** (migration names
  against ``migrations()``) are checked at the enqueue and at every attempt.
* **``input`` + ``scope``** make one pass per scope (a tenant, a shard): the ledger row and the
  live idempotency key are ``<name>:<scope>``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, cast
from uuid import UUID

from pydantic import BaseModel, ConfigDict, create_model

from jobs_core._current import current_driver
from jobs_core.clock import SYSTEM_CLOCK, Clock
from jobs_core.context import CancelSignal, JobContext
from jobs_core.driver import BackfillLedger, JobDriver, capability
from jobs_core.errors import (
    BackfillEnvironmentError,
    BackfillMigrationPendingError,
    BackfillSourceInvalidError,
    BackfillStalledError,
    JobDeclarationInvalidError,
    JobOptionsInvalidError,
    NotImplementedByDriverError,
)
from jobs_core.factories._shared import adopt, arity, call, is_positive_int
from jobs_core.factories.keyset import BackfillSource
from jobs_core.job import REGISTRY, JobHandle, JobRegistry, Settled, declaration_site, job
from jobs_core.retry import Retry
from jobs_core.serialization import NotJSONError, to_json_form
from jobs_core.steps import Step
from jobs_core.types import (
    BackfillPass,
    BackfillProgress,
    BackfillQuery,
    BackfillStart,
    EnqueueResult,
    JSONValue,
)

__all__ = [
    "BUILD_VARIABLE",
    "DEFAULT_BACKFILL_BATCH",
    "DEFAULT_BACKFILL_RATE",
    "ENVIRONMENT_VARIABLE",
    "BackfillContext",
    "BackfillJob",
    "BackfillPlan",
    "backfill",
    "pending_backfills",
    "registered_backfills",
]

_log = logging.getLogger("jobs.backfill")

DEFAULT_BACKFILL_RATE = 5.0
"""Pages per second when ``rate`` is not given: 5,000 rows per second at the default batch."""

DEFAULT_BACKFILL_BATCH = 1_000
"""Rows per page when ``batch`` is not given."""

MAX_BACKFILL_BATCH = 10_000
"""The largest page: one statement and one handler call stay bounded."""

MAX_BACKFILL_RATE = 1_000.0
"""The fastest throttle accepted (pages per second); above it the pause is noise."""

ENVIRONMENT_VARIABLE = "JOBS_ENV"
"""The environment variable naming where this process runs (``staging``, ``production``)."""

BUILD_VARIABLE = "JOBS_BUILD"
"""The environment variable naming the app's build; the ledger records it per pass (the worker's
``--build`` reads the same variable)."""

DEFAULT_RETRY = Retry(attempts=5, delay="1s", max_delay="1m")
"""A failed page is retried (completed pages replay from storage): five attempts, 1 s doubling."""


@dataclass(frozen=True, slots=True)
class BackfillContext:
    """What ``source``, ``count`` and ``migrations`` learn about the pass.

    Attributes:
        name: the backfill's name.
        scope: the pass's scope (``""`` without ``scope``).
        input: the pass's input (``None`` without ``input``).
    """

    name: str
    scope: str
    input: Any


@dataclass(frozen=True, slots=True)
class BackfillPlan:
    """What ``jobsctl backfill NAME`` (a dry run) shows: nothing is written.

    Attributes:
        name: the backfill's name.
        scope: the scope (``""`` for none).
        count: rows to do (``count``, else the source's own count), or ``None`` if unknown.
        pages: the pages the pass would take (``ceil(count / batch)``, at least 1), if known.
        batch: rows per page.
        rate: pages per second.
        seconds: the least time the throttle allows for those pages, if known.
        checksum: the declaration's digest, as a new pass would record it.
        environment: ``JOBS_ENV`` here (``None`` if unset).
        refusal: why an enqueue would be refused here (``X_…: message``), or ``None``.
        completed: the newest completed pass of this scope (its existence makes a pass skip).
        latest: the newest pass of this scope, whatever its status.
    """

    name: str
    scope: str
    count: int | None
    pages: int | None
    batch: int
    rate: float
    seconds: float | None
    checksum: str
    environment: str | None
    refusal: str | None
    completed: BackfillPass | None
    latest: BackfillPass | None

    @property
    def would(self) -> Literal["run", "skip", "refuse"]:
        """What ``--write`` would do: ``refuse``, ``skip`` (a completed pass exists) or ``run``."""
        if self.refusal is not None:
            return "refuse"
        return "skip" if self.completed is not None else "run"


@dataclass(slots=True)
class _Spec:
    """A validated declaration, shared by the body, the handle and the dry run."""

    name: str
    handle: Callable[..., Any]
    source: Callable[[BackfillContext], BackfillSource] | None
    pages: Callable[..., Any] | None
    batch: int
    rate: float
    input_type: Any
    scope: Callable[[Any], str] | None
    count: Callable[[BackfillContext], Any] | None
    requires: tuple[str, ...]
    migrations: Callable[..., Any] | None
    environments: tuple[str, ...] | None
    clock: Clock
    run_model: type[BaseModel] = field(init=False)

    def __post_init__(self) -> None:
        # A pass without scope takes no input at all: ``None`` is its only value.
        taken: Any = type(None) if self.scope is None else Optional[self.input_type]  # noqa: UP045
        self.run_model = create_model(
            f"BackfillRun_{hashlib.sha1(self.name.encode()).hexdigest()[:12]}",
            __config__=ConfigDict(extra="forbid"),
            input=(taken, None),
            force=(bool, False),
        )

    def scope_of(self, value: Any) -> str:
        if self.scope is None:
            return ""
        scope = self.scope(value)
        if not isinstance(scope, str) or not scope or "\x00" in scope:
            raise JobOptionsInvalidError(
                f"scope(input) of backfill {self.name!r} answered {scope!r}; it must be "
                "non-empty text without U+0000",
                option="scope",
            )
        return scope

    def refusal(self) -> BackfillEnvironmentError | None:
        if self.environments is None:
            return None
        here = os.environ.get(ENVIRONMENT_VARIABLE)
        if here in self.environments:
            return None
        return BackfillEnvironmentError(
            f"backfill {self.name!r} runs only where {ENVIRONMENT_VARIABLE} is one of "
            f"{', '.join(self.environments)}; here it is "
            + ("not set" if here is None else repr(here)),
            backfill=self.name,
            environment=here,
            environments=list(self.environments),
        )

    async def pending_migrations(self, ctx: BackfillContext) -> list[str]:
        if not self.requires or self.migrations is None:
            return []
        args = () if arity(self.migrations) == 0 else (ctx,)
        done = set(await call(self.migrations, *args))
        return [name for name in self.requires if name not in done]

    async def check(self, ctx: BackfillContext) -> None:
        """Raise the first refusal of this process or schema: environment, then migrations."""
        refused = self.refusal()
        if refused is not None:
            raise refused
        pending = await self.pending_migrations(ctx)
        if pending:
            raise BackfillMigrationPendingError(
                f"backfill {self.name!r} requires the migration(s) {', '.join(pending)}, which "
                "are not applied yet",
                backfill=self.name,
                pending=pending,
            )

    def checksum(self, ctx: BackfillContext) -> str:
        described: dict[str, Any] = {
            "name": self.name,
            "scope": ctx.scope,
            "batch": self.batch,
            "handle": _qualname(self.handle),
        }
        if self.source is not None:
            source = self.source(ctx)
            describe = getattr(source, "describe", None)
            described["source"] = describe() if callable(describe) else _qualname(type(source))
        else:
            described["pages"] = _qualname(self.pages)
        text = json.dumps(to_json_form(described), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    async def remaining(self, ctx: BackfillContext) -> int | None:
        """Answer ``count(ctx)``, or ``None`` when the backfill declares no count."""
        if self.count is None:
            return None
        left = await call(self.count, ctx)
        if isinstance(left, bool) or not isinstance(left, int) or left < 0:
            raise JobOptionsInvalidError(
                f"count(ctx) of backfill {self.name!r} answered {left!r}; it must be an int >= 0",
                option="count",
            )
        return left

    async def read(
        self, ctx: BackfillContext, cursor: JSONValue, cancel: CancelSignal
    ) -> tuple[list[Any], Any]:
        if self.source is not None:
            return await self.source(ctx).read(cursor, self.batch)
        assert self.pages is not None
        answered = await call(self.pages, cursor, cancel, ctx.input)
        if not isinstance(answered, tuple | list) or len(answered) != 2:
            raise BackfillSourceInvalidError(
                f"pages() of backfill {self.name!r} answered {type(answered).__name__}; it must "
                "answer (rows, next_cursor)",
                backfill=self.name,
            )
        rows, following = answered
        if isinstance(rows, str | bytes) or not isinstance(rows, Iterable):
            raise BackfillSourceInvalidError(
                f"pages() of backfill {self.name!r} answered rows of type {type(rows).__name__}; "
                "they must be a list",
                backfill=self.name,
            )
        return list(rows), following

    async def pace(self, started: float, cancel: CancelSignal) -> None:
        """Wait until ``1 / rate`` seconds passed since ``started``, or the attempt is cancelled."""
        wait = 1.0 / self.rate - (self.clock.monotonic() - started)
        if wait <= 0 or cancel.is_set:
            return
        try:
            await asyncio.wait_for(cancel.wait(), wait)
        except TimeoutError:
            return


def _qualname(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def ledger_of(driver: JobDriver) -> BackfillLedger:
    """Answer the driver's backfill ledger.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` naming the fix when the driver keeps
            none (Redis).
    """
    ledger: BackfillLedger | None = capability(driver, "backfills")
    if ledger is None:
        raise NotImplementedByDriverError(
            f"the {driver.name} driver keeps no backfill ledger, so a backfill cannot record "
            "that it ran (it would run again at every deploy); run backfills on a driver with "
            "one: postgresql://... (or memory:// in tests)",
            driver=driver.name,
            capability="backfills",
        )
    return ledger


class BackfillJob(JobHandle[Any, Any]):
    """A declared backfill: an ordinary job handle, plus the pass's own members.

    Enqueue a pass with :meth:`enqueue` (``force=True`` runs one even after a completed pass);
    :meth:`plan` is the dry run. Built by :func:`backfill`.
    """

    spec: _Spec

    @property
    def scoped(self) -> bool:
        """Whether passes are per scope (``input`` + ``scope``)."""
        return self.spec.scope is not None

    @property
    def batch(self) -> int:
        """Rows per page."""
        return self.spec.batch

    @property
    def rate(self) -> float:
        """Pages per second."""
        return self.spec.rate

    def run_input(self, input: Any = None, *, force: bool = False) -> BaseModel:
        """Answer the job input of one pass (what a task entry or ``enqueue_many`` takes).

        Args:
            input: the pass's input (only for a backfill declared with ``input`` + ``scope``).
            force: run a new pass even though one of this scope completed.

        Raises:
            JobInputInvalidError: ``X_JOB_INPUT_INVALID`` for an input the model refuses, or
                any input for a backfill without ``input``.
        """
        return cast(BaseModel, self.parse_input({"input": input, "force": force}))

    def context(self, input: Any = None) -> BackfillContext:
        """Answer the :class:`BackfillContext` a pass over ``input`` gets.

        Raises:
            JobsError: as :meth:`run_input`, or ``X_JOB_OPTIONS_INVALID`` for a bad scope.
        """
        value = getattr(self.run_input(input), "input", None)
        return BackfillContext(self.name, self.spec.scope_of(value), value)

    async def enqueue(
        self, input: Any = None, *, force: bool = False, **options: Any
    ) -> EnqueueResult:
        """Queue a pass (never runs it inline); a live pass of this scope is answered, deduped.

        Args:
            input: the pass's input (a backfill declared with ``input`` + ``scope``).
            force: run a new pass even though one of this scope completed.
            **options: :meth:`jobs_core.JobHandle.enqueue`'s options (``queue``, ``delay``, ...).

        Raises:
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` on a driver without a ledger.
            BackfillEnvironmentError: ``X_BACKFILL_ENVIRONMENT``.
            BackfillMigrationPendingError: ``X_BACKFILL_MIGRATION_PENDING``.
            JobsError: any error of :meth:`jobs_core.JobHandle.enqueue`.
        """
        ctx = self.context(input)
        ledger_of(current_driver())
        await self.spec.check(ctx)
        return await super().enqueue(self.run_input(input, force=force), **options)

    async def plan(self, input: Any = None, *, driver: JobDriver | None = None) -> BackfillPlan:
        """Answer what a pass would do, writing nothing (``jobsctl backfill NAME``).

        Args:
            input: the pass's input (for a scoped backfill).
            driver: the driver whose ledger is read (default the installed one).

        Raises:
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` on a driver without a ledger.
        """
        spec = self.spec
        ctx = self.context(input)
        ledger = ledger_of(driver or current_driver())
        refusal: str | None = None
        try:
            await spec.check(ctx)
        except (BackfillEnvironmentError, BackfillMigrationPendingError) as exc:
            refusal = f"{exc.code}: {exc.message}"
        count = await spec.remaining(ctx)
        if count is None and spec.source is not None:
            counter = getattr(spec.source(ctx), "count", None)
            count = int(await counter()) if callable(counter) else None
        pages = None if count is None else max(1, math.ceil(count / spec.batch))
        latest = await ledger.passes(BackfillQuery(name=self.name, scope=ctx.scope, limit=1))
        return BackfillPlan(
            name=self.name,
            scope=ctx.scope,
            count=count,
            pages=pages,
            batch=spec.batch,
            rate=spec.rate,
            seconds=None if pages is None else pages / spec.rate,
            checksum=spec.checksum(ctx),
            environment=os.environ.get(ENVIRONMENT_VARIABLE),
            refusal=refusal,
            completed=await ledger.completed(self.name, ctx.scope),
            latest=latest[0] if latest else None,
        )

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the backfill's own settings."""
        spec = self.spec
        return {
            **super().describe(),
            "factory": "backfill",
            "batch": spec.batch,
            "rate": spec.rate,
            "scoped": spec.scope is not None,
            "source": "keyset" if spec.source is not None else "pages",
            "requires": list(spec.requires),
            "environments": None if spec.environments is None else list(spec.environments),
        }


def _body(spec: _Spec) -> Callable[..., Any]:
    """The pass: begin, one step per page, finish."""

    async def begin(
        ledger: BackfillLedger, pass_id: UUID, force: bool, ctx: BackfillContext
    ) -> dict[str, Any]:
        done = await ledger.completed(spec.name, ctx.scope)
        if done is not None and not force:
            return {"skipped": True, "pass": str(done.id), "rows": done.rows, "total": None}
        total = await spec.remaining(ctx)
        started = await ledger.begin(
            BackfillStart(
                id=pass_id,
                name=spec.name,
                scope=ctx.scope,
                checksum=spec.checksum(ctx),
                app_version=os.environ.get(BUILD_VARIABLE) or None,
            )
        )
        return {"skipped": False, "pass": str(pass_id), "rows": started.rows, "total": total}

    async def page(
        ledger: BackfillLedger,
        pass_id: UUID,
        n: int,
        cursor: JSONValue,
        before: int,
        total: int | None,
        ctx: BackfillContext,
        *,
        cancel: CancelSignal,
    ) -> dict[str, Any]:
        started = spec.clock.monotonic()
        rows, following = await spec.read(ctx, cursor, cancel)
        if rows:
            await call(spec.handle, rows, cancel)
        try:
            next_cursor = to_json_form(following)
        except NotJSONError as exc:
            raise BackfillSourceInvalidError(
                f"page {n} of backfill {spec.name!r} answered a next cursor with no JSON form at "
                f"{exc.path}: {exc.reason}",
                backfill=spec.name,
            ) from None
        done = before + len(rows)
        await ledger.record(BackfillProgress(pass_id, done, next_cursor))
        await spec.pace(started, cancel)
        _log.info(
            "jobs.backfill.page",
            extra={
                "event": "jobs.backfill.page",
                "backfill": spec.name,
                "scope": ctx.scope,
                "job_id": str(pass_id),
                "page": n,
                "rows": done,
                "total": total,
                "cursor": next_cursor,
            },
        )
        return {"cursor": next_cursor, "rows": len(rows)}

    async def finish(ledger: BackfillLedger, pass_id: UUID, ctx: BackfillContext) -> int | None:
        left = await spec.remaining(ctx)
        if left:
            raise BackfillStalledError(
                f"backfill {spec.name!r} handled its last page and count() still answers {left} "
                "row(s) to do",
                backfill=spec.name,
                scope=ctx.scope,
                remaining=left,
            )
        await ledger.settle(pass_id, "completed")
        return left

    async def run(run: Any, step: Step, job_ctx: JobContext) -> dict[str, Any]:
        ledger = ledger_of(current_driver())
        ctx = BackfillContext(spec.name, spec.scope_of(run.input), run.input)
        await spec.check(ctx)
        pass_id = job_ctx.job_id or job_ctx.run_id
        begun = await step.run("begin", begin, ledger, pass_id, run.force, ctx)
        if begun["skipped"]:
            return {"status": "skipped", "pass": begun["pass"], "rows": begun["rows"]}
        total = begun["total"]
        cursor: JSONValue = None
        rows = 0
        n = 0
        while True:
            job_ctx.cancel.raise_if_cancelled()
            out = await step.run(f"batch:{n}", page, ledger, pass_id, n, cursor, rows, total, ctx)
            rows += out["rows"]
            cursor = out["cursor"]
            n += 1
            job_ctx.progress(rows, total, note=f"{n} page(s), cursor {json.dumps(cursor)}")
            if cursor is None:
                break
        await step.run("finish", finish, ledger, pass_id, ctx)
        return {"status": "completed", "pass": str(pass_id), "rows": rows, "pages": n}

    return run


def _settled(spec: _Spec) -> Callable[[Settled], Any]:
    """The ``on_settled`` hook: a pass whose job ended for good without completing is failed."""

    async def hook(settled: Settled) -> None:
        if settled.outcome in ("dead-lettered", "dropped"):
            ledger: BackfillLedger | None = capability(current_driver(), "backfills")
            if ledger is not None:
                await ledger.settle(settled.job_id, "failed")

    return hook


def backfill(
    *,
    name: str,
    tenant: Callable[[Any], str] | Literal["none"],
    handle: Callable[..., Any],
    source: Callable[[BackfillContext], BackfillSource] | None = None,
    pages: Callable[..., Any] | None = None,
    batch: int = DEFAULT_BACKFILL_BATCH,
    rate: float = DEFAULT_BACKFILL_RATE,
    input: Any = None,
    scope: Callable[[Any], str] | None = None,
    count: Callable[[BackfillContext], Any] | None = None,
    requires: str | Sequence[str] | None = None,
    migrations: Callable[..., Any] | None = None,
    environments: Sequence[str] | None = None,
    queue: str = "default",
    retry: Retry = DEFAULT_RETRY,
    clock: Clock = SYSTEM_CLOCK,
    registry: JobRegistry | None = None,
) -> BackfillJob:
    """Declare a backfill: a job that passes once over every row a source matches.

    Example:
        >>> rewrite = backfill(
        ...     name="rewrite-slugs",
        ...     tenant="none",
        ...     source=lambda ctx: keyset(pool, "posts", key="id", where="slug IS NULL"),
        ...     handle=upsert_slugs,  # (rows, cancel) -> None, idempotent per row
        ...     batch=1000,
        ...     rate=5,
        ... )  # doctest: +SKIP

    Args:
        name: the durable name (rows, the ledger and the live key carry it).
        tenant: ``(input) -> org id``, or ``"none"``.
        handle: ``(rows, cancel) -> None`` (sync or async): handles one page, at least once per
            page (a killed page is handed again), so it writes idempotently. It gets no ``step``.
        source: ``(ctx) -> BackfillSource``, e.g. ``lambda ctx: keyset(...)``: pages in key
            order. Exactly one of ``source`` and ``pages``.
        pages: ``(cursor, cancel, input) -> (rows, next_cursor)`` (sync or async) for a remote
            cursor; ``cursor`` is ``None`` first, ``next_cursor`` ``None`` at the end. The
            cursor must be JSON (it is the checkpoint).
        batch: rows per page of ``source`` (1..10,000; default 1,000); with ``pages`` the page
            size a dry run assumes (the function decides its pages).
        rate: pages per second, > 0 (default 5); it always throttles.
        input: the input type of one pass (with ``scope``).
        scope: ``(input) -> str``: one pass per scope (needs ``input``).
        count: ``(ctx) -> int`` (sync or async): rows still to do; the progress total, and above
            zero after the last page it is ``X_BACKFILL_STALLED``.
        requires: migration name(s) that must be applied first (needs ``migrations``).
        migrations: ``() -> names`` or ``(ctx) -> names`` (sync or async): the applied ones.
        environments: where a pass may run, against ``JOBS_ENV``.
        queue: the queue passes run on.
        retry: attempts and backoff of a pass (default 5 attempts, 1 s doubling to 1 min).
        clock: what the throttle measures on (its ``monotonic()``).
        registry: the job registry to join (default the process-wide one).

    Returns:
        The :class:`BackfillJob`: ``await rewrite.enqueue()``, ``await rewrite.plan()``.

    Raises:
        BackfillSourceInvalidError: ``X_BACKFILL_SOURCE_INVALID`` for no source, or both, naming
            every other bad field too.
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` naming every bad field
            (``batch``, ``rate``, ``input`` without ``scope``, ...).
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.
    """
    site = declaration_site()
    problems: list[str] = []
    source_problem = False
    if (source is None) == (pages is None):
        source_problem = True
        problems.append(
            "source/pages: exactly one is required, source=lambda ctx: keyset(...) or "
            "pages=(cursor, cancel, input) -> (rows, next)"
        )
    for what, fn in (("source", source), ("pages", pages)):
        if fn is not None and not callable(fn):
            source_problem = True
            problems.append(f"{what}: must be a function")
    if not callable(handle):
        problems.append("handle: must be a function (rows, cancel) -> None")
    if not is_positive_int(batch, MAX_BACKFILL_BATCH):
        problems.append(f"batch: must be an int 1..{MAX_BACKFILL_BATCH:,}, got {batch!r}")
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not math.isfinite(rate)
        or not 0 < rate <= MAX_BACKFILL_RATE
    ):
        problems.append(
            f"rate: pages per second, > 0 and at most {MAX_BACKFILL_RATE:g} (there is no way "
            f"off: raise it to go faster), got {rate!r}"
        )
    if (input is None) != (scope is None):
        problems.append("input/scope: declare both (one pass per scope(input)) or neither")
    elif scope is not None and not callable(scope):
        problems.append("scope: must be a function (input) -> str")
    if count is not None and not callable(count):
        problems.append("count: must be a function (ctx) -> int")
    required = (requires,) if isinstance(requires, str) else tuple(requires or ())
    if not all(isinstance(r, str) and r for r in required):
        problems.append("requires: migration names (text)")
    if required and not callable(migrations):
        problems.append("migrations: required with requires=, a function () -> applied names")
    places: tuple[str, ...] | None = None
    if environments is not None:
        places = () if isinstance(environments, str) else tuple(environments)
        if not places or not all(isinstance(e, str) and e for e in places):
            problems.append("environments: a non-empty list of names, e.g. ['staging']")
    if not isinstance(clock, Clock):
        problems.append("clock: must have now() and monotonic()")
    if problems:
        error = BackfillSourceInvalidError if source_problem else JobDeclarationInvalidError
        raise error(
            f"backfill {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    spec = _Spec(
        name=name,
        handle=handle,
        source=source,
        pages=pages,
        batch=batch,
        rate=float(rate),
        input_type=input,
        scope=scope,
        count=count,
        requires=required,
        migrations=migrations,
        environments=places,
        clock=clock,
    )

    def key(run: Any) -> str:
        return name if spec.scope is None else f"{name}:{spec.scope_of(run.input)}"

    declared = job(
        input=spec.run_model,
        idempotency_key=key,
        tenant=tenant if tenant == "none" else _tenant_of_input(tenant),
        retry=retry,
        name=name,
        queue=queue,
        on_settled=_settled(spec),
        registry=registry,
        declared_at=site,
    )(_body(spec))
    made = adopt(BackfillJob, declared)
    made.spec = spec
    return made


def _tenant_of_input(tenant: Any) -> Callable[[Any], str]:
    if not callable(tenant):
        return cast(Callable[[Any], str], tenant)  # job() names the bad field

    def of(run: Any) -> str:
        return cast(str, tenant(run.input))

    return of


def registered_backfills(registry: JobRegistry | None = None) -> list[BackfillJob]:
    """Answer every declared backfill, sorted by name (default: the process-wide registry)."""
    return [h for h in (registry or REGISTRY).all() if isinstance(h, BackfillJob)]


async def pending_backfills(
    driver: JobDriver | None = None, registry: JobRegistry | None = None
) -> list[BackfillJob]:
    """Answer the declared backfills without a completed pass: what a deploy gate waits for.

    A scoped backfill has no fixed set of scopes to check, so it is never pending here; check
    its scopes with ``driver.backfills.completed(name, scope)``.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` on a driver without a ledger.
    """
    ledger = ledger_of(driver or current_driver())
    pending = []
    for backfill_job in registered_backfills(registry):
        if not backfill_job.scoped and await ledger.completed(backfill_job.name, "") is None:
            pending.append(backfill_job)
    return pending
