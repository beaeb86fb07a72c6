"""``manage.py jobs_worker``: a worker for the jobs the project's apps declare, and its relay.

It runs what ``jobsctl dev`` runs beside a worker, on the driver Django installed: the outbox
relay (every enqueue made inside ``atomic()`` is staged, and reaches the queue through it) and
the scheduler when tasks are declared. SIGTERM or SIGINT drains it.
"""

from __future__ import annotations

import asyncio
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from jobs_core.cli import _dev_roles, _queue_list, _serve
from jobs_core.logs import LogLevel, configure_logging
from jobs_pg.django._setup import installed_driver, settings_of


class Command(BaseCommand):
    """Run a worker, the outbox relay and the scheduler until SIGTERM or SIGINT."""

    help = "Run a jobs worker with the outbox relay (and the scheduler for declared tasks)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        """``--queues a,b``, ``--concurrency``, ``--visibility-timeout``, ``--drain-timeout``."""
        parser.add_argument("--queues", default=None, help="a,b (default: every job's queue)")
        parser.add_argument("--concurrency", type=int, default=None)
        parser.add_argument("--visibility-timeout", default="30s")
        parser.add_argument("--drain-timeout", default="25s")

    def handle(self, *args: Any, **options: Any) -> None:
        """Serve until drained.

        Raises:
            JobsError: the schema is not migrated (``X_SCHEMA_NOT_MIGRATED``: run jobs_migrate)
                or an option is bad.
        """
        jobs = settings_of()
        configure_logging(LogLevel.INFO)
        queues = options["queues"] or (",".join(jobs.queues) if jobs.queues else None)
        asyncio.run(
            _serve(
                installed_driver(),
                queues=_queue_list(queues),
                concurrency=options["concurrency"] or jobs.concurrency,
                visibility_timeout=options["visibility_timeout"],
                drain_timeout=options["drain_timeout"],
                roles=_dev_roles,
            )
        )
