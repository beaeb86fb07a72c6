"""The ``jobsctl pg`` command group: ``migrate``, ``sql`` and ``demand-sql``.

Registered through the ``jobs.cli`` entry point: :func:`register` adds a ``pg`` sub-app to the
``jobsctl`` typer app.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from psycopg import sql

from jobs_core.errors import JobsError
from jobs_pg._migrate import ddl
from jobs_pg._sql import Statements, check_schema
from jobs_pg.driver import open_postgres_driver

SchemaOption = Annotated[
    str, typer.Option("--schema", help="The schema the tables live in (default: jobs).")
]
MigrateSchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        help="The schema the tables live in (default: the URL's ?schema=, else jobs).",
        show_default=False,
    ),
]


def _fail(error: JobsError) -> typer.Exit:
    typer.echo(f"error {error.code}: {error.message}", err=True)
    if error.fix:
        typer.echo(f"fix: {error.fix}", err=True)
    return typer.Exit(2)


def migrate(
    driver: Annotated[
        str,
        typer.Option(
            "--driver",
            envvar="JOBS_DRIVER",
            help="The database URL, e.g. postgresql://user@host:5432/db.",
            show_default=False,
        ),
    ],
    schema: MigrateSchemaOption = None,
) -> None:
    """Apply the shipped migrations the schema lacks (safe to run from many pods at once)."""
    chosen = {} if schema is None else {"schema": schema}

    async def run() -> tuple[str, list[str]]:
        opened = open_postgres_driver(driver, min_size=0, max_size=1, **chosen)
        try:
            return opened.schema, await opened.migrate()
        finally:
            await opened.close()

    try:
        migrated, applied = asyncio.run(run())
    except JobsError as exc:
        raise _fail(exc) from None
    if applied:
        for name in applied:
            typer.echo(f"applied {name}")
    else:
        typer.echo(f"schema {migrated!r} is up to date")


def show_sql(schema: SchemaOption = "jobs") -> None:
    """Print the DDL every migration applies, for review (nothing is run)."""
    try:
        typer.echo(ddl(check_schema(schema)), nl=False)
    except JobsError as exc:
        raise _fail(exc) from None


def demand_sql(
    schema: SchemaOption = "jobs",
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues",
            help="Comma-separated queues the scaled workers serve (default: every queue).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print the query a KEDA postgresql trigger runs: the largest demand of the queues.

    Set the trigger's targetQueryValue to the workers' per-queue concurrency; KEDA then runs
    ceil(demand / concurrency) pods.
    """
    try:
        text = Statements(check_schema(schema))["demand_keda"].decode("utf-8")
    except JobsError as exc:
        raise _fail(exc) from None
    named = [q.strip() for q in (queues or "").split(",") if q.strip()]
    # The one parameter becomes a literal quoted by psycopg, so the printed query runs as is.
    literal = sql.Literal(named or None).as_string(None)
    typer.echo(text.replace("%(queues)s", literal) + ";")


def register(app: typer.Typer) -> None:
    """Add the ``pg`` command group to the ``jobsctl`` app (the ``jobs.cli`` entry point)."""
    group = typer.Typer(
        name="pg", help="PostgreSQL driver: migrations and operator SQL.", no_args_is_help=True
    )
    group.command("migrate")(migrate)
    group.command("sql")(show_sql)
    group.command("demand-sql")(demand_sql)
    app.add_typer(group, name="pg")
