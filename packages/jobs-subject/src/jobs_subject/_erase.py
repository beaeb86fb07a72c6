"""The erase: ``subject_erase()`` and the table passes it runs, ``subject_erase_tables()``.

A run plans from the catalog when each attempt starts (every refusal before any row is
touched), counts the subject's rows in each planned table (step ``census``, once: the record's
row counts, exact however often the run is killed), erases each target (step
``target:<name>``, handed the subject's row read fresh in that step), then runs the table
passes: the loop-closing keys cleared, then each table children first, the subject's own row
last. Each pass walks a page of parent keys per step (step ``<verb>:<table>:<key>:<page>``),
and each step's write is one ``DELETE`` or ``UPDATE`` naming that page's key list, so a killed
attempt replays the finished pages from storage and resumes at the first page it has no output
for; running that page again deletes nothing twice.

A delete a foreign key refuses (a row inserted meanwhile under a table already passed: the
subject was still writing) does not fail the step: the pass goes on, and when the round ends
another round runs every pass again (steps ``r1:...``, ``r2:...``) to catch what was added. Three
rounds in one attempt that each met such a refusal end the attempt with
``X_SUBJECT_ERASE_BLOCKED``; the retry resumes with the next round.

Step outputs hold cursors (parent keys, as text) and counts, never a row's values; the run's
result is the erase's own record: what was erased, when, and how many rows of each table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypedDict

from psycopg.errors import ForeignKeyViolation
from psycopg.rows import dict_row

from jobs_core import JobContext, JobHandle, JobRegistry, Retry, Settled, Step
from jobs_core.errors import SubjectEraseBlockedError
from jobs_core.limits import Concurrency
from jobs_subject._catalog import ForeignKey
from jobs_subject._declare import call, caller_site, check_subject, declare, key_reader
from jobs_subject._plan import Clear, Plan, PlannedTable
from jobs_subject._select import Query, Statements
from jobs_subject._sql import block
from jobs_subject._subject import Subject
from jobs_subject._target import SubjectTarget

MAX_FRESH_ROUNDS = 3
"""Rounds one attempt runs while foreign keys keep refusing deletes, before it gives up."""

MAX_STEP_NAME = 200


class StepRunner(Protocol):
    """What the passes need of a step: ``await step.run(name, fn, *args)``.

    A job's :class:`~jobs_core.Step` is one.
    """

    async def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any: ...


class ErasedTables(TypedDict):
    """What :func:`subject_erase_tables` answers.

    Attributes:
        rounds: rounds run (1 unless a foreign key refused a delete).
        tables: ``{table: rows its statements deleted or updated}`` (a page whose statement
            committed before a kill counts 0 when it runs again).
        cleared: ``{"table.key": rows whose loop-closing key was cleared}``.
    """

    rounds: int
    tables: dict[str, int]
    cleared: dict[str, int]


class EraseRecord(TypedDict):
    """The erase's own record, the job's result; names and counts, never a value.

    Attributes:
        subject: the subject's name.
        erased_at: when the erase finished (the database's clock), ISO 8601 UTC.
        rounds: rounds the table passes took.
        tables: ``{table: {"treatment", "rows", ...}}``: the subject's rows in each planned
            table when the erase began (a RETAIN table's with its reason: kept, not erased;
            ``None`` for a table a later attempt planned that the census never counted).
        cleared: ``{"table.key": {"columns", "rows"}}``: rows of anyone whose loop-closing key
            pointed at the subject's rows, cleared.
        targets: ``{name: {"treatment", "erased"}}`` (``"reason"`` for a RETAIN target).
    """

    subject: str
    erased_at: str
    rounds: int
    tables: dict[str, dict[str, Any]]
    cleared: dict[str, dict[str, Any]]
    targets: dict[str, dict[str, Any]]


def step_name(*parts: str) -> str:
    """Join ``parts`` with ``:``; a name past the core's 200-character limit ends in a digest."""
    name = ":".join(parts)
    if len(name) <= MAX_STEP_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: MAX_STEP_NAME - 17]}~{digest}"


