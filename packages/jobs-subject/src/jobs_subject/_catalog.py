"""What the plan is made from: the database's tables and foreign keys, read from ``pg_catalog``.

:func:`read_catalog` runs two statements (``foreign_keys``, ``tables``) in one read-only
transaction and answers a :class:`Catalog`, plain frozen data that :func:`~jobs_subject.
plan_subject` plans from without touching the database, so the planner is tested on catalogs
built by hand as well as on real ones.

Rejected: ``information_schema``. Its views do not expose the column list of PostgreSQL 15's
``ON DELETE SET NULL (columns)``, hide tables the role cannot write and are several times slower
to query; ``pg_catalog`` has every fact the plan needs and nothing is inferred.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jobs_subject._sql import block

OnDelete = Literal["no action", "restrict", "cascade", "set null", "set default"]

_ON_DELETE: dict[str, OnDelete] = {
    "a": "no action",
    "r": "restrict",
    "c": "cascade",
    "n": "set null",
    "d": "set default",
}


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A table, qualified: ``schema`` and ``name`` as the catalog spells them."""

    schema: str
    name: str

    def shown(self, home: str) -> str:
        """Answer ``name`` when the table lives in ``home``, else ``schema.name``."""
        return self.name if self.schema == home else f"{self.schema}.{self.name}"


@dataclass(frozen=True, slots=True)
class Column:
    """One column.

    Attributes:
        name: its name.
        type: its type as ``format_type`` spells it (``integer``, ``character varying(40)``),
            used to cast text parameters so comparisons use the column's own type and index.
        not_null: whether it is ``NOT NULL``.
        generated: whether a write may not set it (a generated column, an identity ``ALWAYS``).
    """

    name: str
    type: str
    not_null: bool = False
    generated: bool = False


@dataclass(frozen=True, slots=True)
class Table:
    """One table's columns and keys.

    Attributes:
        name: the qualified name.
        columns: every column, in table order.
        primary_key: the primary key's columns (empty without one).
        unique_keys: every unique key (the primary key first), each a tuple of columns.
    """

    name: TableName
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()

    def column(self, name: str) -> Column | None:
        """Answer the column called ``name``, or ``None``."""
        for column in self.columns:
            if column.name == name:
                return column
        return None


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """One foreign key: ``child(columns)`` references ``parent(parent_columns)``.

    Attributes:
        name: the constraint's name (unique within its table).
        child: the referencing table.
        columns: the referencing columns, in key order.
        parent: the referenced table.
        parent_columns: the referenced columns (a unique key of ``parent``), in key order.
        on_delete: what deleting a referenced row does to the referencing rows.
        set_columns: the columns ``SET NULL``/``SET DEFAULT`` changes (all of ``columns``
            unless the key names a list); empty for the other actions.
        match_full: ``MATCH FULL`` (a key is either all NULL or all set); else ``MATCH SIMPLE``,
            where one NULL column means the row references nothing.
    """

    name: str
    child: TableName
    columns: tuple[str, ...]
    parent: TableName
    parent_columns: tuple[str, ...]
    on_delete: OnDelete = "no action"
    set_columns: tuple[str, ...] = ()
    match_full: bool = False

    def describe(self, home: str) -> str:
        """Answer ``child(columns) -> parent(parent_columns)`` for messages and plans."""
        return (
            f"{_columns(self.child.shown(home), self.columns)} -> "
            f"{_columns(self.parent.shown(home), self.parent_columns)}"
        )


@dataclass(frozen=True, slots=True)
class Catalog:
    """The tables and foreign keys a plan is made from.

    Attributes:
        tables: every table the plan may need, by qualified name.
        foreign_keys: every foreign key of the database.
    """

    tables: Mapping[TableName, Table]
    foreign_keys: tuple[ForeignKey, ...]


def _columns(table: str, columns: tuple[str, ...]) -> str:
    return f"{table}.{columns[0]}" if len(columns) == 1 else f"{table}({', '.join(columns)})"


def key_path(path: Iterable[ForeignKey], home: str) -> str:
    """Answer how a table is reached: ``users.id <- orders.user_id <- items.order_id``.

    Each hop names the referenced columns, then the referencing ones; a composite key is
    written ``teams(org_id, id) <- members(org_id, team_id)``.
    """
    hops = list(path)
    if not hops:
        return ""
    parts = [_columns(hops[0].parent.shown(home), hops[0].parent_columns)]
    for hop in hops:
        parts.append(_columns(hop.child.shown(home), hop.columns))
    return " <- ".join(parts)


async def read_catalog(
    conn: Any, *, names: Iterable[TableName] = (), schemas: Iterable[str] = ()
) -> Catalog:
    """Read every foreign key and the tables a plan may need from ``pg_catalog``.

    Args:
        conn: a psycopg ``AsyncConnection`` (autocommit; the reads run in one read-only
            transaction so they see one state of the catalog).
        names: tables to read besides every table a foreign key names (the subject's, the
            declared ones).
        schemas: schemas whose every table is read too (``subject_proof`` checks them all).

    Returns:
        The :class:`Catalog`. A named table that does not exist is simply absent.

    Raises:
        psycopg.Error: as the server raises it (the caller's driver turns a lost connection into
            ``X_DRIVER_UNAVAILABLE``).
    """
    async with conn.transaction():
        await conn.execute("SET TRANSACTION READ ONLY")
        cur = await conn.execute(block("foreign_keys"))
        keys = tuple(_foreign_key(row) for row in await cur.fetchall())
        wanted = set(names)
        for fk in keys:
            wanted.add(fk.child)
            wanted.add(fk.parent)
        ordered = sorted(wanted)
        cur = await conn.execute(
            block("tables"),
            {
                "schemas": [t.schema for t in ordered],
                "names": [t.name for t in ordered],
                "whole": sorted(set(schemas)),
            },
        )
        tables = {table.name: table for table in map(_table, await cur.fetchall())}
    return Catalog(tables=tables, foreign_keys=keys)


def _foreign_key(row: Any) -> ForeignKey:
    name, cschema, ctable, pschema, ptable, columns, parent_columns, action, match, sets = row
    on_delete = _ON_DELETE[action]
    columns = tuple(columns)
    sets_some = on_delete in ("set null", "set default")
    set_columns = (tuple(sets) or columns) if sets_some else ()
    return ForeignKey(
        name=name,
        child=TableName(cschema, ctable),
        columns=columns,
        parent=TableName(pschema, ptable),
        parent_columns=tuple(parent_columns),
        on_delete=on_delete,
        set_columns=set_columns,
        match_full=match == "f",
    )


def _table(row: Any) -> Table:
    schema, name, columns, unique_keys = row
    keys = tuple(tuple(key["columns"]) for key in unique_keys if key["columns"])
    primary = next((tuple(key["columns"]) for key in unique_keys if key["primary"]), ())
    return Table(
        name=TableName(schema, name),
        columns=tuple(
            Column(c["name"], c["type"], bool(c["not_null"]), bool(c["generated"])) for c in columns
        ),
        primary_key=primary,
        unique_keys=keys,
    )


__all__ = [
    "Catalog",
    "Column",
    "ForeignKey",
    "OnDelete",
    "Table",
    "TableName",
    "key_path",
    "read_catalog",
]
