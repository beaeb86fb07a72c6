"""Applying the versioned migrations: each file once, in order, under an advisory lock.

A migrate takes the session-level advisory lock keyed on the schema, then in one transaction
creates the schema and the ``migrations`` bookkeeping table if missing, applies every file not
yet recorded and records it, commits, and releases the lock. Two pods booting together therefore
both succeed: the second waits for the lock, then finds every file recorded and applies none.

An online file (``-- jobs-pg: online``) is the exception: ``CREATE INDEX CONCURRENTLY`` builds an
index without blocking writes but refuses to run in a transaction, so the files before it commit
first, it runs on its own, and later files apply in a new transaction, all under the one lock.

The lock is a session lock taken and released around the work on one connection (released in a
``finally`` before the connection goes back to its pool, so it never outlives the work), and it
is tried, never waited on (see ``LOCK_POLL_S``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from psycopg import sql

from jobs_core.errors import DriverRequestInvalidError
from jobs_pg._sql import Migration, migrations

_log = logging.getLogger("jobs.pg")

LOCK_NAMESPACE = "jobs-pg.migrate"
"""The first key of the migration advisory lock (the second is the schema name)."""

LOCK_POLL_S = 0.05
"""How long a migrate that found the lock taken sleeps before trying again (seconds).

Tried, never waited on: a statement waiting for a lock holds a snapshot, and ``CREATE INDEX
CONCURRENTLY`` in another pod's online file waits for every older snapshot of the database, so
a blocking wait would deadlock the two."""


async def apply_migrations(conn: psycopg.AsyncConnection[Any], schema: str) -> list[str]:
    """Apply every shipped migration ``schema`` lacks, in order, on ``conn``.

    Under the migration lock (see the module's docstring) the ordinary files apply in one
    transaction. An online file (``-- jobs-pg: online``, e.g. ``CREATE INDEX CONCURRENTLY``)
    cannot run in a transaction: the files before it commit first, then its statements run one
    at a time and it is recorded, and the files after it apply in a new transaction.

    Args:
        conn: an idle connection (autocommit or not; it is left as it was found).
        schema: the schema (created if missing).

    Returns:
        The file names applied by this call, in order (empty when the schema was current).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when a file already applied to
            this schema was edited since (its checksum changed): ship a new file instead.
        psycopg.Error: the server refused a statement (nothing of the failing transaction is
            kept; an online file's finished statements are, and it runs again from the start).
    """
    was_autocommit = conn.autocommit
    await conn.set_autocommit(True)
    try:
        while not await _try_lock(conn, schema):  # noqa: ASYNC110
            await asyncio.sleep(LOCK_POLL_S)
        try:
            applied: list[str] = []
            while True:
                async with conn.transaction():
                    done, online = await _apply_in_transaction(conn, schema)
                applied.extend(done)
                if online is None:
                    break
                await _apply_online(conn, schema, online)
                applied.append(online.name)
        finally:
            await conn.execute(
                "SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))", (LOCK_NAMESPACE, schema)
            )
    finally:
        await conn.set_autocommit(was_autocommit)
    if applied:
        _log.info(
            "jobs.pg.migrated",
            extra={"event": "jobs.pg.migrated", "schema": schema, "applied": applied},
        )
    return applied


async def _try_lock(conn: psycopg.AsyncConnection[Any], schema: str) -> bool:
    """Try the migration lock once (never a blocking wait; see LOCK_POLL_S)."""
    cur = await conn.execute(
        "SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))", (LOCK_NAMESPACE, schema)
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def _recorded(conn: psycopg.AsyncConnection[Any], schema: str) -> dict[int, str]:
    """Answer the checksum of each migration recorded in ``schema``, by version."""
    cur = await conn.execute(
        sql.SQL("SELECT version, checksum FROM {}.migrations").format(sql.Identifier(schema))
    )
    return {version: checksum for version, checksum in await cur.fetchall()}


def _unapplied(recorded: dict[int, str], schema: str) -> list[Migration]:
    """Answer the shipped migrations not in ``recorded``, refusing an edited applied one."""
    missing: list[Migration] = []
    for migration in migrations():
        seen = recorded.get(migration.version)
        if seen is None:
            missing.append(migration)
        elif seen != migration.checksum:
            raise DriverRequestInvalidError(
                f"migration {migration.name} was edited after it was applied to schema "
                f"{schema!r}; shipped migrations are never edited, add a new file",
                migration=migration.name,
            )
    return missing


async def _record(conn: psycopg.AsyncConnection[Any], schema: str, migration: Migration) -> None:
    await conn.execute(
        sql.SQL("INSERT INTO {}.migrations (version, name, checksum) VALUES (%s, %s, %s)").format(
            sql.Identifier(schema)
        ),
        (migration.version, migration.name, migration.checksum),
    )


async def _apply_in_transaction(
    conn: psycopg.AsyncConnection[Any], schema: str
) -> tuple[list[str], Migration | None]:
    """In a transaction: the bookkeeping, then each missing file up to the first online one.

    Answers the names applied and that online file (``None`` when none is missing).
    """
    ident = sql.Identifier(schema)
    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    await conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migrations ("
            "version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident)
    )
    applied: list[str] = []
    for migration in _unapplied(await _recorded(conn, schema), schema):
        if migration.online:
            return applied, migration
        # Several statements in one text: never prepared (the pool prepares by default).
        await conn.execute(migration.render(schema), prepare=False)
        await _record(conn, schema, migration)
        applied.append(migration.name)
    return applied, None


async def _apply_online(
    conn: psycopg.AsyncConnection[Any], schema: str, migration: Migration
) -> None:
    """Run ``migration``'s statements one at a time outside a transaction, then record it.

    An index an interrupted concurrent build left INVALID in the schema is dropped first, so
    ``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` builds it again rather than keeping the broken
    one (only a migrate builds indexes concurrently here, and the lock says none other runs).
    """
    cur = await conn.execute(
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " JOIN pg_namespace n ON n.oid = i.relnamespace"
        " WHERE n.nspname = %s AND NOT x.indisvalid",
        (schema,),
    )
    for (invalid,) in await cur.fetchall():
        await conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
                sql.Identifier(schema), sql.Identifier(invalid)
            )
        )
    for statement in migration.statements(schema):
        await conn.execute(statement, prepare=False)
    await _record(conn, schema, migration)


def ddl(schema: str) -> str:
    """Answer every migration rendered for ``schema``, for review (``jobsctl pg sql``)."""
    parts = [f"-- {m.name}\n{m.render(schema).decode('utf-8').strip()}\n" for m in migrations()]
    return "\n".join(parts)
