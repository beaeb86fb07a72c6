"""Test helpers: ``subject_proof`` seeds a graph, erases one subject, and proves the outcome.

The proof is decided by digests the database computes, not by counting what the erase says it
did. Before the erase it renders, for every table of the plan, the rows that must be left
afterwards, as the erase must leave them: every other person's rows as they are, except a
loop-closing key that pointed at the subject's rows (now NULL); a RETAIN or ANONYMIZE table's
rows of the subject with their ANONYMIZE values and the ``ON DELETE SET NULL`` the database
applies; nothing of the subject in a DELETE table. Each rendering is digested (``md5`` over the
sorted row texts). After the erase the same digest of each whole table must be equal, and every
table of the subject's schema the plan does not reach must be unchanged. A table where the seed
gave the subject no rows fails the proof: nothing was shown there.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from jobs_subject._catalog import ForeignKey, Table, TableName, read_catalog
from jobs_subject._declare import call
from jobs_subject._erase import ErasedTables, subject_erase_tables
from jobs_subject._plan import Plan, PlannedTable
from jobs_subject._select import Query, Statements, table_ident, value_text
from jobs_subject._sql import block, fragment
from jobs_subject._subject import Subject

Seed = Callable[[Any], Awaitable[Any] | Any]
"""``seed(conn) -> key``: writes the graph on the connection and answers whose to erase."""


class LocalStep:
    """A step runner for harnesses: runs ``fn(*args)`` and answers its JSON form.

    Like a job's step it refuses a repeated name and answers what JSON keeps of the output, but
    it stores nothing: a run through it cannot be resumed.
    """

    def __init__(self) -> None:
        self.names: list[str] = []

    async def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (awaited when it is a coroutine function); answer its JSON form.

        Raises:
            AssertionError: ``name`` was already run by this runner.
        """
        assert name not in self.names, f"step {name!r} ran twice"
        self.names.append(name)
        return json.loads(json.dumps(await call(fn, *args)))


@dataclass(frozen=True, slots=True)
class TableProof:
    """What the proof found in one table.

    Attributes:
        treatment: ``"delete"``, ``"retain"``, ``"anonymize"``, or ``"untouched"`` for a table
            of the schema the plan does not reach.
        subject_rows: the subject's rows before the erase.
        other_rows: everyone else's rows before the erase.
        rows_after: the table's rows after it.
        proven: whether the table ended exactly as the erase must leave it.
    """

    treatment: str
    subject_rows: int
    other_rows: int
    rows_after: int
    proven: bool


@dataclass(frozen=True, slots=True)
class ProofReport:
    """The outcome of :func:`subject_proof` (it raised unless every table is proven).

    Attributes:
        key: the subject's key the seed answered.
        tables: ``{table: TableProof}`` for every planned and every untouched table.
        erased: what :func:`~jobs_subject.subject_erase_tables` answered.
        unverified: ``{table: [column, ...]}`` left out of the digests (generated columns, and
            ``ON DELETE SET DEFAULT`` columns of kept rows, whose values the database decides).
    """

    key: Any
    tables: dict[str, TableProof]
    erased: ErasedTables
    unverified: dict[str, list[str]] = field(default_factory=dict)


async def subject_proof(subject: Subject, seed: Seed) -> ProofReport:
    """Seed a graph, erase one subject, and prove what is left.

    Args:
        subject: the declared subject (its ``driver``, or the installed one, reaches the
            database).
        seed: ``seed(conn) -> key`` (sync or async) writes the rows of several people on the
            autocommit connection it is given and answers the key of the one to erase.

    Returns:
        The :class:`ProofReport`.

    Raises:
        AssertionError: a planned table does not end as the erase must leave it (some of the
            subject's rows remain, another person's rows changed, a RETAIN table lost rows), a
            table outside the plan changed, or the seed gave the subject no rows in a planned
            table. The message names each table.
        SubjectTableUndeclaredError: ``X_SUBJECT_TABLE_UNDECLARED`` (and the plan's other
            refusals): the declaration does not cover the seeded schema.
    """
    async with subject.connection() as conn:
        key = await call(seed, conn)
        plan = await subject.plan(conn)
        statements = Statements(plan, subject.key_values(key))
        catalog = await read_catalog(conn, schemas=[plan.home])
        planned_names = {p.table.name for p in plan.tables}
        untouched = [t for n, t in sorted(catalog.tables.items()) if n not in planned_names]
        renders = _Renders(plan, statements)
        expected: dict[str, tuple[str, int, int, int]] = {}
        for planned in plan.tables:
            digest, count = await _value(conn, renders.expected(planned))
            members = await _count(conn, statements.count_members(planned.table.name))
            total = await _count(conn, renders.count_all(planned.table))
            expected[planned.shown] = (digest, count, members, total - members)
        for table in untouched:
            digest, count = await _value(conn, renders.actual(table))
            expected[table.name.shown(plan.home)] = (digest, count, 0, count)
    erased = await subject_erase_tables(subject, key, LocalStep(), plan=plan)
    tables: dict[str, TableProof] = {}
    async with subject.connection() as conn:
        for table in [p.table for p in plan.tables] + untouched:
            shown = table.name.shown(plan.home)
            digest, count = await _value(conn, renders.actual(table))
            want, _, members, others = expected[shown]
            treatment = (
                plan.table(shown).treatment.kind if table.name in planned_names else "untouched"
            )
            tables[shown] = TableProof(treatment, members, others, count, digest == want)
    _judge(plan, tables)
    return ProofReport(key=key, tables=tables, erased=erased, unverified=renders.unverified)


