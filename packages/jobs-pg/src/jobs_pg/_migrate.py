"""Applying the versioned migrations: each file once, in order, under a transaction-level lock.

One transaction takes ``pg_advisory_xact_lock`` keyed on the schema, creates the schema and the
``migrations`` bookkeeping table if missing, applies every file not yet recorded and records it,
then commits (releasing the lock). Two pods booting together therefore both succeed: the second
waits on the lock, then finds every file recorded and applies none. A session-level lock was
rejected: over a pool it can outlive the work on a connection handed to someone else.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from jobs_core.errors import DriverRequestInvalidError
from jobs_pg._sql import migrations

_log = logging.getLogger("jobs.pg")

LOCK_NAMESPACE = "jobs-pg.migrate"
"""The first key of the migration advisory lock (the second is the schema name)."""


async def apply_migrations(conn: psycopg.AsyncConnection[Any], schema: str) -> list[str]:
    """Apply every shipped migration ``schema`` lacks, in one transaction on ``conn``.

    Args:
        conn: an idle connection (autocommit or not; the work runs in its own transaction).
        schema: the schema (created if missing).

    Returns:
        The file names applied by this call, in order (empty when the schema was current).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when a file already applied to
            this schema was edited since (its checksum changed): ship a new file instead.
        psycopg.Error: the server refused a statement (nothing of this call is kept).
    """
    ident = sql.Identifier(schema)
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (LOCK_NAMESPACE, schema)
        )
        await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.migrations ("
                "version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        cur = await conn.execute(
            sql.SQL("SELECT version, name, checksum FROM {}.migrations").format(ident)
        )
        recorded = {version: (name, checksum) for version, name, checksum in await cur.fetchall()}
        for migration in migrations():
            seen = recorded.get(migration.version)
            if seen is not None:
                if seen[1] != migration.checksum:
                    raise DriverRequestInvalidError(
                        f"migration {migration.name} was edited after it was applied to schema "
                        f"{schema!r}; shipped migrations are never edited, add a new file",
                        migration=migration.name,
                    )
                continue
            # Several statements in one text: never prepared (the pool prepares by default).
            await conn.execute(migration.render(schema), prepare=False)
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)"
                ).format(ident),
                (migration.version, migration.name, migration.checksum),
            )
            applied.append(migration.name)
    if applied:
        _log.info(
            "jobs.pg.migrated",
            extra={"event": "jobs.pg.migrated", "schema": schema, "applied": applied},
        )
    return applied


def ddl(schema: str) -> str:
    """Answer every migration rendered for ``schema``, for review (``jobsctl pg sql``)."""
    parts = [f"-- {m.name}\n{m.render(schema).decode('utf-8').strip()}\n" for m in migrations()]
    return "\n".join(parts)
