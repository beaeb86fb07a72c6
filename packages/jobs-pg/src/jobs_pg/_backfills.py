"""The backfill ledger on PostgreSQL (the ``backfills`` capability): the ``backfills`` table.

One row per pass, keyed by the id of the job running it; every statement is one named block of
``queries.sql`` (``backfill_*``), each its own transaction.
"""

from __future__ import annotations

from uuid import UUID

from jobs_core.driver import check_backfill_query, check_backfill_start
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.types import (
    BackfillPass,
    BackfillProgress,
    BackfillQuery,
    BackfillStart,
    BackfillStatus,
)
from jobs_pg._db import Db, Row, utc
from jobs_pg._records import json_text


def _pass(row: Row) -> BackfillPass:
    return BackfillPass(
        id=row[0],
        name=row[1],
        scope=row[2],
        checksum=row[3],
        status=row[4],
        app_version=row[5],
        rows=int(row[6]),
        last_cursor=row[7],
        started_at=utc(row[8]),
        completed_at=None if row[9] is None else utc(row[9]),
    )


class PgBackfillLedger:
    """The PostgreSQL :class:`~jobs_core.driver.BackfillLedger`.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def begin(self, start: BackfillStart) -> BackfillPass:
        """Open a ``running`` pass, or answer the row ``start.id`` already names unchanged.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for an empty name/checksum.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        check_backfill_start(start)
        row = await self._db.row(
            "backfill_begin",
            {
                "id": start.id,
                "name": start.name,
                "scope": start.scope,
                "checksum": start.checksum,
                "app_version": start.app_version,
            },
        )
        assert row is not None  # the INSERT or the existing row answers
        return _pass(row)

    async def record(self, progress: BackfillProgress) -> bool:
        """Store rows and cursor of a pass that is not ``completed`` (it becomes ``running``).

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a cursor that is not JSON.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        cursor = json_text(progress.cursor, "cursor")
        found = await self._db.rows(
            "backfill_record", {"id": progress.id, "rows": progress.rows, "cursor": cursor}
        )
        return bool(found)

    async def settle(self, pass_id: UUID, status: BackfillStatus) -> bool:
        """End a pass ``completed`` (stamping ``completed_at``) or mark it ``failed``.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for another status.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        if status not in ("completed", "failed"):
            raise DriverRequestInvalidError(f"a pass settles completed or failed, not {status!r}")
        return bool(await self._db.rows("backfill_settle", {"id": pass_id, "status": status}))

    async def completed(self, name: str, scope: str) -> BackfillPass | None:
        """Answer the newest ``completed`` pass of ``(name, scope)``, or ``None``.

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        row = await self._db.row("backfill_completed", {"name": name, "scope": scope})
        return None if row is None else _pass(row)

    async def passes(self, query: BackfillQuery) -> list[BackfillPass]:
        """Answer passes matching ``query``, newest ``started_at`` first.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a limit outside 1..1,000.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        check_backfill_query(query)
        rows = await self._db.rows(
            "backfill_passes", {"name": query.name, "scope": query.scope, "limit": query.limit}
        )
        return [_pass(row) for row in rows]
