"""Django integration: ``INSTALLED_APPS += ["jobs_pg.django"]`` and a ``JOBS`` setting.

The app's :class:`~jobs_pg.django.apps.JobsConfig` installs the pg driver and its transactional
outbox when Django starts, and imports each installed app's ``jobs`` module (its job
declarations). An enqueue made inside ``transaction.atomic()`` then stages on Django's own
psycopg 3 connection for that database, inside the block (a nested ``atomic()`` is a savepoint,
so rolling it back drops what was staged in it); the worker's relay publishes committed rows.
Outside an ``atomic()`` an enqueue is queued directly (``"OUTBOX": "required"`` refuses it).

Settings (every key optional)::

    JOBS = {
        "DATABASE": "default",  # the Django database the jobs' schema lives in
        "SCHEMA": "jobs",  # the schema of the jobs tables (jobs_migrate creates them)
        "OUTBOX": "optional",  # or "required": no enqueue outside atomic()
        "POOL_MIN": 1,  # the driver's own pool, beside Django's connections
        "POOL_MAX": 10,
        "QUEUES": None,  # jobs_worker's queues (default: every declared job's)
        "CONCURRENCY": 8,  # jobs_worker's slots
    }

Management commands: ``manage.py jobs_migrate`` (apply the jobs schema) and ``manage.py
jobs_worker`` (a worker, the outbox relay, and the scheduler when tasks are declared).

The connection the driver dials is built from that database's ``NAME``, ``USER``, ``PASSWORD``,
``HOST``, ``PORT`` and libpq ``OPTIONS`` (:func:`conninfo`), so the outbox rows an ``atomic()``
stages are in the database the relay reads.
"""

from jobs_pg.django._setup import conninfo, installed_driver, settings_of

__all__ = ["conninfo", "installed_driver", "settings_of"]
