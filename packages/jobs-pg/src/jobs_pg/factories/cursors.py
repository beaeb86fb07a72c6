"""``PgCursorStore``: a consumer's cursors in PostgreSQL, saved in the batch's own transaction.

Each batch opens a connection from ``connect``, starts a transaction, hands that connection to
the consumer's ``handle(items, conn)`` for the batch's effects, saves the key's cursor in the
``consumer_cursors`` table of the driver's schema on the same connection, and commits: the effects
and the cursor land together or not at all. The app's tables and the driver's schema must live in
one database (the usual setup; the driver's tables are in a schema of their own).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from jobs_core.errors import ConsumerInvalidError
from jobs_core.factories.consumer import CursorWrite
from jobs_core.factories.keyset import Connect, connect_problem, open_connection
from jobs_core.types import JSONValue
from jobs_pg._records import json_text
from jobs_pg._sql import Statements, check_schema

__all__ = ["PgCursorStore"]


class PgCursorStore:
    """A :class:`~jobs_core.ConsumerCursor` in the ``consumer_cursors`` table.

    Args:
        connect: the app's database (a conninfo string, a connection factory or a psycopg_pool
            ``AsyncConnectionPool``; see :data:`jobs_core.factories.keyset.Connect`).
        schema: the driver's schema, which holds ``consumer_cursors`` (migration 0007).

    Raises:
        ConsumerInvalidError: ``X_CONSUMER_INVALID`` for a bad ``connect``.
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad schema name.
    """

    def __init__(self, connect: Connect, *, schema: str = "jobs") -> None:
        wrong = connect_problem(connect)
        if wrong is not None:
            raise ConsumerInvalidError(wrong)
        self._connect = connect
        self._statements = Statements(check_schema(schema))

    async def load(self, consumer: str, key: str) -> JSONValue:
        """Answer the saved cursor of ``(consumer, key)``, or ``None``."""
        async with open_connection(self._connect) as conn:
            cur = await conn.execute(
                self._statements["consumer_cursor_load"], {"consumer": consumer, "key": key}
            )
            row = await cur.fetchone()
            if not conn.autocommit:
                await conn.rollback()
        return None if row is None else row[0]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """Lend a connection inside a transaction: commit on a clean exit, else roll back."""
        async with open_connection(self._connect) as conn, conn.transaction():
            yield conn

    async def save(self, write: CursorWrite, tx: Any) -> None:
        """Save a cursor on ``tx`` (the connection :meth:`transaction` lent)."""
        await tx.execute(
            self._statements["consumer_cursor_save"],
            {
                "consumer": write.consumer,
                "key": write.key,
                "cursor": json_text(write.cursor, "cursor"),
            },
        )
