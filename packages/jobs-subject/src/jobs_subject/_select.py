"""A plan's statements: the blocks of ``subject.sql`` filled for its tables and keys.

A table's rows of the subject are found by *membership*: the subject's own row by its key, any
other planned row by referencing, through one of its membership keys, a row of the parent that
is itself the subject's (a nested ``EXISTS`` up to the subject's key). A page is a page of a
parent's keys among the subject's rows, in key order after a cursor, read as text; each write
then names that key list, so it is one ``DELETE`` or ``UPDATE ... WHERE (key) IN (list)``.

Every value (the subject's key, a cursor, a key list, an ANONYMIZE value) is a parameter sent as
text and cast to its column's type, so a comparison uses the column's own type and its index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from psycopg import sql

from jobs_subject._catalog import ForeignKey, Table, TableName
from jobs_subject._plan import Plan, PlannedTable
from jobs_subject._sql import block, fragment

Query = tuple[sql.Composed, dict[str, Any]]
"""A statement and its parameters."""


def table_ident(name: TableName) -> sql.Identifier:
    """The table's qualified, quoted name."""
    return sql.Identifier(name.schema, name.name)


def _cols(alias: str, columns: Iterable[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(alias, c) for c in columns)


def _type(table: Table, column: str) -> sql.SQL:
    found = table.column(column)
    assert found is not None, f"{table.name}.{column} was planned"
    return fragment(found.type)


def _casts(table: Table, columns: Sequence[str], prefix: str) -> sql.Composed:
    """``%(prefix0)s::type0, ...``: one text parameter per column, cast to its type."""
    return sql.SQL(", ").join(
        sql.SQL("{}::{}").format(sql.Placeholder(f"{prefix}{i}"), _type(table, c))
        for i, c in enumerate(columns)
    )


def _arrays(table: Table, columns: Sequence[str]) -> sql.Composed:
    """``%(a0)s::text[]::type0[], ...``: a key list as one text array per column."""
    return sql.SQL(", ").join(
        sql.SQL("{}::text[]::{}[]").format(sql.Placeholder(f"a{i}"), _type(table, c))
        for i, c in enumerate(columns)
    )


def _array_params(keys: Sequence[Sequence[str]], width: int) -> dict[str, Any]:
    return {f"a{i}": [key[i] for key in keys] for i in range(width)}


class Statements:
    """The statements of one plan for one subject key.

    Args:
        plan: the plan.
        key: the subject's key as text, one per key column (``Subject.key_values``).
    """

    def __init__(self, plan: Plan, key: Sequence[str]) -> None:
        self.plan = plan
        self.tables: dict[TableName, PlannedTable] = {p.table.name: p for p in plan.tables}
        self.key_params = {f"k{i}": value for i, value in enumerate(key)}

    def member(self, name: TableName, alias: str, depth: int = 0) -> sql.Composable:
        """The condition that the row ``alias`` of table ``name`` is the subject's."""
        if name == self.plan.subject.name:
            return block("member_key").format(
                columns=_cols(alias, self.plan.key),
                values=_casts(self.plan.subject, self.plan.key, "k"),
            )
        keys = self.tables[name].keys
        joined = sql.SQL(" OR ").join(self.via(fk, alias, depth) for fk in keys)
        return sql.SQL("({})").format(joined)

    def via(self, fk: ForeignKey, alias: str, depth: int = 0) -> sql.Composed:
        """The condition that row ``alias`` references a row of the subject through ``fk``."""
        parent = f"m{depth + 1}"
        join = sql.SQL(" AND ").join(
            sql.SQL("{} = {}").format(sql.Identifier(parent, pc), sql.Identifier(alias, c))
            for pc, c in zip(fk.parent_columns, fk.columns, strict=True)
        )
        return block("member_edge").format(
            parent=table_ident(fk.parent),
            alias=sql.Identifier(parent),
            join=join,
            member=self.member(fk.parent, parent, depth + 1),
        )

    def parent_page(self, fk: ForeignKey, cursor: Sequence[str] | None, batch: int) -> Query:
        """One page of ``fk``'s parent keys among the subject's rows, after ``cursor``."""
        parent = self.tables[fk.parent].table
        columns = fk.parent_columns
        after: sql.Composable = sql.SQL("")
        params: dict[str, Any] = {**self.key_params, "batch": batch}
        if cursor is not None:
            after = block("after").format(
                columns=_cols("p", columns), cursor=_casts(parent, columns, "c")
            )
            params.update({f"c{i}": value for i, value in enumerate(cursor)})
        query = block("parent_page").format(
            keys=sql.SQL(", ").join(
                sql.SQL("{}::text").format(sql.Identifier("p", c)) for c in columns
            ),
            parent=table_ident(fk.parent),
            not_null=sql.SQL(" AND ").join(
                sql.SQL("{} IS NOT NULL").format(sql.Identifier("p", c)) for c in columns
            ),
            member=self.member(fk.parent, "p"),
            after=after,
            order=_cols("p", columns),
        )
        return query, params

    def delete_page(self, child: Table, fk: ForeignKey, keys: Sequence[Sequence[str]]) -> Query:
        """Delete ``child``'s rows whose ``fk`` columns are in the key list."""
        query = block("delete_page").format(
            table=table_ident(child.name),
            columns=_cols("t", fk.columns),
            arrays=_arrays(child, fk.columns),
        )
        return query, _array_params(keys, len(fk.columns))

    def update_page(
        self,
        child: Table,
        fk: ForeignKey,
        keys: Sequence[Sequence[str]],
        values: Mapping[str, Any],
    ) -> Query:
        """Set ``values`` (``None`` for NULL) on ``child``'s rows whose ``fk`` is in the list."""
        assignments, params = self._assignments(child, values)
        query = block("update_page").format(
            table=table_ident(child.name),
            assignments=assignments,
            columns=_cols("t", fk.columns),
            arrays=_arrays(child, fk.columns),
        )
        return query, {**params, **_array_params(keys, len(fk.columns))}

    def write_subject(self, values: Mapping[str, Any] | None) -> Query:
        """Delete the subject's own row, or (with ``values``) anonymise it."""
        subject = self.plan.subject
        member = self.member(subject.name, "t")
        if values is None:
            return block("delete_subject").format(
                table=table_ident(subject.name), member=member
            ), dict(self.key_params)
        assignments, params = self._assignments(subject, values)
        query = block("update_subject").format(
            table=table_ident(subject.name), assignments=assignments, member=member
        )
        return query, {**params, **self.key_params}

    def _assignments(
        self, table: Table, values: Mapping[str, Any]
    ) -> tuple[sql.Composed, dict[str, Any]]:
        parts: list[sql.Composable] = []
        params: dict[str, Any] = {}
        for i, (column, value) in enumerate(sorted(values.items())):
            if value is None:
                parts.append(sql.SQL("{} = NULL").format(sql.Identifier(column)))
            else:
                parts.append(
                    sql.SQL("{} = {}::{}").format(
                        sql.Identifier(column), sql.Placeholder(f"v{i}"), _type(table, column)
                    )
                )
                params[f"v{i}"] = value_text(value)
        return sql.SQL(", ").join(parts), params

    def count_members(self, name: TableName) -> Query:
        """How many of table ``name``'s rows are the subject's."""
        query = block("count_members").format(
            table=table_ident(name), member=self.member(name, "t")
        )
        return query, dict(self.key_params)

    def count_linked(self, fk: ForeignKey) -> Query:
        """How many rows of ``fk``'s table reference the subject's rows through ``fk``."""
        query = block("count_linked").format(table=table_ident(fk.child), linked=self.via(fk, "t"))
        return query, dict(self.key_params)

    def select_page(
        self, planned: PlannedTable, index: int, keys: Sequence[Sequence[str]]
    ) -> Query:
        """The export of one page: ``planned``'s rows in the key list of its ``index``-th key.

        A row an earlier membership key of the table already reaches is left to that key's
        pages, so a row reached twice is exported once.
        """
        table = planned.table
        fk = planned.keys[index]
        earlier = [sql.SQL(" AND NOT {}").format(self.via(k, "t")) for k in planned.keys[:index]]
        query = block("select_page").format(
            columns=_cols("t", planned.export_columns),
            table=table_ident(table.name),
            keys=_cols("t", fk.columns),
            arrays=_arrays(table, fk.columns),
            not_earlier=sql.Composed(earlier),
            order=_cols("t", table.primary_key or planned.export_columns),
        )
        return query, {**self.key_params, **_array_params(keys, len(fk.columns))}

    def select_subject(self, columns: Sequence[str]) -> Query:
        """The subject's own row, ``columns`` of it."""
        subject = self.plan.subject
        query = block("select_subject").format(
            columns=_cols("t", columns),
            table=table_ident(subject.name),
            member=self.member(subject.name, "t"),
        )
        return query, dict(self.key_params)


def value_text(value: Any) -> str:
    """An ANONYMIZE value as the text the database casts (``Treatment`` checked its kind)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


__all__ = ["Query", "Statements", "table_ident", "value_text"]
