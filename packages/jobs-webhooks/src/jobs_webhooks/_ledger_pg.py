"""The delivery ledger in PostgreSQL: :class:`PostgresWebhookLedger`.

Its tables come from a versioned migration of its own (``sql/migrations/0001_webhook_ledger.sql``),
recorded in ``webhook_migrations`` beside the driver's tables (the driver numbers its own files in
``migrations``), applied once under a transaction-level advisory lock so pods booting together
both succeed. Its statements are the named blocks of ``sql/ledger.sql``; the schema goes through
:class:`psycopg.sql.Identifier`, never string formatting.

Rejected: adding the tables to jobs-pg's migrations. An app that uses the Redis driver, or none,
still wants its ledger in PostgreSQL, and the driver's schema history should not change when a
package it does not know is installed.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any

from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from jobs_core.errors import DriverRequestInvalidError
from jobs_webhooks._ledger import DeliveryAttempt, EndpointHealth, check_limit

_BLOCK = re.compile(r"^-- name: (\w+)[ \t]*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

LOCK_NAMESPACE = "jobs-webhooks.migrate"
"""The first key of the migration advisory lock (the second is the schema)."""


@functools.cache
def blocks() -> dict[str, str]:
    """Answer every named block of ``sql/ledger.sql`` by name (read once per process)."""
    text = (files("jobs_webhooks") / "sql" / "ledger.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@dataclass(frozen=True, slots=True)
class Migration:
    """One versioned migration file (never edited once shipped: its checksum is recorded)."""

    version: int
    name: str
    text: str
    checksum: str

    def render(self, schema: str) -> sql.Composed:
        """Answer the migration's SQL for ``schema``."""
        return sql.SQL(self.text).format(schema=sql.Identifier(schema))


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """Answer the shipped migrations in version order."""
    found = []
    for entry in (files("jobs_webhooks") / "sql" / "migrations").iterdir():
        matched = _MIGRATION.fullmatch(entry.name)
        if matched is not None:
            text = entry.read_text(encoding="utf-8")
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            found.append(Migration(int(matched[1]), entry.name, text, digest))
    return tuple(sorted(found, key=lambda m: m.version))


