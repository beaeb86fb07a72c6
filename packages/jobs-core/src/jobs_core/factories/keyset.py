"""Keyset paging over a PostgreSQL table: the ready source of :func:`~jobs_core.backfill`.

Each page is ``WHERE <where> AND (k1, k2) > (<cursor>) ORDER BY k1, k2 LIMIT <batch>``: an index
seek on the key, however deep the pass is. ``OFFSET`` paging was rejected: every page re-reads
and discards all the rows before it (a million-row pass reads half a billion rows), and rows
inserted or changed behind the offset shift the pages, so rows are skipped or handled twice.

The cursor is the JSON form of the last row's key values, e.g. ``[1041]`` or
``["acme", "3f2a…"]``; PostgreSQL casts each back to its column's type. Key columns must be
``NOT NULL`` (a NULL key compares as unknown and its row would never be reached) and unique
together (the primary key is the usual choice).

psycopg is imported when a source is first used, so jobs-core keeps no dependency on it; install
``jobs-core[pg]``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, cast, runtime_checkable

from jobs_core.errors import BackfillSourceInvalidError
from jobs_core.serialization import to_json_form
from jobs_core.types import JSONValue

Connect = Any
"""How a source reaches its database: a libpq conninfo string (a connection per use), a callable
answering a psycopg ``AsyncConnection`` or an awaitable of one (closed after each use), a callable
answering an async context manager of one (``pool.connection``), or a psycopg_pool
``AsyncConnectionPool`` (a connection borrowed per use)."""


@runtime_checkable
class BackfillSource(Protocol):
    """What a backfill reads its pages from (``source=``): :func:`keyset` is the ready one.

    A source may also have ``async count() -> int`` (the rows it would page through, for a dry
    run) and ``describe() -> dict`` (what identifies it, for the ledger's checksum).
    """

    async def read(self, cursor: JSONValue, limit: int) -> tuple[list[Any], JSONValue]:
        """Answer up to ``limit`` rows after ``cursor`` (``None``: the start) and the next cursor.

        The next cursor is ``None`` when no row follows (a short page ends the pass).
        """
        ...


def _pool_lender(connect: object) -> Callable[[], Any] | None:
    """Answer a pool's ``connection`` method (a connection itself has ``execute`` too)."""
    pooled = getattr(connect, "connection", None)
    if callable(pooled) and not callable(getattr(connect, "execute", None)):
        return cast(Callable[[], Any], pooled)
    return None


def connect_problem(connect: object) -> str | None:
    """Answer why ``connect`` is not a :data:`Connect`, or ``None`` when it is one."""
    if isinstance(connect, str) or _pool_lender(connect) is not None or callable(connect):
        return None
    return (
        f"connect: {type(connect).__name__} is not a conninfo string, a connection factory or "
        "a pool"
    )


def open_connection(connect: Connect) -> AbstractAsyncContextManager[Any]:
    """Answer an async context manager lending one psycopg connection from ``connect``.

    Args:
        connect: see :data:`Connect`.

    Raises:
        BackfillSourceInvalidError: ``X_BACKFILL_SOURCE_INVALID`` for anything else, or a
            conninfo string without psycopg installed.
    """
    if isinstance(connect, str):
        return _dialled(connect)
    lend = _pool_lender(connect)
    if lend is not None:
        return _borrowed(lend)
    if callable(connect):
        return _made(connect)
    raise BackfillSourceInvalidError(str(connect_problem(connect)), field="connect")


@asynccontextmanager
async def _dialled(conninfo: str) -> AsyncIterator[Any]:
    psycopg = _psycopg()
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


@asynccontextmanager
async def _borrowed(lend: Callable[[], Any]) -> AsyncIterator[Any]:
    async with lend() as conn:
        yield conn


@asynccontextmanager
async def _made(factory: Callable[[], Any]) -> AsyncIterator[Any]:
    made = factory()
    if hasattr(made, "__aenter__"):
        async with made as conn:
            yield conn
        return
    conn = await made if inspect.isawaitable(made) else made
    try:
        yield conn
    finally:
        await conn.close()


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise BackfillSourceInvalidError(
            "keyset() reads PostgreSQL through psycopg, which is not installed: "
            "pip install 'jobs-core[pg]'",
            field="connect",
        ) from None
    return psycopg


def _identifier(name: str, what: str) -> Any:
    """Answer ``name`` (``"t"`` or ``"schema.t"``) as a quoted psycopg identifier."""
    parts = name.split(".") if isinstance(name, str) else []
    if not parts or not all(parts) or len(parts) > 2 or "\x00" in name:
        raise BackfillSourceInvalidError(
            f"{what}: {name!r} must be a name or schema.name", field=what
        )
    return _psycopg().sql.Identifier(*parts)


class KeysetSource:
    """Pages of a table in key order (build it with :func:`keyset`).

    Attributes:
        table: the table (``name`` or ``schema.name``).
        key: the key columns, in order.
        where: the filter (SQL text with ``%(name)s`` placeholders), or ``None``.
        columns: the columns read (``None``: every column); the key columns are always read.
    """

    def __init__(
        self,
        connect: Connect,
        table: str,
        key: Sequence[str],
        where: str | None,
        params: Mapping[str, Any],
        columns: Sequence[str] | None,
    ) -> None:
        """Hold a checked keyset (use :func:`keyset`, which checks)."""
        self._connect = connect
        self.table = table
        self.key = tuple(key)
        self.where = where
        self.columns = None if columns is None else tuple(dict.fromkeys([*key, *columns]))
        self._params = dict(params)

    def _statement(self, cursor: JSONValue) -> tuple[Any, dict[str, Any]]:
        sql = _psycopg().sql
        keys = [sql.Identifier(k) for k in self.key]
        conditions = [] if self.where is None else [sql.SQL("({})").format(sql.SQL(self.where))]
        values = dict(self._params)
        if cursor is not None:
            if not isinstance(cursor, list) or len(cursor) != len(self.key):
                raise BackfillSourceInvalidError(
                    f"the cursor {cursor!r} does not hold one value per key column {self.key}",
                    field="cursor",
                )
            names = [f"_keyset_{i}" for i in range(len(self.key))]
            values.update(zip(names, cursor, strict=True))
            conditions.append(
                sql.SQL("({}) > ({})").format(
                    sql.SQL(", ").join(keys),
                    sql.SQL(", ").join(sql.Placeholder(n) for n in names),
                )
            )
        values["_keyset_limit"] = 0
        selected = (
            sql.SQL("*")
            if self.columns is None
            else sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        )
        query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT {}").format(
            selected,
            _identifier(self.table, "table"),
            sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("true"),
            sql.SQL(", ").join(keys),
            sql.Placeholder("_keyset_limit"),
        )
        return query, values

    async def read(self, cursor: JSONValue, limit: int) -> tuple[list[dict[str, Any]], JSONValue]:
        """Answer up to ``limit`` rows (as dicts) after ``cursor``, and the next cursor.

        Raises:
            BackfillSourceInvalidError: ``X_BACKFILL_SOURCE_INVALID`` for a cursor of the wrong
                shape.
        """
        query, values = self._statement(cursor)
        values["_keyset_limit"] = limit
        rows_module = _psycopg().rows
        async with open_connection(self._connect) as conn:
            async with conn.cursor(row_factory=rows_module.dict_row) as cur:
                await cur.execute(query, values)
                rows: list[dict[str, Any]] = await cur.fetchall()
            if not conn.autocommit:
                await conn.rollback()  # a read only: end the transaction the SELECT opened
        if len(rows) < limit or not rows:
            return rows, None
        last = rows[-1]
        return rows, to_json_form([last[k] for k in self.key])

    async def count(self) -> int:
        """Answer how many rows ``where`` matches (the whole pass's size)."""
        sql = _psycopg().sql
        query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
            _identifier(self.table, "table"),
            sql.SQL("true") if self.where is None else sql.SQL("({})").format(sql.SQL(self.where)),
        )
        async with open_connection(self._connect) as conn:
            cur = await conn.execute(query, self._params)
            row = await cur.fetchone()
            if not conn.autocommit:
                await conn.rollback()
        return int(row[0]) if row else 0

    def describe(self) -> dict[str, JSONValue]:
        """Answer what identifies the source (no parameter values): table, key, where, columns."""
        return {
            "kind": "keyset",
            "table": self.table,
            "key": list(self.key),
            "where": self.where,
            "columns": None if self.columns is None else list(self.columns),
        }


