"""``manage.py jobs_migrate``: apply the jobs schema's migrations to the JOBS database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from jobs_core import portal
from jobs_pg.django._setup import installed_driver


class Command(BaseCommand):
    """Apply the shipped jobs migrations this schema lacks (safe to run from many pods)."""

    help = "Apply the jobs schema's migrations (jobsctl pg migrate, with Django's settings)."

    def handle(self, *args: Any, **options: Any) -> None:
        """Migrate, print each migration applied (or that none was needed).

        Raises:
            DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when the database cannot be reached.
        """
        driver = installed_driver()
        applied = portal.run(driver.migrate())
        for name in applied:
            self.stdout.write(f"applied {name}")
        if not applied:
            self.stdout.write(f"schema {driver.schema} is up to date")
