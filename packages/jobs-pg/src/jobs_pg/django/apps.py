"""The Django app config of ``jobs_pg.django`` (found by Django through INSTALLED_APPS)."""

from __future__ import annotations

from django.apps import AppConfig


class JobsConfig(AppConfig):
    """Installs the driver and the outbox at start-up, then imports every app's ``jobs.py``."""

    name = "jobs_pg.django"
    label = "jobs_pg"
    verbose_name = "Background jobs"

    def ready(self) -> None:
        """Install from ``settings.JOBS`` (:func:`jobs_pg.django._setup.install`).

        Raises:
            ImproperlyConfigured: a ``JOBS`` key is unknown or a value is bad, or the database
                is not PostgreSQL on psycopg 3.
        """
        from jobs_pg.django._setup import install

        install()