class _Passes:
    """The table passes of one plan for one key."""

    def __init__(self, subject: Subject, plan: Plan, key: Any, attempt: int) -> None:
        self.subject = subject
        self.plan = plan
        self.statements = Statements(plan, subject.key_values(key))
        self.attempt = attempt

    async def run(self, step: StepRunner) -> ErasedTables:
        tables = {planned.shown: 0 for planned in self.plan.tables}
        cleared = {_clear_name(self.plan, c.key): 0 for c in self.plan.clears}
        fresh = 0
        round_ = 0
        while True:
            prefix = () if round_ == 0 else (f"r{round_}",)
            outputs: list[dict[str, Any]] = []
            for clear in self.plan.clears:
                done = await self._pages(
                    step,
                    (*prefix, "clear", clear.child.name.shown(self.plan.home), clear.key.name),
                    clear.key,
                    self._clearer(clear),
                )
                cleared[_clear_name(self.plan, clear.key)] += sum(o["rows"] for o in done)
                outputs += done
            for planned in self.plan.tables:
                done = await self._table(step, prefix, planned)
                tables[planned.shown] += sum(o["rows"] for o in done)
                outputs += done
            round_ += 1
            fresh += any(o["attempt"] == self.attempt for o in outputs)
            if not any(o["blocked"] for o in outputs):
                return {"rounds": round_, "tables": tables, "cleared": cleared}
            if fresh >= MAX_FRESH_ROUNDS:
                raise SubjectEraseBlockedError(
                    f"a foreign key refused deleting rows of the subject {self.subject.name!r} "
                    f"in {MAX_FRESH_ROUNDS} rounds running: rows referencing them keep being "
                    "written; the retry resumes with the next round",
                    subject=self.subject.name,
                    rounds=round_,
                )

    async def _table(
        self, step: StepRunner, prefix: tuple[str, ...], planned: PlannedTable
    ) -> list[dict[str, Any]]:
        treatment = planned.treatment
        if planned.table.name == self.plan.subject.name:
            values = None if treatment.deletes else treatment.values
            query = self.statements.write_subject(values)
            verb = "erase" if treatment.deletes else "anonymize"
            return [await step.run(step_name(*prefix, verb, planned.shown), self._write, query)]
        if treatment.kind == "retain":
            return []
        done: list[dict[str, Any]] = []
        verb = "erase" if treatment.deletes else "anonymize"
        for fk in planned.keys:
            write = self._writer(planned, fk)
            done += await self._pages(step, (*prefix, verb, planned.shown, fk.name), fk, write)
        return done

    def _clearer(self, clear: Clear) -> Callable[[list[list[str]]], Query]:
        """The write of one page of a loop-closing key: its columns set to NULL."""
        nulls = dict.fromkeys(clear.columns)
        return lambda keys: self.statements.update_page(clear.child, clear.key, keys, nulls)

    def _writer(self, planned: PlannedTable, fk: ForeignKey) -> Callable[[list[list[str]]], Query]:
        """The write of one page of ``planned`` reached through ``fk``."""
        if planned.treatment.deletes:
            return lambda keys: self.statements.delete_page(planned.table, fk, keys)
        values = planned.treatment.values
        return lambda keys: self.statements.update_page(planned.table, fk, keys, values)

    async def _pages(
        self,
        step: StepRunner,
        name: tuple[str, ...],
        fk: ForeignKey,
        write: Callable[[list[list[str]]], Query],
    ) -> list[dict[str, Any]]:
        outputs: list[dict[str, Any]] = []
        cursor: list[str] | None = None
        while True:
            output = await step.run(
                step_name(*name, str(len(outputs))), self._page, fk, cursor, write
            )
            outputs.append(output)
            if output["cursor"] is None:
                return outputs
            cursor = output["cursor"]

    async def _page(
        self,
        fk: ForeignKey,
        cursor: list[str] | None,
        write: Callable[[list[list[str]]], Query],
    ) -> dict[str, Any]:
        """One step: a page of the parent's keys, then one write naming that key list."""
        batch = self.subject.batch
        async with self.subject.connection() as conn:
            cur = await conn.execute(*self.statements.parent_page(fk, cursor, batch))
            keys = [list(row) for row in await cur.fetchall()]
            rows, blocked = (0, False) if not keys else await _written(conn, write(keys))
        return {
            "cursor": keys[-1] if len(keys) == batch else None,
            "keys": len(keys),
            "rows": rows,
            "blocked": blocked,
            "attempt": self.attempt,
        }

    async def _write(self, query: Query) -> dict[str, Any]:
        """The subject's own row: one step, one statement."""
        async with self.subject.connection() as conn:
            rows, blocked = await _written(conn, query)
        return {
            "cursor": None,
            "keys": 1,
            "rows": rows,
            "blocked": blocked,
            "attempt": self.attempt,
        }


