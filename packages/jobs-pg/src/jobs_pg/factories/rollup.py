"""``rollup()``: re-aggregate recent calendar buckets into the app's table, one upsert each.

A pass reads the clock once (step ``now``, the driver's store clock, unless the input names an
instant), then for every bucket from the one holding ``now - lookback`` to the one holding
``now`` runs the app's ``source_sql`` over ``[bucket_start, bucket_end)`` inside one statement::

    INSERT INTO <into> (<columns>) SELECT <columns> FROM (<source_sql>) AS s
    ON CONFLICT (<key>) DO UPDATE SET <column> = EXCLUDED.<column>, ...

one step per bucket (``bucket:<start>``). Re-aggregating a bucket writes the same rows again, so a
pass is idempotent and a late event inside ``lookback`` is counted by the next pass. ``into``
needs a unique index on exactly ``key`` (what ``ON CONFLICT`` infers): it is checked at
declaration when ``connect`` is a conninfo string (and the database answers), else at the first
pass, ``X_JOB_ROLLUP_INVALID`` either way. Rows of a bucket whose groups vanished from the source
are left as they were (an upsert never deletes).

The statement is composed from the app's pieces with :mod:`psycopg.sql` (identifiers quoted),
so it is not a block of ``queries.sql``; the catalog check is (``rollup_unique_index``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg import sql
from pydantic import BaseModel, ConfigDict

from jobs_core import JobContext, JobHandle, JobRegistry, Retry, Step
from jobs_core._durations import Duration, duration_problem, parse_duration
from jobs_core.errors import RollupInvalidError
from jobs_core.factories._shared import declare_singleton, store_now
from jobs_core.factories.keyset import Connect, connect_problem, open_connection
from jobs_core.job import declaration_site
from jobs_pg._sql import blocks
from jobs_pg.factories.bucket import Bucket

__all__ = ["RollupJob", "RollupRun", "rollup"]

_log = logging.getLogger("jobs.rollup")

_UNIQUE_INDEX = blocks()["rollup_unique_index"].encode()

CHECK_TIMEOUT_S = 3
"""How long the declaration-time check waits for the database before leaving it to the pass."""


class RollupRun(BaseModel):
    """A rollup pass's input: ``at`` names the instant to roll up to (default: now)."""

    model_config = ConfigDict(extra="forbid")

    at: datetime | None = None


def _name(text: str) -> sql.Identifier:
    return sql.Identifier(*text.split("."))


def _name_problem(text: object, what: str) -> str | None:
    parts = text.split(".") if isinstance(text, str) else []
    if not parts or len(parts) > 2 or not all(parts) or "\x00" in str(text):
        return f"{what}: a table name or schema.name, got {text!r}"
    return None


class RollupJob(JobHandle[Any, Any]):
    """A declared rollup: an ordinary job handle (built by :func:`rollup`)."""

    into: str
    key: tuple[str, ...]
    bucket: Bucket
    lookback_ms: int
    checked: bool

    def describe(self) -> dict[str, Any]:
        """Answer the job's descriptor with the rollup's own settings."""
        return {
            **super().describe(),
            "factory": "rollup",
            "into": self.into,
            "key": list(self.key),
            "bucket": {"width": self.bucket.width, "tz": self.bucket.tz},
            "lookback_ms": self.lookback_ms,
        }


def _missing_index(into: str, key: Sequence[str], answer: bool | None) -> RollupInvalidError | None:
    if answer:
        return None
    if answer is None:
        why = f"into: the table {into!r} does not exist"
    else:
        why = (
            f"into: {into!r} has no unique index on exactly ({', '.join(key)}); "
            f"CREATE UNIQUE INDEX ON {into} ({', '.join(key)}) (no WHERE, no expressions)"
        )
    return RollupInvalidError(why, into=into, key=list(key))


def _check_now(conninfo: str, into: str, key: Sequence[str]) -> bool:
    """Check the unique index at declaration; answer whether the check could run."""
    try:
        with psycopg.connect(conninfo, connect_timeout=CHECK_TIMEOUT_S, autocommit=True) as conn:
            row = conn.execute(_UNIQUE_INDEX, {"table": into, "columns": list(key)}).fetchone()
    except psycopg.OperationalError as exc:
        _log.warning(
            "jobs.rollup.unchecked",
            extra={"event": "jobs.rollup.unchecked", "into": into, "error": str(exc)},
        )
        return False
    refused = _missing_index(into, key, None if row is None else row[0])
    if refused is not None:
        raise refused
    return True


