"""Factories over :func:`jobs_core.job` that run on the app's PostgreSQL database.

:func:`rollup` re-aggregates recent :class:`Bucket` s of a named zone into the app's table;
:func:`refresh_view` refreshes a materialized view; :class:`PgCursorStore` keeps a
:func:`jobs_core.consumer`'s cursors in the transaction of its batches. Each answers an ordinary
job handle; the schedule is the app's ``task``.
"""

from jobs_pg.factories.bucket import Bucket
from jobs_pg.factories.cursors import PgCursorStore
from jobs_pg.factories.refresh_view import RefreshViewJob, refresh_view
from jobs_pg.factories.rollup import RollupJob, RollupRun, rollup

__all__ = [
    "Bucket",
    "PgCursorStore",
    "RefreshViewJob",
    "RollupJob",
    "RollupRun",
    "refresh_view",
    "rollup",
]
