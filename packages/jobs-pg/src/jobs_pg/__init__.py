"""jobs-pg: the PostgreSQL driver for jobs.

Open it with ``await PostgresDriver.connect("postgresql://…")`` or, through the ``jobs.drivers``
entry point, ``open_driver("postgresql://…")``; apply the schema with ``await driver.migrate()``
or ``jobsctl pg migrate --driver URL``. :func:`transaction` makes the app's psycopg connection the
ambient transaction that outbox enqueues and event publishes join. :func:`rollup`,
:func:`refresh_view` and :class:`PgCursorStore` are the factories over ``job()`` that run on the
app's own database (:mod:`jobs_pg.factories`).
"""

from jobs_pg._migrate import ddl
from jobs_pg._outbox import PgOutboxStore, transaction
from jobs_pg.driver import PostgresDriver, open_postgres_driver
from jobs_pg.factories import Bucket, PgCursorStore, refresh_view, rollup

__version__ = "0.1.0"

__all__ = [
    "Bucket",
    "PgCursorStore",
    "PgOutboxStore",
    "PostgresDriver",
    "ddl",
    "open_postgres_driver",
    "refresh_view",
    "rollup",
    "transaction",
]