def rollup(
    *,
    name: str,
    into: str,
    source_sql: str,
    key: str | Sequence[str],
    lookback: Duration,
    connect: Connect,
    bucket: Bucket | None = None,
    tenant: Literal["none"] = "none",
    queue: str = "default",
    retry: Retry | None = None,
    registry: JobRegistry | None = None,
) -> RollupJob:
    """Declare a rollup: a job that re-aggregates recent buckets into ``into``.

    Example:
        >>> daily = rollup(
        ...     name="orders.daily",
        ...     into="order_days",
        ...     source_sql="SELECT %(bucket_start)s AS day, count(*) AS orders FROM orders "
        ...     "WHERE placed_at >= %(bucket_start)s AND placed_at < %(bucket_end)s",
        ...     key="day",
        ...     lookback="2d",
        ...     bucket=Bucket("1d", "Europe/Paris"),
        ...     connect=DATABASE_URL,
        ... )  # doctest: +SKIP

    Args:
        name: the durable name.
        into: the app's table (``name`` or ``schema.name``), with a unique index on ``key``.
        source_sql: a ``SELECT`` (trusted app code) over one bucket, using ``%(bucket_start)s``
            and ``%(bucket_end)s`` (timestamptz, the bucket's ``[start, end)``); its column names
            are ``into``'s columns, ``key`` among them.
        key: the column(s) of the upsert's ``ON CONFLICT``.
        lookback: how far back re-aggregation starts (the bucket holding ``now - lookback``).
        connect: the app's database (see :data:`jobs_core.factories.keyset.Connect`); with a
            conninfo string the unique index is checked at declaration.
        bucket: the buckets (default ``Bucket("1h", "UTC")``).
        tenant: ``"none"``: a rollup spans tenants.
        queue: the queue passes run on.
        retry: attempts and backoff (the core's default).
        registry: the job registry to join (default the process-wide one).

    Returns:
        The :class:`RollupJob`; schedule it with the app's ``task``.

    Raises:
        RollupInvalidError: ``X_JOB_ROLLUP_INVALID`` naming every bad field, or ``into``
            without the unique index (when checked at declaration).
        JobDuplicateError: ``X_JOB_DUPLICATE`` when another declaration holds ``name``.
    """
    site = declaration_site()
    keys = (key,) if isinstance(key, str) else tuple(key)
    chosen = Bucket() if bucket is None else bucket
    problems = [p for p in (_name_problem(into, "into"), connect_problem(connect)) if p]
    if not keys or not all(isinstance(k, str) and k and "\x00" not in k for k in keys):
        problems.append("key: one or more column names")
    if not isinstance(source_sql, str) or "%(bucket_start)s" not in source_sql:
        problems.append("source_sql: a SELECT using %(bucket_start)s (and %(bucket_end)s)")
    lookback_problem = duration_problem(lookback, allow_zero=True)
    if lookback_problem is not None:
        problems.append(f"lookback: {lookback_problem}")
    if not isinstance(chosen, Bucket):
        problems.append('bucket: must be a Bucket(width, tz), e.g. Bucket("1d", "Europe/Paris")')
    if tenant != "none":
        problems.append('tenant: a rollup spans tenants, tenant="none"')
    if problems:
        raise RollupInvalidError(
            f"rollup {name!r} is declared wrong: " + "; ".join(problems),
            job=name,
            problems=problems,
        )
    lookback_ms = parse_duration(lookback, field="lookback", allow_zero=True)
    checked = isinstance(connect, str) and _check_now(connect, into, keys)
    columns: list[str] = []

    async def check(conn: Any) -> None:
        cur = await conn.execute(_UNIQUE_INDEX, {"table": into, "columns": list(keys)})
        row = await cur.fetchone()
        refused = _missing_index(into, keys, None if row is None else row[0])
        if refused is not None:
            raise refused

    async def upsert(start: str, end: str) -> int:
        values = {
            "bucket_start": datetime.fromisoformat(start),
            "bucket_end": datetime.fromisoformat(end),
        }
        source = sql.SQL(source_sql)
        async with open_connection(connect) as conn:
            if not made.checked:
                await check(conn)
                made.checked = True
            if not columns:
                probe = await conn.execute(
                    sql.SQL("SELECT * FROM ({}) AS s LIMIT 0").format(source), values
                )
                columns.extend(c.name for c in probe.description or ())
                missing = sorted(set(keys) - set(columns))
                if missing:
                    raise RollupInvalidError(
                        f"source_sql of rollup {name!r} has no column {', '.join(missing)} "
                        "of its key",
                        job=name,
                    )
            names = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
            updates = [c for c in columns if c not in keys]
            action = (
                sql.SQL("DO UPDATE SET {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
                    )
                )
                if updates
                else sql.SQL("DO NOTHING")
            )
            statement = sql.SQL(
                "INSERT INTO {into} ({names}) SELECT {names} FROM ({source}) AS s "
                "ON CONFLICT ({key}) {action}"
            ).format(
                into=_name(into),
                names=names,
                source=source,
                key=sql.SQL(", ").join(sql.Identifier(k) for k in keys),
                action=action,
            )
            cur = await conn.execute(statement, values)
            if not conn.autocommit:
                await conn.commit()
            return int(cur.rowcount)

    async def run(run: RollupRun, step: Step, ctx: JobContext) -> dict[str, Any]:
        now = run.at or datetime.fromisoformat(await step.run("now", store_now))
        spans = chosen.span(now - timedelta(milliseconds=lookback_ms), now)
        rows = 0
        for start, end in spans:
            ctx.cancel.raise_if_cancelled()
            rows += await step.run(
                f"bucket:{start.isoformat()}", upsert, start.isoformat(), end.isoformat()
            )
        return {
            "buckets": len(spans),
            "rows": rows,
            "from": spans[0][0].isoformat(),
            "to": spans[-1][1].isoformat(),
        }

    made = declare_singleton(
        RollupJob,
        run,
        name=name,
        input=RollupRun,
        key=f"rollup:{name}",
        site=site,
        queue=queue,
        retry=retry,
        registry=registry,
    )
    made.into = into
    made.key = keys
    made.bucket = chosen
    made.lookback_ms = lookback_ms
    made.checked = checked
    return made
