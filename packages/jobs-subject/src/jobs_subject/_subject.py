"""``define_subject``: the person, declared once, whom the export and erase factories take.

A :class:`Subject` names the subject's table and key, a treatment for every table that hangs
off it, its targets and the columns its exports include. Nothing is checked against the
database here (a declaration is imported by processes that never connect); every run reads the
catalog when it starts and plans with :func:`~jobs_subject.plan_subject`, so a table added
after the declaration is refused by the next run, named, before it touches a row.

Subjects are registered by name in the process (:data:`SUBJECTS`), which is how
``jobsctl subject plan NAME`` finds one after importing the app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any
from uuid import UUID

from jobs_core import current_driver
from jobs_core.errors import NotImplementedByDriverError, SubjectDeclarationInvalidError
from jobs_core.job import declaration_site
from jobs_pg import PostgresDriver
from jobs_subject._catalog import read_catalog
from jobs_subject._plan import Plan, plan_subject, resolve
from jobs_subject._select import value_text
from jobs_subject._target import SubjectTarget, TargetEntry
from jobs_subject._treatment import Treatment

DEFAULT_BATCH = 500
"""Parent keys per page (and so per step) unless ``batch=`` says otherwise."""


@dataclass(frozen=True, eq=False)
class Subject:
    """A declared subject (build it with :func:`define_subject`).

    Attributes:
        name: the name ``jobsctl subject plan NAME`` knows it by.
        table: the subject's table (``name`` or ``schema.name``).
        key: its key columns (a unique key of the table).
        schema: the schema unqualified table names resolve in.
        tables: ``{table: Treatment}``.
        targets: ``(target, treatment)`` pairs, in declared order.
        columns: ``{table: exported columns}``; a table not named exports every column.
        batch: parent keys per page.
        driver: the PostgreSQL driver whose connections reach the tables, or ``None`` for the
            driver installed when a run starts (the worker's).
    """

    name: str
    table: str
    key: tuple[str, ...]
    schema: str
    tables: Mapping[str, Treatment]
    targets: tuple[tuple[SubjectTarget, Treatment], ...]
    columns: Mapping[str, tuple[str, ...]]
    batch: int
    driver: PostgresDriver | None = field(default=None, repr=False)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """Lend a connection to the subject's database (autocommit, time zone UTC).

        Raises:
            NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when no driver was given and the
                installed one is not PostgreSQL.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the server cannot be reached.
        """
        driver = self.driver if self.driver is not None else current_driver()
        if not isinstance(driver, PostgresDriver):
            raise NotImplementedByDriverError(
                f"subject {self.name!r} reads its tables through a PostgreSQL driver; the "
                f"installed driver is {getattr(driver, 'name', type(driver).__name__)!r}: pass "
                "define_subject(driver=PostgresDriver(...)) or run on postgresql://",
                subject=self.name,
            )
        async with driver.connection() as conn:
            yield conn

    async def plan(self, conn: Any | None = None) -> Plan:
        """Read the catalog and plan (every refusal raised before any row is touched).

        Args:
            conn: a connection to read on; default one of :meth:`connection`.

        Raises:
            SubjectDeclarationInvalidError: ``X_SUBJECT_DECLARATION_INVALID``.
            SubjectTableUndeclaredError: ``X_SUBJECT_TABLE_UNDECLARED``.
            SubjectTreatmentInvalidError: ``X_SUBJECT_TREATMENT_INVALID``.
            SubjectCycleError: ``X_SUBJECT_CYCLE``.
        """
        if conn is None:
            async with self.connection() as lent:
                return await self.plan(lent)
        names = [resolve(self.table, self.schema)]
        names += [resolve(name, self.schema) for name in self.tables]
        catalog = await read_catalog(conn, names=names)
        return plan_subject(catalog, self)

    def key_values(self, key: Any) -> list[str]:
        """Answer the subject's key as text, one per key column (cast back by the database).

        Args:
            key: the value (or, for a key of several columns, a tuple or list of values):
                text, an int, a UUID, a Decimal, a bool, a date or datetime.

        Raises:
            SubjectDeclarationInvalidError: ``X_SUBJECT_DECLARATION_INVALID`` when the key has
                the wrong number of parts or a part of another kind (named by type, never
                quoted).
        """
        parts = list(key) if isinstance(key, tuple | list) else [key]
        if len(parts) != len(self.key):
            raise SubjectDeclarationInvalidError(
                f"subject {self.name!r} has a key of {len(self.key)} column(s) "
                f"({', '.join(self.key)}); the run's key has {len(parts)} part(s)",
                subject=self.name,
            )
        return [_key_text(self.name, part) for part in parts]


def _key_text(name: str, value: Any) -> str:
    if isinstance(value, str | int | UUID | Decimal | date):
        return value_text(value)
    raise SubjectDeclarationInvalidError(
        f"subject {name!r}: a key part must be text, an int, a UUID, a Decimal, a bool or a "
        f"date, not a {type(value).__name__}",
        subject=name,
    )


SUBJECTS: dict[str, Subject] = {}
"""Every subject this process declared, by name."""

_SITES: dict[str, tuple[str, int]] = {}


def define_subject(
    *,
    table: str,
    key: str | Sequence[str],
    tables: Mapping[str, Treatment] | None = None,
    driver: PostgresDriver | None = None,
    targets: Sequence[TargetEntry] = (),
    columns: Mapping[str, Sequence[str]] | None = None,
    batch: int = DEFAULT_BATCH,
    schema: str = "public",
    name: str | None = None,
) -> Subject:
    """Declare the person whose data ``subject_export`` exports and ``subject_erase`` erases.

    Args:
        table: the subject's table, ``"users"`` (in ``schema``) or ``"app.users"``. Its own
            row is deleted last, unless ``tables`` gives it ``Treatment.ANONYMIZE(...)``.
        key: the column (or columns) identifying the subject: a unique key of ``table``.
        tables: ``{table: Treatment}`` for every table that references the subject, directly
            or through tables the erase deletes. A referencing table left out refuses every
            run (``X_SUBJECT_TABLE_UNDECLARED``), so a table added next month cannot be
            forgotten.
        driver: the :class:`jobs_pg.PostgresDriver` whose connections reach these tables;
            default the driver installed when a run starts (a worker's ``--driver``).
        targets: the subject's data outside the database: :class:`SubjectTarget` objects
            (exported and erased), or ``(target, Treatment.RETAIN("why"))`` (exported only).
        columns: ``{table: [column, ...]}``, what an export includes of those tables (leave
            sealed columns, password hashes and tokens, out); a table not named exports every
            column.
        batch: parent keys per page, so per step (default 500).
        schema: where unqualified table names live (default ``public``).
        name: the subject's name for ``jobsctl subject plan`` (default ``table``).

    Returns:
        The :class:`Subject`.

    Raises:
        SubjectDeclarationInvalidError: ``X_SUBJECT_DECLARATION_INVALID`` listing every bad
            field, or when another declaration already holds ``name``.
        SubjectTreatmentInvalidError: ``X_SUBJECT_TREATMENT_INVALID`` for a target treated
            other than DELETE or RETAIN.
    """
    problems: list[str] = []
    if not isinstance(table, str) or not table.strip():
        problems.append("table: required, the subject's table name")
    keys = [key] if isinstance(key, str) else list(key) if isinstance(key, Sequence) else []
    if not keys or not all(isinstance(k, str) and k for k in keys):
        problems.append("key: required, a column name or a list of them")
    declared = dict(tables or {})
    for written, treatment in declared.items():
        if not isinstance(written, str) or not written:
            problems.append(f"tables: a table name must be non-empty text, got {written!r}")
        elif not isinstance(treatment, Treatment):
            problems.append(
                f"tables[{written!r}]: must be Treatment.DELETE, Treatment.RETAIN(...) or "
                f"Treatment.ANONYMIZE(...), got {type(treatment).__name__}"
            )
    if driver is not None and not isinstance(driver, PostgresDriver):
        problems.append(f"driver: must be a jobs_pg.PostgresDriver, got {type(driver).__name__}")
    chosen: dict[str, tuple[str, ...]] = {}
    for written, names in dict(columns or {}).items():
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            problems.append(f"columns[{written!r}]: a non-empty list of column names")
        elif len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            problems.append(f"columns[{written!r}]: column names must be unique non-empty text")
        else:
            chosen[written] = tuple(names)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        problems.append(f"batch: must be an int >= 1, got {batch!r}")
    if not isinstance(schema, str) or not schema:
        problems.append("schema: must be a schema name")
    paired = _targets(targets, problems)
    subject_name = name if name is not None else table
    if not isinstance(subject_name, str) or not subject_name.strip():
        problems.append("name: must be non-empty text")
    if problems:
        raise SubjectDeclarationInvalidError(
            f"define_subject({table!r}) is declared wrong: " + "; ".join(problems),
            problems=problems,
        )
    subject = Subject(
        name=subject_name,
        table=table,
        key=tuple(keys),
        schema=schema,
        tables=declared,
        targets=paired,
        columns=chosen,
        batch=batch,
        driver=driver,
    )
    _register(subject)
    return subject


def _targets(entries: Sequence[TargetEntry], problems: list[str]) -> tuple[tuple[Any, Any], ...]:
    paired: list[tuple[Any, Any]] = []
    for entry in entries:
        target, treatment = entry if isinstance(entry, tuple) else (entry, Treatment.DELETE)
        if not isinstance(target, SubjectTarget) or not isinstance(target.name, str):
            problems.append(
                f"targets: {type(target).__name__} is not a SubjectTarget (name, columns, "
                "export_page, erase)"
            )
            continue
        if not isinstance(treatment, Treatment) or treatment.kind == "anonymize":
            problems.append(
                f"targets: {target.name!r} must be erased or (target, Treatment.RETAIN('why'))"
            )
            continue
        paired.append((target, treatment))
    names = [target.name for target, _ in paired]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        problems.append(f"targets: names must be unique, {twice} appear more than once")
    return tuple(paired)


def _register(subject: Subject) -> None:
    """Register ``subject`` by name; the same call site again (a reload) replaces it."""
    # declaration_site <- _register <- define_subject <- the declaring code
    site = declaration_site(skip=1)
    held = _SITES.get(subject.name)
    if subject.name in SUBJECTS and held != site:
        where = f"{held[0]}:{held[1]}" if held else "another declaration"
        raise SubjectDeclarationInvalidError(
            f"two subjects are named {subject.name!r}: {where} and {site[0]}:{site[1]}; give "
            "one of them another name=",
            subject=subject.name,
        )
    SUBJECTS[subject.name] = subject
    _SITES[subject.name] = site


__all__ = ["DEFAULT_BATCH", "SUBJECTS", "Subject", "define_subject"]