class PostgresWebhookLedger:
    """A :class:`~jobs_webhooks.WebhookLedger` in PostgreSQL tables.

    Nothing is dialled at construction; the pool opens on first use, on the loop that uses it.
    Run :meth:`migrate` once (at deploy, or at boot: it is safe from many pods at once).

    Args:
        conninfo: a libpq URL or DSN (ignored when ``pool`` is given).
        schema: the schema the tables live in (default ``jobs``, beside the pg driver's).
        pool: a psycopg ``AsyncConnectionPool`` to share instead of opening one.
        min_size: the pool's idle connections (own pool only).
        max_size: the pool's most connections (own pool only).

    Raises:
        DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` for a bad schema name.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        schema: str = "jobs",
        pool: AsyncConnectionPool[Any] | None = None,
        min_size: int = 1,
        max_size: int = 4,
    ) -> None:
        if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema):
            raise DriverRequestInvalidError(
                f"schema {schema!r} must be letters, digits or _ and not start with a digit",
                schema=repr(schema),
            )
        self.schema = schema
        self._owned = pool is None
        self._pool: AsyncConnectionPool[Any] = pool or AsyncConnectionPool(
            conninfo, min_size=min_size, max_size=max_size, open=False, kwargs={"autocommit": True}
        )
        self._opened = not self._owned
        ident = sql.Identifier(schema)
        self._sql = {name: sql.SQL(text).format(schema=ident) for name, text in blocks().items()}

    async def _ready(self) -> AsyncConnectionPool[Any]:
        if not self._opened:
            self._opened = True
            await self._pool.open(wait=True)
        return self._pool

    async def _rows(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        pool = await self._ready()
        async with pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._sql[name], params)
            return await cur.fetchall() if cur.description else []

    async def migrate(self) -> list[str]:
        """Apply the shipped migrations this schema lacks; answer the files applied.

        Raises:
            DriverRequestInvalidError: ``X_DRIVER_REQUEST_INVALID`` when a file applied before
                was edited since (ship a new file instead).
            psycopg.Error: the server refused a statement (nothing of this call is kept).
        """
        ident = sql.Identifier(self.schema)
        applied: list[str] = []
        pool = await self._ready()
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))",
                (LOCK_NAMESPACE, self.schema),
            )
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.webhook_migrations ("
                    "version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            cur = await conn.execute(
                sql.SQL("SELECT version, checksum FROM {}.webhook_migrations").format(ident)
            )
            recorded = dict(await cur.fetchall())
            for migration in migrations():
                if migration.version in recorded:
                    if recorded[migration.version] != migration.checksum:
                        raise DriverRequestInvalidError(
                            f"migration {migration.name} was edited after it was applied to "
                            f"schema {self.schema!r}; add a new file instead",
                            migration=migration.name,
                        )
                    continue
                await conn.execute(migration.render(self.schema), prepare=False)
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.webhook_migrations (version, name, checksum) "
                        "VALUES (%s, %s, %s)"
                    ).format(ident),
                    (migration.version, migration.name, migration.checksum),
                )
                applied.append(migration.name)
        return applied

    async def record(
        self, attempt: DeliveryAttempt, *, disable_after: int | None
    ) -> EndpointHealth:
        """Store ``attempt`` and update its endpoint's count in one statement."""
        params = {
            "endpoint_id": attempt.endpoint_id,
            "event_id": attempt.event_id,
            "topic": attempt.topic,
            "attempt": attempt.attempt,
            "url": attempt.url,
            "started_at": attempt.started_at,
            "duration_ms": attempt.duration_ms,
            "outcome": attempt.outcome,
            "status": attempt.status,
            "code": attempt.code,
            "excerpt": attempt.excerpt,
            "retry_after_ms": attempt.retry_after_ms,
            "job_id": attempt.job_id,
            "run_id": attempt.run_id,
            "disable_after": disable_after,
        }
        row = (await self._rows("record", params))[0]
        return _health(attempt.endpoint_id, row)

    async def is_disabled(self, endpoint_id: str) -> bool:
        """Answer whether the endpoint is disabled."""
        return (await self.health(endpoint_id)).disabled

    async def health(self, endpoint_id: str) -> EndpointHealth:
        """Answer the endpoint's health (zero failures for an unknown endpoint)."""
        rows = await self._rows("health", {"endpoint_id": endpoint_id})
        return _health(endpoint_id, rows[0]) if rows else EndpointHealth(endpoint_id)

    async def enable(self, endpoint_id: str) -> None:
        """Re-enable the endpoint and reset its failure count."""
        await self._rows("enable", {"endpoint_id": endpoint_id})

    async def disable(self, endpoint_id: str) -> None:
        """Disable the endpoint now."""
        await self._rows("disable", {"endpoint_id": endpoint_id})

    async def attempts(
        self, *, endpoint_id: str | None = None, event_id: str | None = None, limit: int = 100
    ) -> list[DeliveryAttempt]:
        """Answer recorded attempts, newest first.

        Raises:
            ValueError: ``limit`` outside 1 to 1,000.
        """
        params = {"endpoint_id": endpoint_id, "event_id": event_id, "limit": check_limit(limit)}
        rows = await self._rows("attempts", params)
        return [DeliveryAttempt(**{**row, "started_at": _utc(row["started_at"])}) for row in rows]

    async def purge(self, before: datetime) -> int:
        """Delete attempts that started before ``before``; answer how many."""
        pool = await self._ready()
        async with pool.connection() as conn:
            cur = await conn.execute(self._sql["purge"], {"before": before})
            return int(cur.rowcount)

    async def close(self) -> None:
        """Close the pool if this ledger opened it."""
        if self._owned and self._opened:
            await self._pool.close()


def _utc(instant: datetime | None) -> datetime | None:
    # timestamptz comes back in the session's zone; the ledger speaks UTC.
    return None if instant is None else instant.astimezone(UTC)


def _health(endpoint_id: str, row: dict[str, Any]) -> EndpointHealth:
    return EndpointHealth(endpoint_id, row["consecutive_failures"], _utc(row["disabled_at"]))