async def _written(conn: Any, query: Query) -> tuple[int, bool]:
    """Run a write; answer ``(rows, blocked)``, blocked when a foreign key refused it."""
    try:
        cur = await conn.execute(*query)
    except ForeignKeyViolation:
        return 0, True
    return int(cur.rowcount), False


def _clear_name(plan: Plan, fk: ForeignKey) -> str:
    return f"{fk.child.shown(plan.home)}.{fk.name}"


async def subject_erase_tables(
    subject: Subject,
    key: Any,
    step: StepRunner,
    *,
    plan: Plan | None = None,
    attempt: int = 1,
) -> ErasedTables:
    """Run the erase's table passes alone, under the caller's context (no census, no targets).

    This is what ``subject_erase``'s job runs after its targets, and what a test harness
    (:func:`jobs_subject.testing.subject_proof`) drives directly.

    Args:
        subject: the declared subject.
        key: the subject's key (a tuple for a key of several columns).
        step: a step runner, ``await step.run(name, fn, *args)``: a job's ``step``, or any
            object that runs ``fn(*args)`` and answers its JSON form.
        plan: a plan already read; default one read now (refusals raised before any write).
        attempt: the job's attempt (bounds the rounds one attempt runs).

    Returns:
        :class:`ErasedTables`: rounds, and rows written per table and per cleared key.

    Raises:
        SubjectTableUndeclaredError: ``X_SUBJECT_TABLE_UNDECLARED`` (and the other refusals of
            :meth:`Subject.plan`), before any write.
        SubjectEraseBlockedError: ``X_SUBJECT_ERASE_BLOCKED`` after three rounds in which a
            foreign key refused a delete.
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the database cannot be reached.
    """
    chosen = plan if plan is not None else await subject.plan()
    return await _Passes(subject, chosen, key, attempt).run(step)


class _Erase:
    """One ``subject_erase`` declaration's settings and the code its body runs."""

    def __init__(self, subject: Subject, key: Callable[[Any], Any]) -> None:
        self.subject = subject
        self.key = key

    async def body(self, input: Any, step: Step, ctx: JobContext) -> EraseRecord:
        subject = self.subject
        key = self.key(input)
        plan = await subject.plan()
        statements = Statements(plan, subject.key_values(key))
        census = await step.run("census", self._census, plan, statements)
        assert isinstance(census, dict)
        targets: dict[str, dict[str, Any]] = {}
        for target, treatment in subject.targets:
            if treatment.kind == "retain":
                targets[target.name] = treatment.describe()
                continue
            erased = await step.run(
                step_name("target", target.name), self._target, target, statements
            )
            targets[target.name] = {"treatment": "delete", "erased": erased}
        passes = await subject_erase_tables(subject, key, step, plan=plan, attempt=ctx.attempt)
        finished = await step.run("finished", self._now)
        return {
            "subject": subject.name,
            "erased_at": str(finished),
            "rounds": passes["rounds"],
            "tables": {
                planned.shown: {
                    **planned.treatment.describe(),
                    "rows": census["tables"].get(planned.shown),
                }
                for planned in plan.tables
            },
            "cleared": {
                name: {"columns": list(clear.columns), "rows": census["cleared"].get(name)}
                for clear in plan.clears
                for name in [_clear_name(plan, clear.key)]
            },
            "targets": targets,
        }

    async def _census(self, plan: Plan, statements: Statements) -> dict[str, dict[str, int]]:
        """Count the subject's rows in each planned table and under each loop key (no write)."""
        async with self.subject.connection() as conn:
            tables = {}
            for planned in plan.tables:
                cur = await conn.execute(*statements.count_members(planned.table.name))
                tables[planned.shown] = int((await cur.fetchone())[0])
            cleared = {}
            for clear in plan.clears:
                cur = await conn.execute(*statements.count_linked(clear.key))
                cleared[_clear_name(plan, clear.key)] = int((await cur.fetchone())[0])
        return {"tables": tables, "cleared": cleared}

    async def _target(self, target: SubjectTarget, statements: Statements) -> int | None:
        row = await subject_row(self.subject, statements)
        if row is None:
            return None  # the row is gone: this run erased it after its targets, or another did
        erased = await call(target.erase, row)
        return erased if isinstance(erased, int) and not isinstance(erased, bool) else None

    async def _now(self) -> str:
        async with self.subject.connection() as conn:
            cur = await conn.execute(block("now"))
            return str((await cur.fetchone())[0].isoformat())