def keyset(
    connect: Connect,
    table: str,
    *,
    key: str | Sequence[str] = "id",
    where: str | None = None,
    params: Mapping[str, Any] | None = None,
    columns: Sequence[str] | None = None,
) -> KeysetSource:
    """Answer a keyset reader over ``table``: the ``source=`` of a backfill.

    Example:
        >>> rows = keyset(pool, "posts", key="id", where="slug IS NULL")  # doctest: +SKIP

    Args:
        connect: how to reach the database (:data:`Connect`).
        table: the table, ``name`` or ``schema.name``.
        key: the key column, or columns for a composite key (``("org_id", "id")``): unique
            together and ``NOT NULL``, ideally the primary key (the page is an index seek).
        where: a filter in SQL (trusted app code, never user input) with ``%(name)s``
            placeholders bound from ``params``; rows it stops matching as the pass goes (a
            ``slug IS NULL`` the handler fills) are simply not met again.
        params: the placeholders' values.
        columns: the columns to read (default all).

    Raises:
        BackfillSourceInvalidError: ``X_BACKFILL_SOURCE_INVALID`` for an empty key, a bad name or
            ``params`` that is not a mapping.
    """
    keys = [key] if isinstance(key, str) else list(key)
    problems = []
    connect_wrong = connect_problem(connect)
    if connect_wrong is not None:
        problems.append(connect_wrong)
    if not keys or not all(isinstance(k, str) and k and "\x00" not in k for k in keys):
        problems.append("key: one or more column names")
    if not isinstance(table, str) or not table or table.count(".") > 1:
        problems.append("table: a name or schema.name")
    if where is not None and not isinstance(where, str):
        problems.append("where: SQL text or None")
    if params is not None and not isinstance(params, Mapping):
        problems.append("params: a mapping of placeholder values")
    if columns is not None and (
        isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns)
    ):
        problems.append("columns: a list of column names")
    if problems:
        raise BackfillSourceInvalidError(
            "keyset is declared wrong: " + "; ".join(problems), problems=problems
        )
    return KeysetSource(connect, table, keys, where, params or {}, columns)