def _judge(plan: Plan, tables: dict[str, TableProof]) -> None:
    failures = []
    for shown, proof in tables.items():
        if not proof.proven:
            failures.append(f"{shown} ({proof.treatment}) does not end as the erase must leave it")
        if proof.treatment != "untouched" and proof.subject_rows == 0:
            failures.append(f"the seed gave the subject no rows in {shown}: nothing shown there")
    if failures:
        raise AssertionError(
            f"subject_proof of {plan.subject.name.shown(plan.home)}: " + "; ".join(failures)
        )


class _Renders:
    """The digest queries of one plan: each table's rows rendered as text, masked as due."""

    def __init__(self, plan: Plan, statements: Statements) -> None:
        self.plan = plan
        self.statements = statements
        self.unverified: dict[str, list[str]] = {}
        self.clears: dict[TableName, list[tuple[ForeignKey, tuple[str, ...]]]] = {}
        for clear in plan.clears:
            self.clears.setdefault(clear.child.name, []).append((clear.key, clear.columns))

    def _columns(self, table: Table) -> list[str]:
        """The columns digested: all but those whose values the database decides."""
        left_out = {c.name for c in table.columns if c.generated}
        planned = self._planned(table.name)
        if planned is not None and not planned.treatment.deletes:
            for fk in planned.keys:
                if fk.on_delete == "set default":
                    left_out.update(fk.set_columns)
        if left_out:
            self.unverified[table.name.shown(self.plan.home)] = sorted(left_out)
        return [c.name for c in table.columns if c.name not in left_out]

    def _planned(self, name: TableName) -> PlannedTable | None:
        return next((p for p in self.plan.tables if p.table.name == name), None)

    def _rows(
        self, table: Table, expressions: list[sql.Composable], condition: sql.Composable
    ) -> sql.Composed:
        return block("rendered_rows").format(
            expressions=sql.SQL(", ").join(expressions),
            table=table_ident(table.name),
            condition=condition,
        )

    def _masked(self, table: Table, column: str, kept: bool) -> sql.Composable:
        """Column ``column`` as the erase leaves it on a row (``kept``: a subject's kept row)."""
        ref: sql.Composable = sql.Identifier("t", column)
        for fk, columns in self.clears.get(table.name, []):
            if column in columns:
                ref = sql.SQL("CASE WHEN {} THEN NULL ELSE {} END").format(
                    self.statements.via(fk, "t"), ref
                )
        if not kept:
            return ref
        planned = self._planned(table.name)
        assert planned is not None
        values = planned.treatment.values
        if column in values:
            if values[column] is None:
                return sql.SQL("NULL")
            column_type = table.column(column)
            assert column_type is not None
            return sql.SQL("{}::{}").format(
                sql.Literal(value_text(values[column])), fragment(column_type.type)
            )
        for fk in planned.keys:
            parent = self._planned(fk.parent)
            deleted = parent is not None and parent.treatment.deletes
            if deleted and fk.on_delete == "set null" and column in fk.set_columns:
                ref = sql.SQL("CASE WHEN {} THEN NULL ELSE {} END").format(
                    self.statements.via(fk, "t"), ref
                )
        return ref

    def expected(self, planned: PlannedTable) -> Query:
        """The digest of ``planned``'s rows as the erase must leave them."""
        table = planned.table
        columns = self._columns(table)
        member = self.statements.member(table.name, "t")
        parts = [
            self._rows(
                table,
                [self._masked(table, c, False) for c in columns],
                sql.SQL("NOT {}").format(member),
            )
        ]
        if not planned.treatment.deletes:
            parts.append(self._rows(table, [self._masked(table, c, True) for c in columns], member))
        rows = sql.SQL(" UNION ALL ").join(parts)
        return block("checksum").format(rows=rows), dict(self.statements.key_params)

    def actual(self, table: Table) -> Query:
        """The digest of ``table``'s rows as they are."""
        expressions: list[sql.Composable] = [sql.Identifier("t", c) for c in self._columns(table)]
        rows = self._rows(table, expressions, sql.SQL("true"))
        return block("checksum").format(rows=rows), {}

    def count_all(self, table: Table) -> Query:
        """How many rows ``table`` holds."""
        return block("count_members").format(
            table=table_ident(table.name), member=sql.SQL("true")
        ), {}


async def _value(conn: Any, query: Query) -> tuple[str, int]:
    cur = await conn.execute(*query)
    digest, count = await cur.fetchone()
    return str(digest), int(count)


async def _count(conn: Any, query: Query) -> int:
    cur = await conn.execute(*query)
    return int((await cur.fetchone())[0])


__all__ = ["LocalStep", "ProofReport", "Seed", "TableProof", "subject_proof"]