async def subject_row(subject: Subject, statements: Statements) -> dict[str, Any] | None:
    """Read the subject's own row (every column), fresh; ``None`` when it is gone."""
    columns = [c.name for c in statements.plan.subject.columns]
    async with subject.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(*statements.select_subject(columns))
        found = await cur.fetchone()
    return None if found is None else dict(found)


def subject_erase(
    *,
    name: str,
    input: Any,
    tenant: Callable[[Any], str] | Literal["none"],
    subject: Subject,
    key: Callable[[Any], Any] | None = None,
    idempotency_key: Callable[[Any], str] | None = None,
    queue: str = "default",
    retry: Retry | None = None,
    timeout: Any = None,
    concurrency: int | Concurrency | None = None,
    on_settled: Callable[[Settled], Any] | None = None,
    registry: JobRegistry | None = None,
) -> JobHandle[Any, EraseRecord]:
    """Declare a job that erases one subject: its targets, then its rows, children first.

    Each run reads the plan from the catalog when an attempt starts and refuses before touching
    a row (``X_SUBJECT_TABLE_UNDECLARED``, ``X_SUBJECT_TREATMENT_INVALID``,
    ``X_SUBJECT_CYCLE``, ``X_SUBJECT_DECLARATION_INVALID``; all terminal). Its result is an
    :class:`EraseRecord`.

    Args:
        name: the job's durable name (required).
        input: the input type (a pydantic model or any type ``TypeAdapter`` takes).
        tenant: ``(input) -> org id``, or ``"none"``.
        subject: what :func:`~jobs_subject.define_subject` answered.
        key: ``(input) -> the subject's key`` (a tuple for a key of several columns); may be
            left out when the input model has exactly one field, which is then the key.
        idempotency_key: ``(input) -> str``; default ``"erase:<subject>:<key>"``: one live erase
            per person.
        queue: the queue (default ``"default"``).
        retry: the :class:`~jobs_core.Retry` policy; a killed attempt resumes at its step.
        timeout: whole-attempt deadline.
        concurrency: fleet-wide cap, as for :func:`jobs_core.job`.
        on_settled: hook told once per ending.
        registry: the job registry to join (default the process-wide one).

    Returns:
        The job's handle; ``await handle.enqueue(input)`` erases one person.

    Raises:
        JobDeclarationInvalidError: ``X_JOB_DECLARATION_INVALID`` listing every bad field.
        TenantRequiredError: ``X_JOB_TENANT_REQUIRED`` without ``tenant``.
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.
    """
    site = caller_site()
    problems: list[str] = []
    check_subject(subject, problems)
    reader = key_reader(input, key, problems)
    erase = _Erase(subject, reader)

    def default_key(i: Any) -> str:
        return "erase:" + subject.name + ":" + ",".join(subject.key_values(reader(i)))

    options = {
        "name": name,
        "input": input,
        "tenant": tenant,
        "idempotency_key": idempotency_key or default_key,
        "queue": queue,
        "retry": retry,
        "timeout": timeout,
        "concurrency": concurrency,
        "on_settled": on_settled,
    }
    return declare("subject_erase", options, problems, erase.body, site, registry)


__all__ = [
    "MAX_FRESH_ROUNDS",
    "EraseRecord",
    "ErasedTables",
    "StepRunner",
    "step_name",
    "subject_erase",
    "subject_erase_tables",
    "subject_row",
]
