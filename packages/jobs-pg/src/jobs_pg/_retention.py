"""Deleting settled rows on PostgreSQL (the ``retention`` capability).

:meth:`PgRetentionStore.purge_settled` is the one seam a retention sweep uses: it runs the
``retention_purge`` block, which deletes at most ``limit`` settled rows and their steps in one
statement, so a sweep over millions of rows is many short transactions (each holds its row locks
for milliseconds and leaves work for autovacuum in bounded steps), never one ``DELETE`` over the
whole table. A table layout that moves settled rows elsewhere reimplements only this method.
"""

from __future__ import annotations

from jobs_core.driver import check_retention_request
from jobs_core.types import RetentionRequest
from jobs_pg._db import Db
from jobs_pg._records import aware


class PgRetentionStore:
    """The PostgreSQL :class:`~jobs_core.driver.RetentionStore`.

    Args:
        db: the driver's connection plumbing.
    """

    def __init__(self, db: Db) -> None:
        self._db = db

    async def purge_settled(self, req: RetentionRequest) -> int:
        """Delete up to ``req.limit`` rows in ``req.states`` settled before ``req.before``.

        A row's steps are deleted in the same statement (a run id belongs to one row). A row being
        written by someone else right now is skipped (``SKIP LOCKED``) and met by the next call.

        Returns:
            How many rows were deleted.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad request.
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE``.
        """
        check_retention_request(req)
        params = {
            "states": sorted(str(state) for state in req.states),
            "before": aware(req.before, "before"),
            "limit": req.limit,
        }
        return int(await self._db.value("retention_purge", params))
