"""Read ``settings.JOBS``, install the driver and the outbox, stage on Django's connection.

Django keeps one connection per thread, and a sync enqueue runs its coroutine on the portal
loop's thread: the caller's open ``atomic()`` is therefore read on the caller's thread (an
ambient provider, which the portal runs before each hop) and the stage runs on that thread's
psycopg connection, inside the block. Rejected: wrapping ``transaction.atomic`` (apps and
libraries call Django's own), and a signal per block (Django sends none for ``atomic()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import autodiscover_modules
from psycopg.conninfo import make_conninfo

from jobs_core import install_driver
from jobs_core.outbox import OutboxMode, install_outbox
from jobs_pg._outbox import Connection, add_ambient_provider
from jobs_pg.driver import PostgresDriver

KEYS = frozenset({"DATABASE", "SCHEMA", "OUTBOX", "POOL_MIN", "POOL_MAX", "QUEUES", "CONCURRENCY"})
"""The keys ``settings.JOBS`` may hold."""


@dataclass(frozen=True, slots=True)
class JobsSettings:
    """``settings.JOBS`` with its defaults (see :mod:`jobs_pg.django`).

    Attributes:
        database: the Django database alias.
        schema: the jobs schema.
        outbox: ``optional`` or ``required``.
        pool_min: the driver pool's idle connections.
        pool_max: the driver pool's most connections.
        queues: the worker's queues (``None``: every declared job's).
        concurrency: the worker's slots.
    """

    database: str = "default"
    schema: str = "jobs"
    outbox: OutboxMode = "optional"
    pool_min: int = 1
    pool_max: int = 10
    queues: tuple[str, ...] | None = None
    concurrency: int = 8


def settings_of() -> JobsSettings:
    """Answer ``settings.JOBS`` checked, with defaults for the keys it omits.

    Raises:
        ImproperlyConfigured: an unknown key, or a value of the wrong kind (named).
    """
    raw: Any = getattr(settings, "JOBS", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("JOBS must be a dict (see jobs_pg.django's docstring)")
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise ImproperlyConfigured(f"JOBS has unknown keys {unknown}; the keys are {sorted(KEYS)}")
    outbox = raw.get("OUTBOX", "optional")
    if outbox not in ("optional", "required"):
        raise ImproperlyConfigured('JOBS["OUTBOX"] must be "optional" or "required"')
    ints = {key: raw.get(key, default) for key, default in _INT_DEFAULTS.items()}
    for key, value in ints.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ImproperlyConfigured(f'JOBS["{key}"] must be a whole number >= 0')
    queues = raw.get("QUEUES")
    if queues is not None and (
        isinstance(queues, str) or not all(isinstance(q, str) and q for q in queues)
    ):
        raise ImproperlyConfigured('JOBS["QUEUES"] must be a list of queue names, or None')
    return JobsSettings(
        database=str(raw.get("DATABASE", "default")),
        schema=str(raw.get("SCHEMA", "jobs")),
        outbox=outbox,
        pool_min=ints["POOL_MIN"],
        pool_max=ints["POOL_MAX"],
        queues=tuple(queues) if queues is not None else None,
        concurrency=ints["CONCURRENCY"],
    )


_INT_DEFAULTS = {"POOL_MIN": 1, "POOL_MAX": 10, "CONCURRENCY": 8}


def conninfo(alias: str = "default") -> str:
    """Answer a libpq conninfo string for Django database ``alias`` (it may carry a password).

    Raises:
        ImproperlyConfigured: the alias is unknown, or its engine is not PostgreSQL.
    """
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(f'JOBS["DATABASE"] names {alias!r}, which is not in DATABASES')
    db = settings.DATABASES[alias]
    if db.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"jobs_pg.django needs DATABASES[{alias!r}] on django.db.backends.postgresql"
        )
    params: dict[str, Any] = {
        "dbname": db.get("NAME") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": str(db["PORT"]) if db.get("PORT") else None,
    }
    for key, value in (db.get("OPTIONS") or {}).items():
        # Django's own keys (isolation_level, pool, server_side_binding...) are not libpq's.
        if key in _LIBPQ_OPTIONS:
            params[key] = value
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


_LIBPQ_OPTIONS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "connect_timeout",
        "application_name",
        "target_session_attrs",
        "passfile",
        "service",
        "options",
    }
)


_driver: PostgresDriver | None = None
_alias = "default"


def installed_driver() -> PostgresDriver:
    """Answer the driver ``jobs_pg.django`` installed at start-up.

    Raises:
        ImproperlyConfigured: Django has not started (``jobs_pg.django`` is not in
            INSTALLED_APPS, or ``django.setup()`` was not called).
    """
    if _driver is None:
        raise ImproperlyConfigured(
            'add "jobs_pg.django" to INSTALLED_APPS (the driver is installed when Django starts)'
        )
    return _driver


def _django_transaction() -> Connection | None:
    """The caller's thread's psycopg connection when it is inside ``atomic()``, else ``None``."""
    wrapper = connections[_alias]
    if not wrapper.in_atomic_block:
        return None
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(
            f"an enqueue inside atomic() stages on Django's connection, which must be psycopg "
            f"3's; DATABASES[{_alias!r}] runs on {type(raw).__module__}: pip install psycopg"
        )
    return raw


def install() -> PostgresDriver:
    """Install the driver and the outbox from ``settings.JOBS``; import every app's ``jobs``.

    Called by the app config's ``ready()``; calling it again installs a fresh driver.

    Raises:
        ImproperlyConfigured: as :func:`settings_of` and :func:`conninfo`.
    """
    global _driver, _alias
    jobs = settings_of()
    driver = PostgresDriver(
        conninfo(jobs.database),
        schema=jobs.schema,
        min_size=min(jobs.pool_min, max(jobs.pool_max, 1)),
        max_size=max(jobs.pool_max, 1),
    )
    _driver, _alias = driver, jobs.database
    install_driver(driver)
    install_outbox(driver.outbox, driver, jobs.outbox)
    add_ambient_provider(_django_transaction)
    autodiscover_modules("jobs")
    return driver
